// Package dp is DP-attention's control: one engine and one kvslab pool per dp rank, each
// rank attending its own requests, and the ranks stepping together so that the layers
// that mix their tokens (expert parallelism: core/dist/ep) always meet.
//
// Each step goes as SGLang's DP-attention does: the ranks exchange their token counts
// (an all-gather on the data communicator, which has a short deadline); every rank then
// runs its forward, a rank whose engine has no plan ready an idle plan (no sequences, no
// tokens), with the plan's DP field (engine.DPStep) saying every rank's count and, when
// the step runs captured graphs, the row count every rank pads to. When no rank has work
// the group pauses: rank 0 keeps the clock, broadcasting a tick on the control
// communicator (which waits as long as the engines idle) only while some rank has a plan
// pending, so the ranks pause and wake together.
//
// Ranks that draft (an MTP head whose MoE layer is expert-parallel over the dp group too)
// also step their drafts together: after each step's sampling, a busy rank's engine hands
// its result to the rank's stepper (Group.Runner's Draft), which runs the rank's Draft,
// while an idle rank runs its Draft on its idle plan with an empty result, so that the
// draft head's exchanges meet as the forward's do.
//
// Limits: the ranks' engines live in one process (a Group's ranks are goroutines; the
// communicators may be any dist implementation, NCCL included), since rank 0 learns
// that a rank has work through this process's memory. A rank's forward may run in a
// worker process (RemoteForward, ServeForward: one process per dp rank on a host, its
// engine still here); engines in other processes (a scheduler per process, woken by a
// message of its own, requests routed to it) are not built.
package dp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
)

// Forward is a rank's forward of one step: the plan's tokens through the rank's model,
// the logits of plan.LogitsIndices into logits ([rows, vocab]). Under a Group, the plan
// has DP set and may be an idle one (no tokens, no logits rows); the forward must still
// take part in every collective that mixes the ranks' tokens.
type Forward func(p *engine.BatchPlan, logits []float32) error

// Draft is a dp rank's draft step on the result of the step it ran (Rank.Draft): it puts
// back what rejected drafts wrote and fills res.NumNextDrafts and res.Drafts.
type Draft func(p *engine.BatchPlan, res *engine.StepResult) error

// ErrClosed is returned by a rank's Forward after Close.
var ErrClosed = errors.New("dp: group closed")

const (
	msgStop byte = 0
	msgTick byte = 1
)

// Options tunes a Group.
type Options struct {
	// GraphBuckets lists, ascending, the token counts for which the ranks' forwards run
	// captured graphs. A step in which every rank decodes or idles and the largest count
	// fits a bucket pads every rank to the smallest such bucket (DPStep.Pad); other steps
	// run eager, unpadded. Empty: never pad.
	GraphBuckets []int
}

// Rank is one dp rank of a Group.
type Rank struct {
	// Forward runs the rank's steps, its engine's plans and idle plans.
	Forward Forward
	// CacheGroups is how many cache groups the rank's plans have (the runner's
	// RunnerInfo.CacheGroups), which an idle plan has too.
	CacheGroups int
	// Ctl and Data are the rank's control and data communicators over the dp group (the
	// same rank in both). Ctl waits as long as the engines idle; Data's deadline bounds
	// the count exchange.
	Ctl, Data dist.Communicator
	// Draft, when the ranks draft (every rank's set, or none), is the rank's draft step
	// after each step: on its engine's plan with the sampled result, or on its idle plan
	// with an empty result, taking part in every collective the draft head mixes the
	// ranks' rows in. MaxDrafts is the most drafts per sequence it proposes.
	Draft     func(p *engine.BatchPlan, res *engine.StepResult) error
	MaxDrafts int
}

// draftJob is a step's result an engine hands its rank's stepper to draft on.
type draftJob struct {
	res  *engine.StepResult
	done chan error
}

// job is a step an engine hands its rank's stepper.
type job struct {
	plan   *engine.BatchPlan
	logits []float32
	done   chan error
}

