//go:build unix

package glm5flash

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// The process tests run ranks 1.. as children of the test binary (TestParallelWorker with
// RESIN_GLM5_RANK set), meeting rank 0 (the test) in shared memory.

func joinShm(name string, rank, size int) (ctl, data dist.Communicator, err error) {
	if ctl, err = dist.JoinShm(name+"-ctl", rank, size, dist.Options{Timeout: 60 * time.Second}); err != nil {
		return nil, nil, err
	}
	if data, err = dist.JoinShm(name+"-data", rank, size, dist.Options{Timeout: 20 * time.Second}); err != nil {
		ctl.Close()
		return nil, nil, err
	}
	return ctl, data, nil
}

// TestParallelWorker is a rank of a process test when RESIN_GLM5_RANK is set (with
// RESIN_GLM5_NAME, _DIR, _TP, _EP, _DISPATCH, and _DRAFTS when the ranks draft).
func TestParallelWorker(t *testing.T) {
	rank, err := strconv.Atoi(os.Getenv("RESIN_GLM5_RANK"))
	if err != nil {
		t.Skip("a rank of the parallel process tests; runs only as their child")
	}
	num := func(k string) int { n, _ := strconv.Atoi(os.Getenv(k)); return n }
	l := Layout{TP: num("RESIN_GLM5_TP"), EP: num("RESIN_GLM5_EP"), Dispatch: Dispatch(num("RESIN_GLM5_DISPATCH"))}
	ctl, data, err := joinShm(os.Getenv("RESIN_GLM5_NAME"), rank, l.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	defer data.Close()
	r, pool, err := OpenRank(os.Getenv("RESIN_GLM5_DIR"), draftOpts(num("RESIN_GLM5_DRAFTS")), l, data)
	if err != nil {
		t.Fatal(err)
	}
	lr := r.LockstepRank(rank, pool)
	if err := lockstep.FollowRank(ctl, lr); err != nil {
		t.Fatal(err)
	}
}

// draftOpts is tinyOpts drafting drafts tokens per step (0: none).
func draftOpts(drafts int) RankOptions {
	o := tinyOpts
	if drafts > 0 {
		o.Drafts, o.CacheBytes = drafts, 16<<20
	}
	return o
}

// processGroup starts ranks 1.. of layout l as child processes and returns rank 0's
// forward and pool; the children are stopped and reaped (their exit checked) at cleanup.
func processGroup(t *testing.T, l Layout) (lockstep.Forward, *kvslab.Pool) {
	t.Helper()
	lead, pool, _ := processLeader(t, l, 0)
	return lead.Lead, pool
}

// processLeader is processGroup for ranks that draft drafts tokens per step (0: none),
// returning rank 0's lockstep.Leader (a cpurunner.Drafter when they draft) and its info.
func processLeader(t *testing.T, l Layout, drafts int) (lockstep.Leader, *kvslab.Pool, engine.RunnerInfo) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	dir := tinyDir(t)
	name := fmt.Sprintf("glm5-%d-%d-%d-%d", os.Getpid(), l.TP, l.EP, drafts)
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for rank := 1; rank < l.Size(); rank++ {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestParallelWorker$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "RESIN_GLM5_RANK="+strconv.Itoa(rank), "RESIN_GLM5_NAME="+name, "RESIN_GLM5_DIR="+dir,
			"RESIN_GLM5_TP="+strconv.Itoa(l.TP), "RESIN_GLM5_EP="+strconv.Itoa(l.EP), "RESIN_GLM5_DISPATCH="+strconv.Itoa(int(l.Dispatch)),
			"RESIN_GLM5_DRAFTS="+strconv.Itoa(drafts))
		out := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	ctl, data, err := joinShm(name, 0, l.Size())
	if err != nil {
		cancel()
		for _, c := range cmds {
			c.Wait()
		}
		t.Fatal(err)
	}
	r, pool, err := OpenRank(dir, draftOpts(drafts), l, data)
	if err != nil {
		t.Fatal(err)
	}
	lr := r.LockstepRank(0, pool)
	t.Cleanup(func() {
		defer cancel()
		if err := lockstep.Stop(ctl); err != nil {
			t.Error(err)
		}
		for i, c := range cmds {
			if err := c.Wait(); err != nil {
				t.Errorf("rank %d: %v\n%s", i+1, err, outs[i])
			}
		}
		ctl.Close()
		data.Close()
	})
	return lockstep.LeadRank(ctl, lr), pool, r.Info()
}

// TestParallelProcesses: EP=3 (an expert-less rank), EP=2 by all-to-all, TP=2 and TP=2 ×
// EP=4 (its tp and ep groups split from the shared-memory group) with the other ranks in
// child processes, the plans broadcast through shared memory, gives the in-process
// layout's logits bit for bit and one rank's greedy tokens over 64 steps; the workers
// then stop cleanly.
func TestParallelProcesses(t *testing.T) {
	fwd, pool := oneRank(t)
	_, wantToks := decode(t, fwd, pool, parSteps)
	for _, l := range []Layout{{EP: 3}, {EP: 2, Dispatch: DispatchAllToAll}, {TP: 2}, {TP: 2, EP: 4}} {
		t.Run(fmt.Sprintf("tp%d-ep%d", l.TP, l.EP), func(t *testing.T) {
			g, gpool := inProcess(t, l)
			want, _ := decode(t, g.Forward, gpool, parSteps)
			forward, ppool := processGroup(t, l)
			got, toks := decode(t, cpurunner.ForwardFunc(forward), ppool, parSteps)
			sameRunBits(t, "processes", got, want)
			sameTokens(t, "processes", toks, wantToks)
		})
	}
}
