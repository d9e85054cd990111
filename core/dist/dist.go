package dist

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unsafe"
)

// DType is the element type of a reduction.
type DType uint8

// The reducible element types.
const (
	F32  DType = iota // IEEE float32
	BF16              // bfloat16, summed in float32 and rounded to nearest even once
)

// Size returns the bytes of one element.
func (t DType) Size() int {
	if t == BF16 {
		return 2
	}
	return 4
}

func (t DType) String() string {
	switch t {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(t))
}

// Communicator is one rank's view of a group of ranks. Every rank of the group must call
// the same collectives in the same order; each call returns when all ranks have taken
// part, or with an error once Options.Timeout has passed without them. After an error
// the ranks may be at different rounds: close the communicator and form a new group.
// Not safe for concurrent use by one rank.
type Communicator interface {
	Rank() int
	Size() int
	// AllReduce sums buf (elements of t) across the ranks, in place, in rank order.
	AllReduce(buf []byte, t DType) error
	// AllGatherV returns every rank's send, indexed by rank; lengths may differ.
	AllGatherV(send []byte) ([][]byte, error)
	// ReduceScatterV sums send (the same length on every rank, elements of t) and returns
	// this rank's part: counts[r] elements for rank r, laid out in rank order.
	ReduceScatterV(send []byte, counts []int, t DType) ([]byte, error)
	// AllToAllV sends send[r] to rank r and returns what each rank sent to this one.
	AllToAllV(send [][]byte) ([][]byte, error)
	// Broadcast returns root's buf on every rank (the others' buf is ignored).
	Broadcast(buf []byte, root int) ([]byte, error)
	// Barrier returns when every rank has reached it.
	Barrier() error
	// Split divides the group: ranks passing the same color form a new group, ranked by
	// key (then by rank here). A negative color joins no group and gets nil.
	Split(color, key int) (Communicator, error)
	// Close releases this rank's resources; its peers' pending waits fail.
	Close() error
}

// Options tunes a communicator.
type Options struct {
	// Timeout bounds every wait: joining, and each collective. Zero means 30 s.
	Timeout time.Duration
	// JoinTimeout bounds joining alone (JoinShm's rendezvous); zero means Timeout. A
	// control group that may idle for long sets a long Timeout and a short JoinTimeout.
	JoinTimeout time.Duration
	// Cancel, when closed, ends a JoinShm still waiting for its peers (a launcher closes
	// it when a worker it started exits before joining).
	Cancel <-chan struct{}
	// Group names the group at a TCP rendezvous address that several groups use one
	// after another (JoinTCP): a rank dialing the wrong group's rank 0 is turned away and
	// dials again.
	Group string
	// SlotBytes is the shared-memory slot of each rank (JoinShm); a longer message goes in
	// several rounds. Zero means 1 MiB.
	SlotBytes int
	// StepTimeout bounds, in a request/reply control group whose worker idles between
	// requests without a deadline (core/dist/dp's JoinShm), the requester's wait for the
	// answer to one request: one step's forward in the worker. Zero means 5 minutes (vLLM's
	// VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS). Timeout stays the bound of each collective.
	StepTimeout time.Duration
}

// StepTimeoutOr is o.StepTimeout, or 5 minutes when it is not set.
func (o Options) StepTimeoutOr() time.Duration {
	if o.StepTimeout <= 0 {
		return 5 * time.Minute
	}
	return o.StepTimeout
}

func (o Options) timeout() time.Duration {
	if o.Timeout <= 0 {
		return 30 * time.Second
	}
	return o.Timeout
}

func (o Options) joinTimeout() time.Duration {
	if o.JoinTimeout > 0 {
		return o.JoinTimeout
	}
	return o.timeout()
}

func (o Options) canceled() bool {
	select {
	case <-o.Cancel:
		return true
	default:
		return false
	}
}

// ErrCanceled is wrapped by a join that Options.Cancel ended.
var ErrCanceled = errors.New("canceled")

// ErrTimeout is wrapped by the errors of waits that ran past their deadline.
var ErrTimeout = errors.New("deadline exceeded")

// ErrPeerGone is wrapped when a peer closed its communicator or its process exited.
var ErrPeerGone = errors.New("peer gone")

// PeerError reports a collective that failed because of rank Peer.
type PeerError struct {
	Op   string // the collective, e.g. "all-reduce"
	Peer int    // the rank that did not take part
	Err  error  // ErrTimeout or ErrPeerGone, with detail
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("dist: %s: rank %d: %v", e.Op, e.Peer, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// F32Bytes views x as bytes (no copy), for AllReduce and friends.
func F32Bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
}

// BF16Bytes views x (bfloat16 bit patterns) as bytes (no copy).
func BF16Bytes(x []uint16) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 2*len(x))
}

// AllReduceF32 sums x across c's ranks in place.
func AllReduceF32(c Communicator, x []float32) error { return c.AllReduce(F32Bytes(x), F32) }