// Group runs the dp ranks of one process in lock step. Rank r's engine runs through the
// forward Forward(r) returns; Start runs the ranks' steppers.
type Group struct {
	ranks   []Rank
	buckets []int

	mu      sync.Mutex
	cond    *sync.Cond
	jobs    []*job
	drafts  []*draftJob // handed over by Runner(r).Draft, taken by rank r's stepper
	pending int
	closing bool
	closed  bool // Close has closed the communicators
	err     error
	done    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

// NewGroup checks the ranks (rank r's communicators are rank r of size len(ranks)).
func NewGroup(ranks []Rank, o Options) (*Group, error) {
	if len(ranks) == 0 {
		return nil, errors.New("dp: no ranks")
	}
	for r, rk := range ranks {
		if rk.Forward == nil || rk.Ctl == nil || rk.Data == nil {
			return nil, fmt.Errorf("dp: rank %d lacks its forward or a communicator", r)
		}
		for _, c := range []dist.Communicator{rk.Ctl, rk.Data} {
			if c.Rank() != r || c.Size() != len(ranks) {
				return nil, fmt.Errorf("dp: rank %d has a communicator of rank %d of %d", r, c.Rank(), c.Size())
			}
		}
		if rk.CacheGroups < 0 {
			return nil, fmt.Errorf("dp: rank %d has %d cache groups", r, rk.CacheGroups)
		}
		if (rk.Draft != nil) != (ranks[0].Draft != nil) {
			return nil, fmt.Errorf("dp: rank %d drafts (%v) and rank 0 does (%v): all ranks or none", r, rk.Draft != nil, ranks[0].Draft != nil)
		}
	}
	for i, b := range o.GraphBuckets {
		if b <= 0 || i > 0 && b <= o.GraphBuckets[i-1] {
			return nil, fmt.Errorf("dp: graph buckets %v must be positive and ascending", o.GraphBuckets)
		}
	}
	g := &Group{ranks: ranks, buckets: o.GraphBuckets, jobs: make([]*job, len(ranks)), drafts: make([]*draftJob, len(ranks)), done: make(chan struct{})}
	g.cond = sync.NewCond(&g.mu)
	return g, nil
}

// Size returns the number of dp ranks.
func (g *Group) Size() int { return len(g.ranks) }

// Start runs every rank's stepper in its own goroutine.
func (g *Group) Start() {
	for r := range g.ranks {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			if err := g.step(r); err != nil {
				g.fail(err)
				// Its own communicators (a rank's are never used by two goroutines at
				// once): the peers waiting on this rank learn at once that it is gone.
				g.ranks[r].Ctl.Close()
				g.ranks[r].Data.Close()
			}
		}()
	}
}

// GraphBuckets returns the token counts all-decode steps are padded to (Options'; nil:
// none).
func (g *Group) GraphBuckets() []int { return slices.Clone(g.buckets) }

// Forward returns rank r's forward for its engine's runner (cpurunner.ForwardFunc): it
// hands the plan to the rank's stepper, which runs it in the group's next step, and
// returns when the step has run.
func (g *Group) Forward(r int) Forward {
	return func(p *engine.BatchPlan, logits []float32) error {
		j := &job{plan: p, logits: logits, done: make(chan error, 1)}
		return g.handOver(r, "step", j.done, func() bool {
			if g.jobs[r] != nil {
				return false
			}
			g.jobs[r] = j
			g.pending++
			return true
		})
	}
}

// handOver gives rank r's stepper a job and waits until it has run (done): under g.mu,
// put stores the job in the rank's slot, false when a job of its kind (what) is already
// pending there; a failed or closing group takes none.
func (g *Group) handOver(r int, what string, done <-chan error, put func() bool) error {
	g.mu.Lock()
	switch {
	case g.err != nil:
		g.mu.Unlock()
		return g.err
	case g.closing:
		g.mu.Unlock()
		return ErrClosed
	case !put():
		g.mu.Unlock()
		return fmt.Errorf("dp: rank %d: a second %s handed over while one is pending", r, what)
	}
	g.cond.Broadcast()
	g.mu.Unlock()
	return <-done
}

// RankRunner is rank r's end of the group for core/cpurunner: Forward is Group.Forward(r)
// and, when the rank drafts, it is a cpurunner.Drafter whose Draft hands the step's
// result to the rank's stepper and returns when the rank has drafted.
type RankRunner struct {
	g *Group
	r int
}

