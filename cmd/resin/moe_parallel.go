package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	deepseekv4flash "github.com/resin-llm/resin/models/deepseek-v4-flash"
	glm5flash "github.com/resin-llm/resin/models/glm-5-flash"
)

// The MoE models' parallel layouts (--tp, --ep) on the CPU reference forward: every rank
// runs every plan (core/dist/lockstep), as goroutines of this process or, with
// --tp-procs, as worker processes of this binary meeting rank 0 in shared memory.

// moeParallelModels are the models whose packages run parallel layouts themselves.
var moeParallelModels = map[string]bool{deepseekv4flash.Name: true, glm5flash.Name: true}

// dispatchOf maps --ep-dispatch to the models' Dispatch values (the same in both).
func dispatchOf(s string) (int, error) {
	switch s {
	case "", "gather":
		return 0, nil
	case "all-to-all":
		return 1, nil
	}
	return 0, fmt.Errorf("--ep-dispatch %q: want gather or all-to-all", s)
}

// checkDispatch refuses an --ep-dispatch that would be ignored or misspelled: the
// exchange is read only when --ep is 2 or more, so a typo there went unnoticed.
func checkDispatch(s string, epn int) error {
	if _, err := dispatchOf(s); err != nil {
		return err
	}
	if s != "" && s != "gather" && epn < 2 {
		return fmt.Errorf("--ep-dispatch %s needs --ep 2 or more, or --dp 2 or more with --dp-attention (the experts' exchange)", s)
	}
	return nil
}

// openMoERank opens rank comm.Rank() of model name's layout (tp, ep, dispatch) from dir
// with a pool of cacheBytes, drafting drafts tokens per step from the split MTP head (0:
// none), as a lockstep rank; rank 0 also gets the engine's info.
func openMoERank(name, dir string, tp, ep, dispatch, drafts int, cacheBytes int64, comm dist.Communicator) (lockstep.Rank, engine.RunnerInfo, *kvslab.Pool, error) {
	switch name {
	case deepseekv4flash.Name:
		l := deepseekv4flash.Layout{TP: tp, EP: ep, Dispatch: deepseekv4flash.Dispatch(dispatch)}
		r, pool, err := deepseekv4flash.OpenRank(dir, deepseekv4flash.Options{Drafts: drafts}, l, comm, cacheBytes)
		if err != nil {
			return lockstep.Rank{}, engine.RunnerInfo{}, nil, err
		}
		return r.LockstepRank(comm.Rank(), pool), r.Info(), pool, nil
	case glm5flash.Name:
		l := glm5flash.Layout{TP: tp, EP: ep, Dispatch: glm5flash.Dispatch(dispatch)}
		r, pool, err := glm5flash.OpenRank(dir, glm5flash.RankOptions{CacheBytes: cacheBytes, Drafts: drafts}, l, comm)
		if err != nil {
			return lockstep.Rank{}, engine.RunnerInfo{}, nil, err
		}
		return r.LockstepRank(comm.Rank(), pool), r.Info(), pool, nil
	}
	return lockstep.Rank{}, engine.RunnerInfo{}, nil, fmt.Errorf("model %s has no parallel layouts", name)
}

// checkMoELayout refuses the layout (tp, ep, dispatch) for model name's config in dir
// once, before any rank starts: each rank refused it, after --tp-procs had started every
// worker process (999 for --ep 1000), and the message came once per rank.
func checkMoELayout(name, dir string, tp, ep, dispatch int) error {
	switch name {
	case deepseekv4flash.Name:
		c, err := deepseekv4flash.LoadConfig(dir)
		if err != nil {
			return err
		}
		return deepseekv4flash.Layout{TP: tp, EP: ep, Dispatch: deepseekv4flash.Dispatch(dispatch)}.Check(c)
	case glm5flash.Name:
		c, err := glm5flash.LoadTextConfig(dir)
		if err != nil {
			return err
		}
		return glm5flash.Layout{TP: tp, EP: ep, Dispatch: glm5flash.Dispatch(dispatch)}.Check(c)
	}
	return fmt.Errorf("model %s has no parallel layouts", name)
}

