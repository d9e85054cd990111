// Package lockstep runs the ranks of one model in lock step: rank 0, the engine's runner,
// broadcasts each step's BatchPlan (its binary encoding) on a control communicator, and
// every rank runs its own forward on it. It is the control layer of the layouts where
// every rank sees every token: tensor parallelism, and expert parallelism over replicated
// attention (models/deepseek-v4-flash, models/glm-5-flash), llama's shards
// (core/dist/tp) and prefill context parallelism (core/dist/cp), which broadcasts only the
// plans that split (Rank.Broadcast).
//
// The control communicator is apart from the data one (the collectives inside a step)
// so that it can wait as long as the engine idles while the data one keeps a short
// deadline. Rank 0 samples; the next plan carries the sampled tokens, so the other ranks
// never need the logits. When the ranks draft (an MTP head split like the model), rank 0
// also broadcasts each step's result (the accepted drafts and the sampled tokens) after
// sampling, and every rank runs its drafter on it (Rank.Draft, LeadDraft): the drafts'
// collectives meet, and each rank puts back what the rejected drafts wrote in its cache.
package lockstep

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// Forward is one rank's forward of a step: the plan's tokens through its part of the
// model, the logits of plan.LogitsIndices into logits ([rows, vocab]).
type Forward func(p *engine.BatchPlan, logits []float32) error

// Draft is one rank's end of a drafting step, after the plan's forward and rank 0's
// sampling: res holds, per sequence, the accepted tokens (res.Accepted of res.Tokens). The
// rank puts back what rejected drafts wrote and runs its draft head; rank 0's also fills
// res.NumNextDrafts and res.Drafts (the engine's), the others' go nowhere.
type Draft func(p *engine.BatchPlan, res *engine.StepResult) error

const (
	msgStop   byte = 0
	msgStep   byte = 1
	msgResult byte = 2
)

// Lead returns rank 0's forward: check (nil: none) refuses a plan before the others see
// it, then the plan is broadcast on ctl (Broadcast) and forward runs it with the others.
func Lead(ctl dist.Communicator, check, forward Forward) Forward {
	var msg []byte
	return func(p *engine.BatchPlan, logits []float32) error {
		if check != nil {
			if err := check(p, logits); err != nil {
				return err
			}
		}
		if err := Broadcast(ctl, p, &msg); err != nil {
			return err
		}
		return forward(p, logits)
	}
}

// LeadSome is Lead for the plans broadcasts accepts; the others run through forward on
// rank 0 alone, unchecked and with no message. broadcasts nil is Lead.
func LeadSome(ctl dist.Communicator, broadcasts func(*engine.BatchPlan) bool, check, forward Forward) Forward {
	lead := Lead(ctl, check, forward)
	if broadcasts == nil {
		return lead
	}
	return func(p *engine.BatchPlan, logits []float32) error {
		if !broadcasts(p) {
			return forward(p, logits)
		}
		return lead(p, logits)
	}
}

// Broadcast sends p from rank 0 of ctl to its followers (Follow, FollowPlans), encoded
// into *msg (reused between steps): the step message, then engine.BatchPlan.AppendBinary.
func Broadcast(ctl dist.Communicator, p *engine.BatchPlan, msg *[]byte) error {
	var err error
	*msg = append((*msg)[:0], msgStep)
	if *msg, err = p.AppendBinary(*msg); err != nil {
		return fmt.Errorf("lockstep: encode the plan: %w", err)
	}
	if _, err := ctl.Broadcast(*msg, 0); err != nil {
		return fmt.Errorf("lockstep: broadcast the plan: %w", err)
	}
	return nil
}

// LeadDraft returns rank 0's Draft: the step's result (plan p's step, accepted counts and
// tokens) broadcast on ctl to the followers (FollowRank), then draft runs with them.
func LeadDraft(ctl dist.Communicator, draft Draft) Draft {
	var msg []byte
	return func(p *engine.BatchPlan, res *engine.StepResult) error {
		msg = appendResult(msg[:0], p.Step, res)
		if _, err := ctl.Broadcast(msg, 0); err != nil {
			return fmt.Errorf("lockstep: broadcast the step result: %w", err)
		}
		return draft(p, res)
	}
}

// appendResult encodes the result message: msgResult, the plan's step (u64), then the
// accepted counts and the tokens, each a u32 count and int32s, little-endian.
func appendResult(b []byte, step uint64, res *engine.StepResult) []byte {
	b = append(b, msgResult)
	b = binary.LittleEndian.AppendUint64(b, step)
	for _, xs := range [2][]int32{res.Accepted, res.Tokens} {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(xs)))
		for _, x := range xs {
			b = binary.LittleEndian.AppendUint32(b, uint32(x))
		}
	}
	return b
}