// Runner returns rank r's RankRunner (cpurunner.New(info, g.Runner(r))).
func (g *Group) Runner(r int) RankRunner { return RankRunner{g, r} }

// Forward runs plan p in the group's next step (Group.Forward).
func (rr RankRunner) Forward(p *engine.BatchPlan, logits []float32) error {
	return rr.g.Forward(rr.r)(p, logits)
}

// MaxDrafts is the most drafts per sequence the rank proposes (0: it does not draft).
func (rr RankRunner) MaxDrafts() int {
	if rr.g.ranks[rr.r].Draft == nil {
		return 0
	}
	return rr.g.ranks[rr.r].MaxDrafts
}

// Draft hands the result of the step just run to the rank's stepper, which drafts with
// the other ranks.
func (rr RankRunner) Draft(_ *engine.BatchPlan, res *engine.StepResult) error {
	g, r := rr.g, rr.r
	if g.ranks[r].Draft == nil {
		return fmt.Errorf("dp: rank %d does not draft", r)
	}
	j := &draftJob{res: res, done: make(chan error, 1)}
	return g.handOver(r, "draft", j.done, func() bool {
		if g.drafts[r] != nil {
			return false
		}
		g.drafts[r] = j
		return true
	})
}

// awaitDraft waits for rank r's engine to hand over the result of the step its stepper
// just ran; nil when the group closes (or fails: err) first.
func (g *Group) awaitDraft(r int) (*draftJob, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.drafts[r] == nil && !g.closing && g.err == nil {
		g.cond.Wait()
	}
	j := g.drafts[r]
	g.drafts[r] = nil
	if j == nil {
		return nil, g.err
	}
	return j, nil
}

// Done is closed when the group has failed (Err says why) or closed.
func (g *Group) Done() <-chan struct{} { return g.done }