// transport is what an implementation provides: exchange, in which every rank posts one
// message and receives every rank's, and sub, which builds the transport of a subgroup.
// The generic group turns it into the collectives.
type transport interface {
	rank() int
	size() int
	// exchange posts send and returns every rank's message for this round, indexed by
	// rank; op names the collective in errors. The messages are read-only (other ranks
	// may share them) and stay valid after the next exchange.
	exchange(op string, send []byte) ([][]byte, error)
	// sub joins the subgroup tag whose members are the parent ranks members (in new-rank
	// order); self is this rank's index in members.
	sub(tag string, members []int, self int) (transport, error)
	close() error
}

// group implements Communicator over a transport.
type group struct {
	tr     transport
	splits int
	tag    string
}

var _ Communicator = (*group)(nil)

func (g *group) Rank() int { return g.tr.rank() }
func (g *group) Size() int { return g.tr.size() }

func (g *group) AllReduce(buf []byte, t DType) error {
	if err := checkElems("all-reduce", len(buf), t); err != nil {
		return err
	}
	msgs, err := g.tr.exchange("all-reduce", buf)
	if err != nil {
		return err
	}
	if err := sameLen("all-reduce", msgs); err != nil {
		return err
	}
	reduceInto(buf, msgs, 0, len(buf)/t.Size(), t)
	return nil
}

func (g *group) AllGatherV(send []byte) ([][]byte, error) {
	msgs, err := g.tr.exchange("all-gather", send)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(msgs))
	for r, m := range msgs {
		out[r] = slices.Clone(m)
	}
	return out, nil
}

func (g *group) ReduceScatterV(send []byte, counts []int, t DType) ([]byte, error) {
	n := g.Size()
	if len(counts) != n {
		return nil, fmt.Errorf("dist: reduce-scatter: %d counts for %d ranks", len(counts), n)
	}
	total := 0
	for r, c := range counts {
		if c < 0 {
			return nil, fmt.Errorf("dist: reduce-scatter: count %d for rank %d", c, r)
		}
		total += c
	}
	if err := checkElems("reduce-scatter", len(send), t); err != nil {
		return nil, err
	}
	if len(send) != total*t.Size() {
		return nil, fmt.Errorf("dist: reduce-scatter: send holds %d bytes, counts sum to %d %s elements", len(send), total, t)
	}
	msgs, err := g.tr.exchange("reduce-scatter", send)
	if err != nil {
		return nil, err
	}
	if err := sameLen("reduce-scatter", msgs); err != nil {
		return nil, err
	}
	off := 0
	for _, c := range counts[:g.Rank()] {
		off += c
	}
	out := make([]byte, counts[g.Rank()]*t.Size())
	reduceInto(out, msgs, off, counts[g.Rank()], t)
	return out, nil
}

func (g *group) AllToAllV(send [][]byte) ([][]byte, error) {
	n := g.Size()
	if len(send) != n {
		return nil, fmt.Errorf("dist: all-to-all: %d messages for %d ranks", len(send), n)
	}
	// One message: n lengths, then the parts back to back.
	msg := make([]byte, 8*n, 8*n+lenAll(send))
	for r, p := range send {
		binary.LittleEndian.PutUint64(msg[8*r:], uint64(len(p)))
		msg = append(msg, p...)
	}
	msgs, err := g.tr.exchange("all-to-all", msg)
	if err != nil {
		return nil, err
	}
	me := g.Rank()
	out := make([][]byte, n)
	for q, m := range msgs {
		if len(m) < 8*n {
			return nil, fmt.Errorf("dist: all-to-all: rank %d sent a %d-byte message", q, len(m))
		}
		off := 8 * n
		for r := range me {
			off += int(binary.LittleEndian.Uint64(m[8*r:]))
		}
		l := int(binary.LittleEndian.Uint64(m[8*me:]))
		if off+l > len(m) {
			return nil, fmt.Errorf("dist: all-to-all: rank %d's message is shorter than its lengths", q)
		}
		out[q] = slices.Clone(m[off : off+l])
	}
	return out, nil
}

func (g *group) Broadcast(buf []byte, root int) ([]byte, error) {
	if root < 0 || root >= g.Size() {
		return nil, fmt.Errorf("dist: broadcast: root %d outside [0, %d)", root, g.Size())
	}
	if g.Rank() != root {
		buf = nil
	}
	msgs, err := g.tr.exchange("broadcast", buf)
	if err != nil {
		return nil, err
	}
	return slices.Clone(msgs[root]), nil
}

func (g *group) Barrier() error {
	_, err := g.tr.exchange("barrier", nil)
	return err
}

