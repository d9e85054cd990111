package dist

import (
	"sync/atomic"
	"time"
)

// Timed is a Communicator that counts, on this rank, the collectives called through it
// and the wall time spent inside them (waiting for the peers included: a rank that
// arrives first waits for the last one). Two clock reads and two atomic adds per call;
// the figures are safe to read from another goroutine while the rank runs. A group Split
// from it is not timed.
type Timed struct {
	Communicator
	ns, calls atomic.Int64
}

// NewTimed wraps c.
func NewTimed(c Communicator) *Timed { return &Timed{Communicator: c} }

// Spent returns the time spent inside the collectives so far and their number.
func (t *Timed) Spent() (time.Duration, int64) {
	return time.Duration(t.ns.Load()), t.calls.Load()
}

func (t *Timed) count(start time.Time) {
	t.ns.Add(int64(time.Since(start)))
	t.calls.Add(1)
}

func (t *Timed) AllReduce(buf []byte, dt DType) error {
	defer t.count(time.Now())
	return t.Communicator.AllReduce(buf, dt)
}

func (t *Timed) AllGatherV(send []byte) ([][]byte, error) {
	defer t.count(time.Now())
	return t.Communicator.AllGatherV(send)
}

func (t *Timed) ReduceScatterV(send []byte, counts []int, dt DType) ([]byte, error) {
	defer t.count(time.Now())
	return t.Communicator.ReduceScatterV(send, counts, dt)
}

func (t *Timed) AllToAllV(send [][]byte) ([][]byte, error) {
	defer t.count(time.Now())
	return t.Communicator.AllToAllV(send)
}

func (t *Timed) Broadcast(buf []byte, root int) ([]byte, error) {
	defer t.count(time.Now())
	return t.Communicator.Broadcast(buf, root)
}

func (t *Timed) Barrier() error {
	defer t.count(time.Now())
	return t.Communicator.Barrier()
}
