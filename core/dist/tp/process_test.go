//go:build unix

package tp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/tp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/models/llama"
)

// The process tests run rank 1 as a child of the test binary (TestTPWorker with
// RESIN_TP_NAME set), meeting rank 0 (the test) in shared memory.

// join joins the control and data groups of name as rank of 2.
func join(name string, rank int) (ctl, data dist.Communicator, err error) {
	if ctl, err = dist.JoinShm(name+"-ctl", rank, 2, dist.Options{Timeout: 60 * time.Second}); err != nil {
		return nil, nil, err
	}
	if data, err = dist.JoinShm(name+"-data", rank, 2, dist.Options{Timeout: 20 * time.Second}); err != nil {
		ctl.Close()
		return nil, nil, err
	}
	return ctl, data, nil
}

func shard(t testing.TB, rank int) *tp.Shard {
	m := tiny(t)
	rope, err := m.Config.RopeTable(256)
	if err != nil {
		t.Fatal(err)
	}
	d, w := fromLlama(m, rope)
	s, err := tp.NewShard(d, w, rank, 2)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTPWorker is rank 1 of a process test when RESIN_TP_NAME is set; with
// RESIN_TP_DIE=n it kills itself (SIGKILL) on receiving its n-th plan.
func TestTPWorker(t *testing.T) {
	name := os.Getenv("RESIN_TP_NAME")
	if name == "" {
		t.Skip("rank 1 of the TP process tests; runs only as their child")
	}
	ctl, data, err := join(name, 1)
	if err != nil {
		t.Fatal(err)
	}
	s := shard(t, 1)
	if n, _ := strconv.Atoi(os.Getenv("RESIN_TP_DIE")); n > 0 {
		ctl = &dieAfter{Communicator: ctl, n: n}
	}
	if err := tp.Follow(ctl, data, s, s.NewCache(64, 4)); err != nil {
		t.Fatal(err)
	}
}

// dieAfter kills the process on its n-th broadcast: a worker dying mid-step.
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

func spawnWorker(t *testing.T, ctx context.Context, name string, env ...string) (*exec.Cmd, *bytes.Buffer) {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestTPWorker$", "-test.count=1", "-test.v")
	cmd.Env = append(append(os.Environ(), "RESIN_TP_NAME="+name), env...)
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// TestTPProcesses: TP=2 with rank 1 in another process, the plans broadcast through shared
// memory, gives the in-process TP=2 run's logits bit for bit and its tokens over the
// prompt and 64 greedy steps; the worker then stops cleanly.
func TestTPProcesses(t *testing.T) {
	_, want, _, wantToks := decode(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := fmt.Sprintf("tp%d", os.Getpid())
	cmd, out := spawnWorker(t, ctx, name)
	ctl, data, err := join(name, 0)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("%v\n%s", err, out)
	}
	defer ctl.Close()
	defer data.Close()
	s := shard(t, 0)
	forward := tp.Lead(ctl, data, s, s.NewCache(64, 4))
	got, toks := run(t, forward, 64)
	if err := tp.Stop(ctl); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("worker: %v\n%s", err, out)
	}
	for i := range wantToks {
		if toks[i] != wantToks[i] {
			t.Fatalf("step %d: token %d across processes, %d in process", i, toks[i], wantToks[i])
		}
		for j := range want[i] {
			if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
				t.Fatalf("step %d logit %d: %g across processes, %g in process", i, j, got[i][j], want[i][j])
			}
		}
	}
}

// TestTPWorkerKilled: rank 1 killed (SIGKILL) on its third plan fails rank 0's step with
// an error naming rank 1, long before the deadline, and leaves no process behind.
func TestTPWorkerKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := fmt.Sprintf("tpkill%d", os.Getpid())
	cmd, out := spawnWorker(t, ctx, name, "RESIN_TP_DIE=3")
	ctl, data, err := join(name, 0)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("%v\n%s", err, out)
	}
	defer ctl.Close()
	defer data.Close()
	s := shard(t, 0)
	forward := tp.Lead(ctl, data, s, s.NewCache(64, 4))
	m := tiny(t)
	pool, err := engine.NewHostPool(llama.CacheGroups(m.Config, 4), 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	seq := runnertest.OpenSeq(t, pool, runnertest.Prompt(10, m.Config.VocabSize, 3))
	n := len(seq.Tokens)
	var stepErr error
	for step := 0; step < 10 && stepErr == nil; step++ {
		plan := runnertest.Plan(t, pool, []*runnertest.Seq{seq}, []int{n}, false)
		logits := make([]float32, m.Config.VocabSize)
		stepErr = forward(plan, logits)
		seq.Tokens = append(seq.Tokens, argmax(logits))
		n = 1
	}
	var pe *dist.PeerError
	if !errors.As(stepErr, &pe) || pe.Peer != 1 || !errors.Is(stepErr, dist.ErrPeerGone) {
		t.Fatalf("%v, want rank 1 gone", stepErr)
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("the killed worker exited cleanly")
	}
}

// run feeds the 10-token prompt and steps greedy steps through forward (rank 0's),
// choosing each token from its logits.
func run(t *testing.T, forward func(*engine.BatchPlan, []float32) error, steps int) ([][]float32, []int32) {
	m := tiny(t)
	pool, err := engine.NewHostPool(llama.CacheGroups(m.Config, 4), 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	seq := runnertest.OpenSeq(t, pool, runnertest.Prompt(10, m.Config.VocabSize, 3))
	n := len(seq.Tokens)
	var all [][]float32
	var toks []int32
	for range steps + 1 {
		plan := runnertest.Plan(t, pool, []*runnertest.Seq{seq}, []int{n}, false)
		logits := make([]float32, m.Config.VocabSize)
		if err := forward(plan, logits); err != nil {
			t.Fatal(err)
		}
		all, toks = append(all, logits), append(toks, argmax(logits))
		seq.Tokens = append(seq.Tokens, toks[len(toks)-1])
		n = 1
	}
	return all, toks
}