// decodeResult decodes a result message (without its first byte) into res, for a plan of
// n sequences at step step.
func decodeResult(b []byte, step uint64, n int, res *engine.StepResult) error {
	if len(b) < 8 {
		return errors.New("a truncated step result")
	}
	if got := binary.LittleEndian.Uint64(b); got != step {
		return fmt.Errorf("the result of step %d after the plan of step %d", got, step)
	}
	b = b[8:]
	res.Reset(n)
	for k, dst := range [2]*[]int32{&res.Accepted, &res.Tokens} {
		if len(b) < 4 {
			return errors.New("a truncated step result")
		}
		m := int(binary.LittleEndian.Uint32(b))
		b = b[4:]
		if len(b) < 4*m {
			return errors.New("a truncated step result")
		}
		if k == 0 && m != n {
			return fmt.Errorf("a step result for %d sequences, the plan has %d", m, n)
		}
		*dst = (*dst)[:0]
		for i := range m {
			*dst = append(*dst, int32(binary.LittleEndian.Uint32(b[4*i:])))
		}
		b = b[4*m:]
	}
	if len(b) != 0 {
		return fmt.Errorf("%d bytes after the step result", len(b))
	}
	return nil
}

// Stop tells the followers of ctl to return.
func Stop(ctl dist.Communicator) error {
	_, err := ctl.Broadcast([]byte{msgStop}, 0)
	return err
}

// Follow runs a rank other than 0: each plan rank 0 broadcasts on ctl through forward
// (with logits of vocab columns per row, which it discards), until the stop message (then
// nil) or an error (a dead rank 0 or peer, a bad plan, a failed forward).
func Follow(ctl dist.Communicator, vocab int, forward Forward) error {
	return FollowPlans(ctl, discardLogits(vocab, forward))
}

// discardLogits is a follower's step: forward on each plan, its logits (vocab columns
// per row) into a buffer reused and never read.
func discardLogits(vocab int, forward Forward) func(*engine.BatchPlan) error {
	var logits []float32
	return func(p *engine.BatchPlan) error {
		n := len(p.LogitsIndices) * vocab
		if cap(logits) < n {
			logits = make([]float32, n)
		}
		return forward(p, logits[:n])
	}
}

// FollowPlans runs step on each plan rank 0 of ctl broadcasts until the stop message
// (then nil) or an error: a dead rank 0, a bad message, or step's (the follower's forward
// on its own part, whatever runs it and wherever its logits go: a GPU runner's rank).
func FollowPlans(ctl dist.Communicator, step func(*engine.BatchPlan) error) error {
	return follow(ctl, step, nil)
}

// FollowSteps is FollowPlans that also runs draft (nil: a result message is an error) on
// each step result rank 0 broadcasts after a plan (LeadDraft): a follower that answers
// each plan and each result itself (core/dist/dp's ServeRank).
func FollowSteps(ctl dist.Communicator, step func(*engine.BatchPlan) error, draft Draft) error {
	return follow(ctl, step, draft)
}

// FollowRank is Follow for r: its forward on each plan and, when r drafts (r.Draft set),
// its draft on each step result rank 0 broadcasts after a plan (LeadDraft).
func FollowRank(ctl dist.Communicator, r Rank) error {
	return follow(ctl, discardLogits(r.Vocab, r.Forward), r.Draft)
}

// follow runs step on each plan and draft (nil: a result message is an error) on each
// step result, which belongs to the plan before it.
func follow(ctl dist.Communicator, step func(*engine.BatchPlan) error, draft Draft) error {
	var p engine.BatchPlan
	var res engine.StepResult
	planned := false // p holds a plan whose result has not come yet
	for {
		msg, err := ctl.Broadcast(nil, 0)
		if err != nil {
			return fmt.Errorf("rank %d: wait for a plan: %w", ctl.Rank(), err)
		}
		if len(msg) == 0 {
			return fmt.Errorf("rank %d: an empty control message", ctl.Rank())
		}
		switch msg[0] {
		case msgStop:
			return nil
		case msgStep:
		case msgResult:
			if draft == nil || !planned {
				return fmt.Errorf("rank %d: a step result this rank cannot use (drafting: %v, after a plan: %v)", ctl.Rank(), draft != nil, planned)
			}
			planned = false
			if err := decodeResult(msg[1:], p.Step, p.NumSeqs(), &res); err != nil {
				return fmt.Errorf("rank %d: %w", ctl.Rank(), err)
			}
			if err := draft(&p, &res); err != nil {
				return fmt.Errorf("rank %d: draft of step %d: %w", ctl.Rank(), p.Step, err)
			}
			continue
		default:
			return fmt.Errorf("rank %d: control message %d", ctl.Rank(), msg[0])
		}
		if err := p.UnmarshalBinary(msg[1:]); err != nil {
			return fmt.Errorf("rank %d: decode the plan: %w", ctl.Rank(), err)
		}
		if err := step(&p); err != nil {
			return fmt.Errorf("rank %d: step %d: %w", ctl.Rank(), p.Step, err)
		}
		planned = true
	}
}

