package gpurunner

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// GroupRank is one rank of a Group as its opener returns it: its lockstep part (Forward
// on its own device and pool; rank 0's Check; Draft and MaxDrafts when the ranks draft,
// every rank running the drafts so that their caches stay alike), the device it runs on,
// its cache pool, how its model takes its end of the NCCL communicator, and how it is
// closed.
type GroupRank struct {
	lockstep.Rank
	Device *cudart.Device
	Pool   *kvslab.Pool
	// SetComm hands the rank's model its end of the NCCL communicator once every rank
	// has joined it; its error (buffers it could not allocate) fails the group's start
	// on every rank.
	SetComm func(*cudart.Comm) error
	Close   func() error
	// Watchdog is Options.Watchdog: the rank's steps run under a Watchdog.
	Watchdog time.Duration
}

// Group is a model's GPU runner split over in-process ranks, one device each (or several
// on one device where the driver allows it), that run every plan in lock step
// (core/dist/lockstep): rank 0 checks each plan and broadcasts it, the followers execute
// its CacheOps on their own pools (lockstep.WithCacheOps) and run it, and the ranks'
// partial sums meet in NCCL collectives their models issue on their step's streams
// (captured in decode graphs alike on every rank). It is model-agnostic: glm-5-flash's
// and deepseek-v4-flash's GPU layouts (their NewGPULayout) are built on it.
type Group struct {
	name   string
	ranks  []GroupRank
	group  *lockstep.InProcess
	comms  []*cudart.Comm
	dogs   []*Watchdog // each rank's, once comms is joined
	closed bool
}

// StartGroup opens size ranks with open (concurrently; rank r gets the in-process data
// communicator lockstep hands it, for models whose CPU part wants one), checks that every
// pool has rank 0's geometry (rank 0's page ids address them alike), joins the NCCL
// communicator (size > 1) and hands each rank its end. name prefixes the errors. On an
// error every rank opened is closed.
func StartGroup(name string, size int, open func(rank int, data dist.Communicator) (GroupRank, error)) (*Group, error) {
	if size < 1 {
		return nil, fmt.Errorf("%s: a parallel layout over no GPU", name)
	}
	g := &Group{name: name, ranks: make([]GroupRank, size), dogs: make([]*Watchdog, size)}
	ok := false
	defer func() {
		if !ok {
			g.Close()
		}
	}()
	group, err := lockstep.StartInProcess(size, dist.Options{}, func(rank int, data dist.Communicator) (lockstep.Rank, error) {
		r, err := open(rank, data)
		g.ranks[rank] = r // closed with the group on an error (a nil Close is skipped)
		if err != nil {
			return lockstep.Rank{}, err
		}
		if r.Pool == nil || r.Device == nil || r.Forward == nil {
			return lockstep.Rank{}, fmt.Errorf("%s: rank %d opened without a device, a pool or a forward", name, rank)
		}
		lr := r.Rank
		if rank > 0 {
			lr.Forward, lr.Check = lockstep.WithCacheOps(r.Pool, r.Forward), nil
		}
		// Each step under the rank's watchdog, once the communicator is joined (a nil
		// one only runs it); no plan comes before StartGroup returns.
		if f := lr.Forward; f != nil {
			lr.Forward = func(p *engine.BatchPlan, logits []float32) error {
				return g.dogs[rank].Step(func() error { return f(p, logits) })
			}
		}
		if d := lr.Draft; d != nil {
			lr.Draft = func(p *engine.BatchPlan, res *engine.StepResult) error {
				return g.dogs[rank].Step(func() error { return d(p, res) })
			}
		}
		return lr, nil
	})
	if err != nil {
		return nil, err
	}
	g.group = group
	p0 := g.ranks[0].Pool
	for r, rr := range g.ranks[1:] {
		if p := rr.Pool; p.Slabs() != p0.Slabs() || p.SlabBytes() != p0.SlabBytes() {
			return nil, fmt.Errorf("%s: rank %d's cache (%d slabs of %d bytes) is not rank 0's (%d of %d)", name, r+1, p.Slabs(), p.SlabBytes(), p0.Slabs(), p0.SlabBytes())
		}
	}
	if size > 1 {
		if err := g.join(); err != nil {
			return nil, err
		}
	}
	ok = true
	return g, nil
}