// Err returns the error that broke the group, nil while it runs or after a clean Close.
func (g *Group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Close stops the steppers (rank 0 broadcasts the stop) and waits for them; steps still
// pending fail with ErrClosed. It returns the error that broke the group, if one did,
// and the same when called again.
func (g *Group) Close() error {
	g.mu.Lock()
	g.closing = true
	g.cond.Broadcast()
	g.mu.Unlock()
	g.wg.Wait()
	g.mu.Lock()
	g.failJobs(ErrClosed)
	err, again := g.err, g.closed
	g.closed = true
	g.mu.Unlock()
	if !again {
		for _, rk := range g.ranks {
			rk.Ctl.Close()
			rk.Data.Close()
		}
	}
	g.once.Do(func() { close(g.done) })
	return err
}

// fail breaks the group: the first error stays, every pending step fails with it, and
// rank 0's clock stops waiting.
func (g *Group) fail(err error) {
	g.mu.Lock()
	if g.err == nil {
		g.err = err
	}
	g.failJobs(g.err)
	g.cond.Broadcast()
	g.mu.Unlock()
	g.once.Do(func() { close(g.done) })
}

// failJobs fails every pending step with err (g.mu held).
func (g *Group) failJobs(err error) {
	for r, j := range g.jobs {
		if j != nil {
			j.done <- err
			g.jobs[r] = nil
			g.pending--
		}
	}
	for r, j := range g.drafts {
		if j != nil {
			j.done <- err
			g.drafts[r] = nil
		}
	}
}

// step is rank r's stepper: per step, the clock (rank 0 ticks while some rank has work,
// the others wait for the tick), the count exchange, then the rank's forward of its
// engine's plan or an idle plan. It returns nil on the stop message.
func (g *Group) step(r int) error {
	rk := g.ranks[r]
	n := len(g.ranks)
	idle := engine.BatchPlan{QueryStart: []int32{0}, LogitsStart: []int32{0}, Groups: make([]engine.GroupPlan, rk.CacheGroups)}
	for i := range idle.Groups {
		idle.Groups[i].PageTableStart = []int32{0}
	}
	counts := make([]int32, n)
	var none engine.StepResult // an idle rank's result, for its draft
	var msg [5]byte
	var steps uint64
	for {
		if err := g.clock(r); err != nil {
			if errors.Is(err, errStop) {
				return nil
			}
			return err
		}
		g.mu.Lock()
		j := g.jobs[r]
		if j != nil {
			g.jobs[r] = nil
			g.pending--
		}
		g.mu.Unlock()
		tokens, decode := 0, true
		if j != nil {
			tokens, decode = j.plan.NumTokens(), j.plan.IsDecode()
		}
		binary.LittleEndian.PutUint32(msg[:], uint32(tokens))
		msg[4] = 0
		if decode {
			msg[4] = 1
		}
		all, err := rk.Data.AllGatherV(msg[:])
		if err != nil {
			err = fmt.Errorf("dp rank %d: exchange the token counts: %w", r, err)
			if j != nil {
				j.done <- err
			}
			return err
		}
		most, allDecode := 0, true
		for q, m := range all {
			if len(m) != len(msg) {
				err := fmt.Errorf("dp rank %d: rank %d sent a %d-byte count", r, q, len(m))
				if j != nil {
					j.done <- err
				}
				return err
			}
			counts[q] = int32(binary.LittleEndian.Uint32(m))
			most = max(most, int(counts[q]))
			allDecode = allDecode && m[4] == 1
		}
		if most == 0 && j == nil {
			continue // nobody had work after all: back to the clock
		}
		steps++
		var p engine.BatchPlan
		var logits []float32
		if j != nil {
			p, logits = *j.plan, j.logits // a copy: the scheduler's plan stays as it built it
		} else {
			p = idle
			p.Step = steps
		}
		p.DP = engine.DPStep{Rank: int32(r), Tokens: counts, Pad: int32(g.pad(most, allDecode))}
		err = rk.Forward(&p, logits)
		if err != nil {
			err = fmt.Errorf("dp rank %d: step %d: %w", r, steps, err)
		}
		if j != nil {
			j.done <- err
		}
		if err != nil {
			return err
		}
		if rk.Draft == nil {
			continue
		}
		// The draft step: the engine's result once it has sampled (an idle rank's is
		// empty), every rank drafting together.
		res := &none
		var dj *draftJob
		if j != nil {
			if dj, err = g.awaitDraft(r); dj == nil {
				return err // closed (nil) or broken
			}
			res = dj.res
		} else {
			none.Reset(0)
		}
		if err = rk.Draft(&p, res); err != nil {
			err = fmt.Errorf("dp rank %d: draft of step %d: %w", r, steps, err)
		}
		if dj != nil {
			dj.done <- err
		}
		if err != nil {
			return err
		}
	}
}

var errStop = errors.New("stop")

// clock is one tick: rank 0 waits until some rank has a step pending (or the group
// closes) and broadcasts a tick or the stop; the others receive it.
func (g *Group) clock(r int) error {
	ctl := g.ranks[r].Ctl
	if r != 0 {
		m, err := ctl.Broadcast(nil, 0)
		if err != nil {
			return fmt.Errorf("dp rank %d: wait for the clock: %w", r, err)
		}
		if len(m) != 1 || m[0] != msgTick && m[0] != msgStop {
			return fmt.Errorf("dp rank %d: clock message %v", r, m)
		}
		if m[0] == msgStop {
			return errStop
		}
		return nil
	}
	g.mu.Lock()
	for g.pending == 0 && !g.closing && g.err == nil {
		g.cond.Wait()
	}
	stop, broken := g.closing && g.pending == 0, g.err
	g.mu.Unlock()
	if broken != nil {
		return broken
	}
	m := msgTick
	if stop {
		m = msgStop
	}
	if _, err := ctl.Broadcast([]byte{m}, 0); err != nil {
		return fmt.Errorf("dp rank 0: broadcast the clock: %w", err)
	}
	if stop {
		return errStop
	}
	return nil
}

// pad is the row count every rank pads to: the smallest graph bucket holding most when
// every rank decodes or idles, else 0 (eager).
func (g *Group) pad(most int, allDecode bool) int {
	if !allDecode {
		return 0
	}
	for _, b := range g.buckets {
		if b >= most {
			return b
		}
	}
	return 0
}