func (g *group) Split(color, key int) (Communicator, error) {
	msgs, err := g.tr.exchange("split", splitMessage(color, key))
	if err != nil {
		return nil, err
	}
	g.splits++
	var members []int
	self := -1
	if color >= 0 {
		if members, self, err = splitMembers(msgs, color, g.Rank()); err != nil {
			return nil, err
		}
	}
	tag := fmt.Sprintf("%s.s%d.c%d", g.tag, g.splits, color)
	if sp, ok := g.tr.(splitPreparer); ok {
		// Every rank takes part in the exchange of the new leaders' contact details, a
		// rank joining no group and a leader that failed to prepare too.
		info, perr := sp.prepare(self == 0)
		all, err := g.tr.exchange("split", info)
		if err != nil {
			return nil, err
		}
		if perr != nil {
			return nil, fmt.Errorf("dist: split color %d: %w", color, perr)
		}
		if color < 0 {
			return nil, nil
		}
		tr, err := sp.subWith(members, self, all[members[0]])
		if err != nil {
			return nil, fmt.Errorf("dist: split color %d: %w", color, err)
		}
		return &group{tr: tr, tag: tag}, nil
	}
	if color < 0 {
		return nil, nil
	}
	tr, err := g.tr.sub(tag, members, self)
	if err != nil {
		return nil, fmt.Errorf("dist: split color %d: %w", color, err)
	}
	return &group{tr: tr, tag: tag}, nil
}

// splitPreparer is a transport whose subgroups need their leader's contact details
// (TCP: the address it listens on): prepare runs on every rank of a Split (leader says
// whether it becomes a new group's rank 0), its results are all-gathered over the parent,
// and subWith gets the message of the new group's leader.
type splitPreparer interface {
	prepare(leader bool) ([]byte, error)
	subWith(members []int, self int, leaderInfo []byte) (transport, error)
}

// splitMembers reads the (color, key) pairs of every rank and returns the ranks of color
// ordered by key, then rank, and where me falls among them.
func splitMembers(msgs [][]byte, color, me int) ([]int, int, error) {
	type member struct{ rank, key int }
	var ms []member
	for r, m := range msgs {
		if len(m) != 16 {
			return nil, 0, fmt.Errorf("dist: split: rank %d sent %d bytes", r, len(m))
		}
		if int(int64(binary.LittleEndian.Uint64(m))) == color {
			ms = append(ms, member{r, int(int64(binary.LittleEndian.Uint64(m[8:])))})
		}
	}
	slices.SortStableFunc(ms, func(a, b member) int {
		if a.key != b.key {
			return a.key - b.key
		}
		return a.rank - b.rank
	})
	members := make([]int, len(ms))
	self := -1
	for i, m := range ms {
		members[i] = m.rank
		if m.rank == me {
			self = i
		}
	}
	return members, self, nil
}

func splitMessage(color, key int) []byte {
	var msg [16]byte
	binary.LittleEndian.PutUint64(msg[:], uint64(int64(color)))
	binary.LittleEndian.PutUint64(msg[8:], uint64(int64(key)))
	return msg[:]
}

func (g *group) Close() error { return g.tr.close() }

func checkElems(op string, n int, t DType) error {
	if t != F32 && t != BF16 {
		return fmt.Errorf("dist: %s: unknown element type %s", op, t)
	}
	if n%t.Size() != 0 {
		return fmt.Errorf("dist: %s: %d bytes is not a whole number of %s elements", op, n, t)
	}
	return nil
}

func sameLen(op string, msgs [][]byte) error {
	for r, m := range msgs {
		if len(m) != len(msgs[0]) {
			return fmt.Errorf("dist: %s: rank %d sent %d bytes, rank 0 %d", op, r, len(m), len(msgs[0]))
		}
	}
	return nil
}

func lenAll(ps [][]byte) int {
	n := 0
	for _, p := range ps {
		n += len(p)
	}
	return n
}

// reduceInto writes into out the sum over msgs of count elements starting at element off,
// in rank order, in float32: out = ((m0 + m1) + m2) + …, each bf16 sum rounded once.
func reduceInto(out []byte, msgs [][]byte, off, count int, t DType) {
	if t == F32 {
		o := f32View(out, count)
		ins := make([][]float32, len(msgs))
		ok := o != nil
		for r, m := range msgs {
			if ins[r] = f32View(m[4*off:], count); ins[r] == nil {
				ok = false
			}
		}
		if ok {
			copy(o, ins[0])
			for _, m := range ins[1:] {
				for i, v := range m {
					o[i] += v
				}
			}
			return
		}
	}
	le := binary.LittleEndian
	for i := range count {
		var acc float32
		for r, m := range msgs {
			var v float32
			if t == F32 {
				v = math.Float32frombits(le.Uint32(m[4*(off+i):]))
			} else {
				v = math.Float32frombits(uint32(le.Uint16(m[2*(off+i):])) << 16)
			}
			if r == 0 {
				acc = v
			} else {
				acc += v
			}
		}
		if t == F32 {
			le.PutUint32(out[4*i:], math.Float32bits(acc))
		} else {
			le.PutUint16(out[2*i:], toBF16(acc))
		}
	}
}

// f32View is the first n float32 of b without a copy, or nil when b is not 4-byte
// aligned (then the caller takes the byte-wise path). The host is little-endian (amd64,
// arm64), as the byte-wise path assumes too.
func f32View(b []byte, n int) []float32 {
	if n == 0 || len(b) < 4*n || uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

// toBF16 rounds f to the nearest bfloat16, ties to even; NaN stays NaN.
func toBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}