// join makes the ranks' NCCL communicator (JoinComms) and gives each rank its end.
func (g *Group) join() error {
	devs := make([]*cudart.Device, len(g.ranks))
	for r, rr := range g.ranks {
		devs[r] = rr.Device
	}
	comms, err := JoinComms(g.name, devs)
	if err != nil {
		return err
	}
	g.comms = comms
	var errs []error
	for r, rr := range g.ranks {
		if rr.SetComm != nil {
			if err := rr.SetComm(g.comms[r]); err != nil {
				errs = append(errs, fmt.Errorf("%s: rank %d: %w", g.name, r, err))
			}
		}
		g.dogs[r] = NewWatchdog(comms[r], rr.Watchdog, fmt.Sprintf("rank %d of %d", r, len(g.ranks)))
	}
	return errors.Join(errs...)
}

// JoinComms makes an NCCL communicator of len(devs) in-process ranks, rank r on devs[r],
// each joining from its device thread at once; name prefixes the error. Destroy each end
// on its device (DestroyComms) when done.
func JoinComms(name string, devs []*cudart.Device) ([]*cudart.Comm, error) {
	id, err := cudart.NewNCCLUniqueID()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	size := len(devs)
	comms := make([]*cudart.Comm, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r, d := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = d.Do(func(c *cudart.Ctx) error {
				var err error
				comms[r], err = cudart.InitComm(c, id, size, r)
				return err
			})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		DestroyComms(devs, comms)
		return nil, fmt.Errorf("%s: join the NCCL communicator: %w", name, err)
	}
	return comms, nil
}

// DestroyComms destroys each communicator of comms (those not nil) on its device.
func DestroyComms(devs []*cudart.Device, comms []*cudart.Comm) error {
	var errs []error
	for r, comm := range comms {
		if comm != nil {
			errs = append(errs, devs[r].Do(func(*cudart.Ctx) error { return comm.Destroy() }))
		}
	}
	return errors.Join(errs...)
}

// SetWatchdog sets the ranks' watchdog timeout (Options.Watchdog; the default until it is
// called); call it before the group's first step.
func (g *Group) SetWatchdog(timeout time.Duration) {
	for r, d := range g.dogs {
		if d != nil {
			g.dogs[r] = NewWatchdog(d.comm, timeout, d.name)
		}
	}
}

// Leader is rank 0's end of the group for core/cpurunner (a Drafter when the ranks draft).
func (g *Group) Leader() lockstep.Leader { return g.group.Leader() }

// Forward runs one plan on every rank and writes rank 0's logits (lockstep.InProcess's).
func (g *Group) Forward(p *engine.BatchPlan, logits []float32) error {
	return g.group.Forward(p, logits)
}

// Pool returns rank 0's pool, the one the engine schedules with.
func (g *Group) Pool() *kvslab.Pool { return g.ranks[0].Pool }

// StopRanks stops the followers (core/cli calls it when the engine stops).
func (g *Group) StopRanks() error {
	if g.group == nil {
		return nil
	}
	return g.group.Close()
}

// Close stops the followers, then frees the communicator and closes every rank.
func (g *Group) Close() error {
	if g.closed {
		return nil
	}
	g.closed = true
	errs := []error{g.StopRanks()}
	if g.comms != nil {
		devs := make([]*cudart.Device, len(g.ranks))
		for r, rr := range g.ranks {
			devs[r] = rr.Device
		}
		errs = append(errs, DestroyComms(devs, g.comms))
	}
	for _, rr := range g.ranks {
		if rr.Close != nil {
			errs = append(errs, rr.Close())
		}
	}
	return errors.Join(errs...)
}