// openMoEParallel opens model name from dir over f's layout: in-process ranks, or worker
// processes with --tp-procs, every rank drafting drafts tokens per step (0: none). The
// returned runner's StopRanks ends the other ranks.
func openMoEParallel(name, dir string, cacheBytes int64, drafts int, f *tpFlags) (engine.Runner, *kvslab.Pool, error) {
	size := f.ranks()
	what := layoutSpelling(f.size, f.ep, 1)
	dispatch, err := dispatchOf(f.dispatch)
	if err != nil {
		return nil, nil, err
	}
	if err := checkMoELayout(name, dir, f.size, f.ep, dispatch); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	if f.initAddr != "" {
		return openMoENodes(name, dir, cacheBytes, drafts, f, dispatch)
	}
	if !f.procs {
		var info engine.RunnerInfo
		var pool *kvslab.Pool
		g, err := lockstep.StartInProcess(size, dist.Options{Timeout: time.Minute}, func(rank int, data dist.Communicator) (lockstep.Rank, error) {
			r, in, p, err := openMoERank(name, dir, f.size, f.ep, dispatch, drafts, cacheBytes, data)
			if rank == 0 {
				info, pool = in, p
			}
			return r, err
		})
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", what, err)
		}
		return &tpRunner{cpurunner.New(info, g.Leader()), g.Close, nil}, pool, nil
	}
	spec := tpWorkerSpec{Name: fmt.Sprintf("resin%d", os.Getpid()), Size: size, Dir: dir,
		Model: name, TP: f.size, EP: f.ep, Dispatch: dispatch, Drafts: drafts, CacheBytes: cacheBytes}
	g, err := startWorkers(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	r, info, pool, err := openMoERank(name, dir, f.size, f.ep, dispatch, drafts, cacheBytes, g.data)
	if err == nil {
		// Every rank has read dir (which the caller may remove once this returns).
		err = g.data.Barrier()
	}
	if err != nil {
		g.kill()
		g.ctl.Close()
		g.data.Close()
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	// A dead worker's rank, pid and signal go on the error of the step (or draft) it failed.
	lead := lockstep.LeadRank(g.ctl, r)
	lead.Lead = g.forward(lead.Lead)
	if lead.LeadDraft != nil {
		draft := lead.LeadDraft
		lead.LeadDraft = func(p *engine.BatchPlan, res *engine.StepResult) error { return g.w.StepError(draft(p, res)) }
	}
	return &tpRunner{cpurunner.New(info, lead), g.close, g.w}, pool, nil
}

// runMoEWorker is a --tp-procs worker of a MoE model's layout: it opens its rank and
// follows rank 0 until it stops.
func runMoEWorker(spec tpWorkerSpec) error {
	ctl, data, err := joinTP(spec, nil)
	if err != nil {
		return err
	}
	defer ctl.Close()
	defer data.Close()
	r, _, _, err := openMoERank(spec.Model, spec.Dir, spec.TP, spec.EP, spec.Dispatch, spec.Drafts, spec.CacheBytes, data)
	if err != nil {
		return fmt.Errorf("rank %d: %w", spec.Rank, err)
	}
	if err := data.Barrier(); err != nil { // rank 0 waits for every rank to have loaded
		return fmt.Errorf("rank %d: %w", spec.Rank, err)
	}
	return lockstep.FollowRank(ctl, r)
}

// openMoENodes joins the multi-node group at f.initAddr over TCP, this node's ranks
// (tpFlags.nodeRanks; the first here, the others on goroutines, as openTPNodes does for
// llama): node 0 returns the engine's runner; the others run their ranks until node 0
// stops them and then end the command (errWorkerDone).
func openMoENodes(name, dir string, cacheBytes int64, drafts int, f *tpFlags, dispatch int) (engine.Runner, *kvslab.Pool, error) {
	size := f.ranks()
	type rank struct {
		r         lockstep.Rank
		info      engine.RunnerInfo
		pool      *kvslab.Pool
		ctl, data dist.Communicator
	}
	open := func(n int) (*rank, error) {
		ctl, err := dist.JoinTCP(f.initAddr, n, size, dist.Options{Timeout: 100 * 365 * 24 * time.Hour, JoinTimeout: f.joinTimeout(), Group: "tp-ctl"})
		if err != nil {
			return nil, err
		}
		data, err := dist.JoinTCP(f.initAddr, n, size, dist.Options{Timeout: time.Minute, JoinTimeout: f.joinTimeout(), Group: "tp-data"})
		if err != nil {
			ctl.Close()
			return nil, err
		}
		r, info, pool, err := openMoERank(name, dir, f.size, f.ep, dispatch, drafts, cacheBytes, data)
		if err == nil {
			err = data.Barrier() // every rank has read dir (a --random-weights copy is removed after)
		}
		if err != nil {
			ctl.Close()
			data.Close()
			return nil, err
		}
		return &rank{r, info, pool, ctl, data}, nil
	}
	follow := func(n int) error {
		k, err := open(n)
		if err != nil {
			return err
		}
		defer k.ctl.Close()
		defer k.data.Close()
		return lockstep.FollowRank(k.ctl, k.r)
	}
	first, n := f.nodeRanks()
	wait := withLocalRanks(first, n, follow)
	if first != 0 {
		if err := follow(first); err != nil {
			return nil, nil, fmt.Errorf("worker node %d: rank %d: %w", f.nodeRank, first, err)
		}
		if err := wait(); err != nil {
			return nil, nil, fmt.Errorf("worker node %d: %w", f.nodeRank, err)
		}
		return nil, nil, errWorkerDone
	}
	k, err := open(0)
	if err != nil {
		return nil, nil, fmt.Errorf("node 0: %w", err)
	}
	stop := func() error {
		err := lockstep.Stop(k.ctl)
		k.ctl.Close()
		k.data.Close()
		return errors.Join(err, wait())
	}
	return &tpRunner{cpurunner.New(k.info, lockstep.LeadRank(k.ctl, k.r)), stop, nil}, k.pool, nil
}
