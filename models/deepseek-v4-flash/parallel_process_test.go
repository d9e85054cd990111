//go:build unix

package deepseekv4flash

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// The process tests run ranks 1.. as children of the test binary (TestParallelWorker with
// RESIN_DSV4_RANK set), meeting rank 0 (the test) in shared memory.

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

// TestParallelWorker is a rank of a process test when RESIN_DSV4_RANK is set (with
// RESIN_DSV4_NAME, _DIR, _TP, _EP, _DISPATCH, and _DRAFTS when the ranks draft).
func TestParallelWorker(t *testing.T) {
	rank, err := strconv.Atoi(os.Getenv("RESIN_DSV4_RANK"))
	if err != nil {
		t.Skip("a rank of the parallel process tests; runs only as their child")
	}
	num := func(k string) int { n, _ := strconv.Atoi(os.Getenv(k)); return n }
	l := Layout{TP: num("RESIN_DSV4_TP"), EP: num("RESIN_DSV4_EP"), Dispatch: Dispatch(num("RESIN_DSV4_DISPATCH"))}
	ctl, data, err := joinShm(os.Getenv("RESIN_DSV4_NAME"), rank, l.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	defer data.Close()
	opts := tinyOpts
	opts.Drafts = num("RESIN_DSV4_DRAFTS")
	r, pool, err := OpenRank(os.Getenv("RESIN_DSV4_DIR"), opts, l, data, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	lr := r.LockstepRank(rank, pool)
	if n, _ := strconv.Atoi(os.Getenv("RESIN_DSV4_DIE")); n > 0 {
		ctl = &dieAfter{Communicator: ctl, n: n}
	}
	if err := lockstep.FollowRank(ctl, lr); err != nil {
		t.Fatal(err)
	}
}

// dieAfter kills the process (SIGKILL) on its n-th broadcast: a rank dying mid-step.
type dieAfter struct {
	dist.Communicator
	n int
}

func (d *dieAfter) Broadcast(buf []byte, root int) ([]byte, error) {
	b, err := d.Communicator.Broadcast(buf, root)
	if d.n--; d.n == 0 {
		p, _ := os.FindProcess(os.Getpid())
		p.Kill()
		time.Sleep(time.Minute)
	}
	return b, err
}

// processGroup starts ranks 1.. of layout l as child processes and returns rank 0's
// forward and pool; the children are stopped and reaped (their exit checked) at cleanup.
func processGroup(t testing.TB, l Layout, env ...string) (lockstep.Forward, *kvslab.Pool) {
	forward, pool, _ := processRunner(t, l, env...)
	return forward, pool
}

// groups numbers the process groups of this test binary (their shared-memory names).
var groups atomic.Int64

// processRunner is processGroup that also returns rank 0's runner (for the engine). With
// RESIN_DSV4_DRAFTS=N in env every rank drafts N tokens per step; with RESIN_DSV4_DIE a
// child is meant to die, and its exit is not checked.
func processRunner(t testing.TB, l Layout, env ...string) (lockstep.Forward, *kvslab.Pool, engine.Runner) {
	t.Helper()
	opts, faulty := tinyOpts, false
	for _, e := range env {
		if n, ok := strings.CutPrefix(e, "RESIN_DSV4_DRAFTS="); ok {
			opts.Drafts, _ = strconv.Atoi(n)
		}
		faulty = faulty || strings.HasPrefix(e, "RESIN_DSV4_DIE=")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	dir := tinyDir(t)
	name := fmt.Sprintf("dsv4-%d-%d", os.Getpid(), groups.Add(1))
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for rank := 1; rank < l.Size(); rank++ {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestParallelWorker$", "-test.count=1", "-test.v")
		cmd.Env = append(append(os.Environ(), env...), "RESIN_DSV4_RANK="+strconv.Itoa(rank), "RESIN_DSV4_NAME="+name, "RESIN_DSV4_DIR="+dir,
			"RESIN_DSV4_TP="+strconv.Itoa(l.TP), "RESIN_DSV4_EP="+strconv.Itoa(l.EP), "RESIN_DSV4_DISPATCH="+strconv.Itoa(int(l.Dispatch)))
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
	r, pool, err := OpenRank(dir, opts, l, data, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	lr := r.LockstepRank(0, pool)
	t.Cleanup(func() {
		defer cancel()
		if err := lockstep.Stop(ctl); err != nil && !faulty {
			t.Error(err)
		}
		for i, c := range cmds {
			if err := c.Wait(); err != nil && !faulty {
				t.Errorf("rank %d: %v\n%s", i+1, err, outs[i])
			}
		}
		ctl.Close()
		data.Close()
	})
	lead := lockstep.LeadRank(ctl, lr)
	return lead.Lead, pool, cpurunner.New(r.Info(), lead)
}

// TestParallelProcesses: EP=3 (an expert-less rank) and TP=2 with the other ranks in
// child processes, the plans broadcast through shared memory, give the in-process
// layout's logits bit for bit and one rank's greedy tokens over 64 steps; the workers
// then stop cleanly.
func TestParallelProcesses(t *testing.T) {
	fwd, pool := oneRank(t)
	_, wantToks := decode(t, fwd, pool, parSteps)
	for _, l := range []Layout{{EP: 3}, {TP: 2}} {
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

// TestParallelRankKilled: EP=2 with rank 1 SIGKILLed on its third plan fails rank 0's step
// with an error naming rank 1 as gone (ErrPeerGone, not the collectives' deadline), and
// the worker is reaped.
func TestParallelRankKilled(t *testing.T) {
	forward, pool := processGroup(t, Layout{EP: 2}, "RESIN_DSV4_DIE=3")
	v := tinyConfig(t).VocabSize
	seq := runnertest.OpenSeq(t, pool, runnertest.Prompt(10, v, 3))
	n := len(seq.Tokens)
	var stepErr error
	for step := 0; step < 10 && stepErr == nil; step++ {
		plan := runnertest.Plan(t, pool, []*runnertest.Seq{seq}, []int{n}, false)
		logits := make([]float32, v)
		stepErr = forward(plan, logits)
		seq.Tokens = append(seq.Tokens, argmaxID(logits))
		n = 1
	}
	var pe *dist.PeerError
	if !errors.As(stepErr, &pe) || pe.Peer != 1 || !errors.Is(stepErr, dist.ErrPeerGone) {
		t.Fatalf("%v, want rank 1 gone", stepErr)
	}
}

// TestParallelConformanceProcesses runs core/runnertest's suite on rank 0's runner of
// TP=2 with rank 1 a child process (each runner the suite opens a fresh group).
func TestParallelConformanceProcesses(t *testing.T) {
	runnertest.Run(t, func(t testing.TB) (engine.Runner, *kvslab.Pool) {
		_, pool, r := processRunner(t, Layout{TP: 2})
		return r, pool
	}, runnertest.Options{})
}
