package gpurunner

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// ProcRank is one rank of a model's GPU layout whose ranks are processes of their own (a
// worker per GPU on this host, or ranks on other nodes): Group's ranks, but joined over
// a control communicator across processes (dist.JoinShm, dist.JoinTCP) instead of
// started as goroutines. Rank 0 leads the plans (Leader, for the engine's runner); the
// others Follow until rank 0 Stops them. A JoinPeerRank rank is a group's rank without
// the lock step (DP-attention's: its plans come otherwise): it neither leads nor follows,
// and Stop does nothing.
type ProcRank struct {
	name    string
	r       GroupRank
	ctl     dist.Communicator
	comm    *cudart.Comm
	dog     *Watchdog // bounds each step once comm is joined
	stopped bool
	closed  bool
	// lockstep: the ranks run rank 0's plans (JoinGroup), so rank 0 Stops the others;
	// false for JoinPeerRank's, whose plans come otherwise.
	lockstep bool
}

// JoinGroup opens rank ctl.Rank() of a GPU layout over ctl.Size() processes through open
// (its runner, device and pool; cacheBytes the pool's bytes) and joins the others: rank
// 0 opens first, creates the NCCL id and broadcasts it on ctl with its pool's geometry,
// which the others' pools take (rank 0's page ids then address them alike; their GPUs'
// free memory does not decide); every rank reports on ctl whether it opened, so a failure
// anywhere fails every rank naming the failed one; then all join the NCCL communicator
// and each rank's model takes its end (SetComm). name prefixes the errors.
func JoinGroup(name string, ctl dist.Communicator, cacheBytes int64, open func(cacheBytes int64) (GroupRank, error)) (*ProcRank, error) {
	return joinProcs(name, ctl, cacheBytes, open, true)
}

// JoinPeerRank is JoinGroup's rendezvous (rank 0's NCCL id and pool geometry on ctl, every
// rank's outcome, the NCCL join) for a rank of a group whose plans do not come from rank
// 0's engine in lock step: a DP-attention rank in a process of its own, which runs its
// own engine's plans (core/dist/dp). Its Stop does nothing and it does not Follow; its
// GroupRank needs no Forward.
func JoinPeerRank(name string, ctl dist.Communicator, cacheBytes int64, open func(cacheBytes int64) (GroupRank, error)) (*ProcRank, error) {
	return joinProcs(name, ctl, cacheBytes, open, false)
}

func joinProcs(name string, ctl dist.Communicator, cacheBytes int64, open func(cacheBytes int64) (GroupRank, error), lockstep bool) (*ProcRank, error) {
	rank, size := ctl.Rank(), ctl.Size()
	g := &ProcRank{name: name, ctl: ctl, lockstep: lockstep}
	fail := func(err error) (*ProcRank, error) {
		if g.r.Close != nil {
			g.r.Close()
		}
		return nil, fmt.Errorf("%s: rank %d of %d: %w", name, rank, size, err)
	}
	opened := func(bytes int64) error {
		r, err := open(bytes)
		g.r = r // closed on a later failure (a nil Close is skipped)
		if err == nil && (r.Pool == nil || r.Device == nil || r.Forward == nil && lockstep) {
			err = errors.New("opened without a device, a pool or a forward")
		}
		return err
	}
	var hello tpHello
	var id cudart.NCCLUniqueID
	if rank == 0 {
		err := opened(cacheBytes)
		if err == nil && size > 1 {
			id, err = cudart.NewNCCLUniqueID()
		}
		if err != nil {
			hello.Err = err.Error()
		} else {
			p := g.r.Pool
			hello = tpHello{ID: id.Internal[:], CacheBytes: int64(p.Slabs()) * p.SlabBytes(), Slabs: p.Slabs(), SlabBytes: p.SlabBytes()}
		}
		if size > 1 {
			b, _ := json.Marshal(hello)
			if _, berr := ctl.Broadcast(b, 0); berr != nil && err == nil {
				err = fmt.Errorf("hand the NCCL id to the other ranks: %w", berr)
			}
		}
		if err != nil {
			return fail(err)
		}
	} else {
		b, err := ctl.Broadcast(nil, 0)
		if err != nil {
			return fail(fmt.Errorf("wait for rank 0's NCCL id: %w", err))
		}
		if err := json.Unmarshal(b, &hello); err != nil {
			return fail(fmt.Errorf("rank 0's first message: %w", err))
		}
		if hello.Err != "" {
			return fail(fmt.Errorf("rank 0 failed: %s", hello.Err))
		}
		if len(hello.ID) != len(id.Internal) {
			return fail(fmt.Errorf("rank 0 sent a %d-byte NCCL id", len(hello.ID)))
		}
		copy(id.Internal[:], hello.ID)
		err = opened(hello.CacheBytes)
		if p := g.r.Pool; err == nil && (p.Slabs() != hello.Slabs || p.SlabBytes() != hello.SlabBytes) {
			err = fmt.Errorf("its cache (%d slabs of %d bytes) is not rank 0's (%d of %d)", p.Slabs(), p.SlabBytes(), hello.Slabs, hello.SlabBytes)
		}
		if err != nil {
			reportOpened(ctl, err) // rank 0 and the others learn of it there
			return fail(err)
		}
	}
	if size == 1 {
		return g, nil
	}
	if err := reportOpened(ctl, nil); err != nil {
		return fail(err)
	}
	err := g.r.Device.Do(func(c *cudart.Ctx) error {
		var err error
		g.comm, err = cudart.InitComm(c, id, size, rank)
		return err
	})
	if err != nil {
		return fail(fmt.Errorf("join the NCCL communicator: %w", err))
	}
	var mine error
	if g.r.SetComm != nil {
		mine = g.r.SetComm(g.comm)
	}
	// Every rank learns whether each took its end, before any step's collective.
	if err := errors.Join(mine, reportOpened(ctl, mine)); err != nil {
		g.comm.Destroy()
		return fail(fmt.Errorf("take the NCCL communicator: %w", err))
	}
	g.dog = NewWatchdog(g.comm, g.r.Watchdog, fmt.Sprintf("rank %d of %d", rank, size))
	if f := g.r.Forward; f != nil {
		g.r.Forward = func(p *engine.BatchPlan, logits []float32) error {
			return g.dog.Step(func() error { return f(p, logits) })
		}
	}
	if d := g.r.Draft; d != nil {
		g.r.Draft = func(p *engine.BatchPlan, res *engine.StepResult) error {
			return g.dog.Step(func() error { return d(p, res) })
		}
	}
	return g, nil
}

