package tp

import (
	"errors"
	"fmt"
	"sync"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
)

// The one control message: rank 0 broadcasts each step's BatchPlan (its binary encoding,
// engine.BatchPlan.MarshalBinary) on the control communicator, and the other ranks run
// their shard on it; a stop message ends them. The control communicator is apart from the
// data one so that it can wait longer (an idle engine sends nothing) while the
// collectives inside a step keep a short deadline.
const (
	msgStop byte = 0
	msgStep byte = 1
)

// Lead returns rank 0's forward, for the engine's runner (cpurunner.ForwardFunc): it
// broadcasts the plan on ctl, then runs s on data with the others.
func Lead(ctl, data dist.Communicator, s *Shard, kv []ref.PagedKV) func(*engine.BatchPlan, []float32) error {
	var msg []byte
	return func(p *engine.BatchPlan, logits []float32) error {
		if err := s.check(p, logits); err != nil {
			return err // refused here, before the others see the plan
		}
		if err := BroadcastPlan(ctl, p, &msg); err != nil {
			return err
		}
		return s.Forward(data, p, kv, logits)
	}
}

// BroadcastPlan sends p from rank 0 of ctl to its followers (FollowPlans), encoded into
// *msg (reused between steps).
func BroadcastPlan(ctl dist.Communicator, p *engine.BatchPlan, msg *[]byte) error {
	var err error
	*msg = append((*msg)[:0], msgStep)
	if *msg, err = p.AppendBinary(*msg); err != nil {
		return fmt.Errorf("tp: encode the plan: %w", err)
	}
	if _, err := ctl.Broadcast(*msg, 0); err != nil {
		return fmt.Errorf("tp: broadcast the plan: %w", err)
	}
	return nil
}

// Stop tells the followers of ctl to return.
func Stop(ctl dist.Communicator) error {
	_, err := ctl.Broadcast([]byte{msgStop}, 0)
	return err
}

// Follow runs a rank other than 0: each plan rank 0 broadcasts on ctl through s, on data,
// until the stop message (then nil) or an error (a dead rank 0 or peer, a bad plan).
func Follow(ctl, data dist.Communicator, s *Shard, kv []ref.PagedKV) error {
	var logits []float32
	return FollowPlans(ctl, func(p *engine.BatchPlan) error {
		n := len(p.LogitsIndices) * s.D.Vocab
		if cap(logits) < n {
			logits = make([]float32, n)
		}
		return s.Forward(data, p, kv, logits[:n])
	})
}

// FollowPlans runs step on each plan rank 0 of ctl broadcasts (BroadcastPlan) until the
// stop message (then nil) or an error: a dead rank 0, a bad message, or step's (the
// follower's forward on its own shard, whatever runs it: this package's Shard, a GPU
// runner's rank).
func FollowPlans(ctl dist.Communicator, step func(*engine.BatchPlan) error) error {
	var p engine.BatchPlan
	for {
		msg, err := ctl.Broadcast(nil, 0)
		if err != nil {
			return fmt.Errorf("tp rank %d: wait for a plan: %w", ctl.Rank(), err)
		}
		if len(msg) == 0 {
			return fmt.Errorf("tp rank %d: an empty control message", ctl.Rank())
		}
		switch msg[0] {
		case msgStop:
			return nil
		case msgStep:
		default:
			return fmt.Errorf("tp rank %d: control message %d", ctl.Rank(), msg[0])
		}
		if err := p.UnmarshalBinary(msg[1:]); err != nil {
			return fmt.Errorf("tp rank %d: decode the plan: %w", ctl.Rank(), err)
		}
		if err := step(&p); err != nil {
			return fmt.Errorf("tp rank %d: step %d: %w", ctl.Rank(), p.Step, err)
		}
	}
}

// CachePages returns how many pages of the model's full cache (every KV head) pool can
// hold at most: the capacity to give each shard's NewCache.
func CachePages(d Dense, pool *kvslab.Pool) int {
	full := int64(pool.BlockTokens()) * int64(2*d.KVHeads*d.HeadDim*4*d.Layers)
	return int(pool.Arena().Size() / full)
}

// InProcess is a tensor-parallel group of goroutines: Forward is rank 0's (for the
// engine), the other ranks follow in their own goroutines until Close.
type InProcess struct {
	forward  func(*engine.BatchPlan, []float32) error
	ctl      []dist.Communicator
	data     []dist.Communicator
	wg       sync.WaitGroup
	mu       sync.Mutex
	failures []error
	closed   bool
}

// StartInProcess shards w over size ranks, each with a cache of pages pages of
// pageTokens tokens, and starts the followers.
func StartInProcess(d Dense, w *Weights, size, pages, pageTokens int, o dist.Options) (*InProcess, error) {
	shards := make([]*Shard, size)
	for r := range size {
		var err error
		if shards[r], err = NewShard(d, w, r, size); err != nil {
			return nil, err
		}
	}
	return StartShards(shards, pages, pageTokens, o)
}

// StartShards is StartInProcess on shards already made (shards[r] rank r's, as LoadShard
// reads them).
func StartShards(shards []*Shard, pages, pageTokens int, o dist.Options) (*InProcess, error) {
	size := len(shards)
	for r, s := range shards {
		if s.Rank != r || s.Size != size {
			return nil, fmt.Errorf("tp: shard %d of %d given as rank %d of %d", s.Rank, s.Size, r, size)
		}
	}
	ctl, err := dist.NewInProcess(size, dist.Options{Timeout: 1 << 62}) // the engine may idle
	if err != nil {
		return nil, err
	}
	data, err := dist.NewInProcess(size, o)
	if err != nil {
		return nil, err
	}
	g := &InProcess{ctl: ctl, data: data}
	g.forward = Lead(ctl[0], data[0], shards[0], shards[0].NewCache(pages, pageTokens))
	for r := 1; r < size; r++ {
		kv := shards[r].NewCache(pages, pageTokens)
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			if err := Follow(ctl[r], data[r], shards[r], kv); err != nil {
				g.mu.Lock()
				g.failures = append(g.failures, err)
				g.mu.Unlock()
				ctl[r].Close()
				data[r].Close()
			}
		}()
	}
	return g, nil
}

// Forward runs one step on every rank and writes rank 0's logits.
func (g *InProcess) Forward(p *engine.BatchPlan, logits []float32) error {
	err := g.forward(p, logits)
	if err != nil {
		g.mu.Lock()
		err = errors.Join(append([]error{err}, g.failures...)...)
		g.mu.Unlock()
	}
	return err
}

// Close stops the followers and waits for them.
func (g *InProcess) Close() error {
	if g.closed {
		return nil
	}
	g.closed = true
	err := Stop(g.ctl[0])
	g.wg.Wait()
	for _, c := range append(g.ctl, g.data...) {
		c.Close()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return errors.Join(append([]error{err}, g.failures...)...)
}