// WithCacheOps is a follower's forward over a cache pool of its own: the plan's CacheOps
// (which the engine executed on rank 0's pool) executed on pool first.
func WithCacheOps(pool *kvslab.Pool, forward Forward) Forward {
	return func(p *engine.BatchPlan, logits []float32) error {
		if err := engine.ApplyCacheOps(pool, p.CacheOps); err != nil {
			return err
		}
		return forward(p, logits)
	}
}

// Rank is one rank's part of an in-process group, as its opener returns it.
type Rank struct {
	Forward Forward // this rank's forward on its own cache
	Check   Forward // rank 0's: refuses a plan before it is broadcast (nil: none)
	Vocab   int     // columns of a logits row
	// Broadcast is rank 0's: which plans run on every rank (nil: all); the others run on
	// rank 0 alone, unchecked (LeadSome).
	Broadcast func(*engine.BatchPlan) bool
	// Draft, when the ranks draft, is this rank's draft step on each step's result
	// (FollowRank, LeadDraft); MaxDrafts is rank 0's most drafts per sequence.
	Draft     Draft
	MaxDrafts int
}

// Leader is rank 0's end of a group for core/cpurunner: Forward broadcasts each plan and
// runs rank 0's part; when the ranks draft (Max > 0) it is a cpurunner.Drafter whose Draft
// broadcasts the step's result first (LeadDraft).
type Leader struct {
	Lead      Forward
	LeadDraft Draft
	Max       int
}

// Forward runs plan p on every rank (the group's lead).
func (l Leader) Forward(p *engine.BatchPlan, logits []float32) error { return l.Lead(p, logits) }

// MaxDrafts is the most drafts per sequence a step proposes (0: the ranks do not draft).
func (l Leader) MaxDrafts() int { return l.Max }

// Draft runs the draft step of plan p on every rank.
func (l Leader) Draft(p *engine.BatchPlan, res *engine.StepResult) error {
	if l.LeadDraft == nil {
		return errors.New("lockstep: the group does not draft")
	}
	return l.LeadDraft(p, res)
}

// LeadRank is rank 0's Leader over ctl for its Rank r (Broadcast, Check, Forward, Draft).
func LeadRank(ctl dist.Communicator, r Rank) Leader {
	l := Leader{Lead: LeadSome(ctl, r.Broadcast, r.Check, r.Forward)}
	if r.Draft != nil && r.MaxDrafts > 0 {
		l.LeadDraft, l.Max = LeadDraft(ctl, r.Draft), r.MaxDrafts
	}
	return l
}

// InProcess is a group of ranks that are goroutines of this process: Forward is rank 0's
// (for the engine), the other ranks follow in their own goroutines until Close.
type InProcess struct {
	leader   Leader
	ctl      []dist.Communicator
	data     []dist.Communicator
	wg       sync.WaitGroup
	mu       sync.Mutex
	failures []error
	closed   bool
}

// StartInProcess opens size ranks with open (rank r gets its data communicator; o bounds
// its collectives) and starts ranks 1..size-1 following rank 0. Rank 0's forward is the
// group's Forward. An opener's error closes the ranks opened so far.
func StartInProcess(size int, o dist.Options, open func(rank int, data dist.Communicator) (Rank, error)) (*InProcess, error) {
	ctl, err := dist.NewInProcess(size, dist.Options{Timeout: 1 << 62}) // the engine may idle
	if err != nil {
		return nil, err
	}
	data, err := dist.NewInProcess(size, o)
	if err != nil {
		return nil, err
	}
	// The ranks open concurrently: an opener may run collectives (a sharded load that
	// checks its peers) on data.
	ranks := make([]Rank, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ranks[r], errs[r] = open(r, data[r]); errs[r] != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, errs[r])
				data[r].Close()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range append(ctl, data...) {
			c.Close()
		}
		return nil, err
	}
	g := &InProcess{ctl: ctl, data: data}
	g.leader = LeadRank(ctl[0], ranks[0])
	for r := 1; r < size; r++ {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			if err := FollowRank(ctl[r], ranks[r]); err != nil {
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

// Forward runs one step on every rank (on rank 0 alone when its Rank.Broadcast refuses
// it) and writes rank 0's logits; a failure names the ranks that failed with it.
func (g *InProcess) Forward(p *engine.BatchPlan, logits []float32) error {
	return g.failed(g.leader.Lead(p, logits))
}

// Leader is rank 0's end of the group for core/cpurunner (a Drafter when rank 0's Rank
// drafts), its errors naming the ranks that failed with it.
func (g *InProcess) Leader() Leader {
	l := Leader{Lead: g.Forward, Max: g.leader.Max}
	if g.leader.LeadDraft != nil {
		l.LeadDraft = func(p *engine.BatchPlan, res *engine.StepResult) error { return g.failed(g.leader.LeadDraft(p, res)) }
	}
	return l
}

// failed joins err with the followers' failures.
func (g *InProcess) failed(err error) error {
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