// Step runs fn, one step of the rank run otherwise than through its Forward (a
// JoinPeerRank rank's), under the rank's watchdog (Watchdog.Step).
func (g *ProcRank) Step(fn func() error) error { return g.dog.Step(fn) }

// Abort aborts the rank's NCCL communicator now (Watchdog.Abort): the step in flight, if
// any, and every later one fail with why. Rank 0 calls it when a worker process exits
// (launch.Workers), so that its step does not wait in a collective for the dead rank.
func (g *ProcRank) Abort(why error) { g.dog.Abort(why) }

// AgreeLayout has the ranks of a group of processes agree, over ctl, that each runs the
// same layout (what: its description, every rank's alike when their flags are): a rank of
// another layout would call other collectives and leave the others waiting in theirs for
// good (NCCL's waits have no deadline), so every rank fails naming the first that
// differs. Call it on every rank before JoinGroup.
func AgreeLayout(ctl dist.Communicator, what string) error {
	all, err := ctl.AllGatherV([]byte(what))
	if err != nil {
		return fmt.Errorf("agree on the layout: %w", err)
	}
	for r, m := range all {
		if string(m) != what {
			return fmt.Errorf("rank %d runs %s, rank %d %s: every rank must run the same layout", r, m, ctl.Rank(), what)
		}
	}
	return nil
}

// reportOpened all-gathers each rank's outcome of opening its runner on ctl (mine: nil,
// opened) and returns the first other rank's failure, naming it.
func reportOpened(ctl dist.Communicator, mine error) error {
	var msg []byte
	if mine != nil {
		msg = []byte(mine.Error())
	}
	all, err := ctl.AllGatherV(msg)
	if err != nil {
		return fmt.Errorf("gather the ranks' outcomes: %w", err)
	}
	for r, m := range all {
		if len(m) > 0 && r != ctl.Rank() {
			return fmt.Errorf("rank %d failed: %s", r, m)
		}
	}
	return nil
}

// Rank is this rank's GroupRank (its device, pool and lockstep part).
func (g *ProcRank) Rank() GroupRank { return g.r }

// Pool returns the rank's pool (rank 0's is the one the engine schedules with).
func (g *ProcRank) Pool() *kvslab.Pool { return g.r.Pool }

// Leader is rank 0's end of the group for core/cpurunner: each plan checked, broadcast on
// the control communicator and run with the others (a Drafter when the ranks draft). It
// is for JoinGroup's ranks: a JoinPeerRank rank has no lock-step forward to lead with.
func (g *ProcRank) Leader() lockstep.Leader { return lockstep.LeadRank(g.ctl, g.r.Rank) }

// Follow runs a rank other than 0: each plan rank 0 broadcasts, its CacheOps executed on
// this rank's pool first, until rank 0's Stop (then nil) or an error.
func (g *ProcRank) Follow() error {
	if g.ctl.Rank() == 0 {
		return fmt.Errorf("%s: rank 0 leads; it does not follow", g.name)
	}
	if !g.lockstep {
		return fmt.Errorf("%s: rank %d runs its own plans (JoinPeerRank); it does not follow rank 0's", g.name, g.ctl.Rank())
	}
	r := g.r.Rank
	r.Forward, r.Check = lockstep.WithCacheOps(g.r.Pool, r.Forward), nil
	if err := lockstep.FollowRank(g.ctl, r); err != nil {
		return fmt.Errorf("%s: %w", g.name, err)
	}
	return nil
}

// Stop tells the followers to return from Follow (rank 0; once, and a no-op elsewhere).
func (g *ProcRank) Stop() error {
	if !g.lockstep || g.ctl.Rank() != 0 || g.ctl.Size() == 1 || g.stopped {
		return nil
	}
	g.stopped = true
	return lockstep.Stop(g.ctl)
}

// Close stops the followers (rank 0), then frees the NCCL communicator and the rank's
// runner.
func (g *ProcRank) Close() error {
	if g.closed {
		return nil
	}
	g.closed = true
	errs := []error{g.Stop()}
	if g.comm != nil {
		errs = append(errs, g.r.Device.Do(func(*cudart.Ctx) error { return g.comm.Destroy() }))
	}
	if g.r.Close != nil {
		errs = append(errs, g.r.Close())
	}
	return errors.Join(errs...)
}
