package dp_test

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// TestRemoteForward: a plan sent by RemoteForward reaches ServeForward's forward intact
// (DP step and all), its logits rows come back, a forward's error comes back as the step's
// error naming the rank (a PeerError within it rebuilt, naming the peer the worker saw
// gone), the worker serves on until stopped, and a worker gone fails the next step with a *dist.PeerError
// naming the dp rank (not the pair's rank 1).
func TestRemoteForward(t *testing.T) {
	const vocab, rank = 3, 2
	pair, err := dist.NewInProcess(2, dist.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		served <- dp.ServeForward(pair[1], vocab, func(p *engine.BatchPlan, logits []float32) error {
			switch p.Step {
			case 3:
				return errors.New("boom")
			case 4: // the worker saw dp rank 0 gone in an expert exchange
				return fmt.Errorf("layer 1: %w", &dist.PeerError{Op: "all-to-all", Peer: 0, Err: fmt.Errorf("%w: its process exited", dist.ErrPeerGone)})
			}
			if p.DP.Rank != rank || !slices.Equal(p.DP.Tokens, []int32{1, 0, 2}) {
				return errors.New("the DP step did not arrive")
			}
			for i := range logits {
				logits[i] = float32(p.Step)*10 + float32(i)
			}
			return nil
		})
	}()
	forward := dp.RemoteForward(pair[0], rank)
	// A one-sequence plan of two tokens, a logits row for the last (lockstep's tests' plan).
	plan := func(step uint64) *engine.BatchPlan {
		return &engine.BatchPlan{Step: step, QueryStart: []int32{0, 2}, LogitsStart: []int32{0, 1}, ReqIDs: []uint64{1},
			Computed: []int32{0}, Scheduled: []int32{2}, PromptLen: []int32{2}, NumDrafts: []int32{0},
			Temperature: []float32{0}, TopP: []float32{0}, TopK: []int32{0}, MinP: []float32{0}, Seed: []uint64{0}, Logprobs: []int32{-1},
			Tokens: []int32{5, 6}, Positions: []int32{0, 1}, LogitsIndices: []int32{1},
			DP: engine.DPStep{Rank: rank, Tokens: []int32{1, 0, 2}}}
	}
	for step := uint64(1); step <= 2; step++ {
		logits := make([]float32, vocab)
		if err := forward(plan(step), logits); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if want := []float32{float32(step) * 10, float32(step)*10 + 1, float32(step)*10 + 2}; !slices.Equal(logits, want) {
			t.Fatalf("step %d: logits %v, want %v", step, logits, want)
		}
	}
	err = forward(plan(3), make([]float32, vocab))
	if err == nil || !strings.Contains(err.Error(), "dp rank 2's worker: boom") {
		t.Fatalf("step 3: %v, want the worker's error naming dp rank 2", err)
	}
	err = forward(plan(4), make([]float32, vocab))
	var pe *dist.PeerError
	if !errors.As(err, &pe) || pe.Peer != 0 || pe.Op != "all-to-all" || !errors.Is(err, dist.ErrPeerGone) || !strings.Contains(err.Error(), "dp rank 2's worker: layer 1: dist: all-to-all: rank 0: peer gone: its process exited") {
		t.Fatalf("step 4: %v, want the worker's PeerError naming rank 0", err)
	}
	// The failed steps did not end the worker (its replies must be read first): it ends
	// on the stop, with the first failure.
	if err := lockstep.Stop(pair[0]); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err == nil || !strings.Contains(err.Error(), "step 3: boom") {
		t.Fatalf("ServeForward returned %v, want its first forward's error", err)
	}
	pair[1].Close() // the worker is gone
	err = forward(plan(5), make([]float32, vocab))
	if !errors.As(err, &pe) || pe.Peer != rank || !errors.Is(err, dist.ErrPeerGone) {
		t.Fatalf("step after the worker left: %v, want dp rank %d gone", err, rank)
	}
}

// TestLedgerPool: a ledger pool has its model's slabs and page size, so that the page ids
// its engine allocates index the worker's pool; it holds no bytes.
func TestLedgerPool(t *testing.T) {
	groups := []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 2, BytesPerToken: 64, PageTokens: 8}}
	like, err := engine.NewHostPool(groups, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	p, err := dp.LedgerPool(like)
	if err != nil {
		t.Fatal(err)
	}
	if p.Slabs() != like.Slabs() || p.SlabBytes() != like.SlabBytes() || p.BlockTokens() != like.BlockTokens() {
		t.Fatalf("ledger %d slabs of %d bytes (%d-token pages), like %d of %d (%d)", p.Slabs(), p.SlabBytes(), p.BlockTokens(), like.Slabs(), like.SlabBytes(), like.BlockTokens())
	}
	if _, ok := p.Arena().(kvslab.HostMemory); ok {
		t.Fatal("the ledger's arena is host memory")
	}
}

// TestJoinShmStuckWorker: a worker that is alive but never answers a plan (stuck outside
// any collective, where its peers' deadlines cannot see it) fails rank 0's step within
// the pairs' StepTimeout with a deadline error naming the dp rank, while the same
// worker's wait for its next plan, between steps, has no deadline: it idles past the
// StepTimeout and still serves the next plan. Before, rank 0 waited on its reply forever.
func TestJoinShmStuckWorker(t *testing.T) {
	const vocab = 2
	name := fmt.Sprintf("resin-dptest-%d-stuck", os.Getpid())
	o := dist.Options{Timeout: 10 * time.Second, StepTimeout: 300 * time.Millisecond}
	type joined struct {
		ctl  []dist.Communicator
		data dist.Communicator
		err  error
	}
	worker := make(chan joined, 1)
	go func() {
		ctl, data, hello, err := dp.JoinShm(name, 1, 2, o)
		if hello != nil {
			hello.Close()
		}
		worker <- joined{ctl, data, err}
	}()
	ctl, data, hello, err := dp.JoinShm(name, 0, 2, o)
	if err != nil {
		t.Fatal(err)
	}
	hello.Close()
	defer data.Close()
	w := <-worker
	if w.err != nil {
		t.Fatal(w.err)
	}
	defer w.data.Close()
	release := make(chan struct{})
	served := make(chan error, 1)
	go func() {
		served <- dp.ServeForward(w.ctl[0], vocab, func(p *engine.BatchPlan, logits []float32) error {
			if p.Step == 2 {
				<-release // stuck
			}
			logits[0], logits[1] = float32(p.Step), 1
			return nil
		})
	}()
	forward := dp.RemoteForward(ctl[1], 1)
	plan := func(step uint64) *engine.BatchPlan {
		return &engine.BatchPlan{Step: step, QueryStart: []int32{0, 1}, LogitsStart: []int32{0, 1}, ReqIDs: []uint64{1},
			Computed: []int32{0}, Scheduled: []int32{1}, PromptLen: []int32{1}, NumDrafts: []int32{0},
			Temperature: []float32{0}, TopP: []float32{0}, TopK: []int32{0}, MinP: []float32{0}, Seed: []uint64{0}, Logprobs: []int32{-1},
			Tokens: []int32{5}, Positions: []int32{0}, LogitsIndices: []int32{0}}
	}
	logits := make([]float32, vocab)
	if err := forward(plan(1), logits); err != nil || logits[0] != 1 {
		t.Fatalf("step 1: %v, logits %v", err, logits)
	}
	time.Sleep(2 * o.StepTimeout) // idle between steps: the worker waits on, no deadline
	err = forward(plan(2), logits)
	var pe *dist.PeerError
	if !errors.As(err, &pe) || pe.Peer != 1 || !errors.Is(err, dist.ErrTimeout) {
		t.Fatalf("a stuck worker's step: %v, want a deadline naming dp rank 1", err)
	}
	close(release)
	ctl[1].Close()
	select {
	case <-served: // the worker sees rank 0 gone once it replies
	case <-time.After(time.Minute):
		t.Fatal("the worker did not end once rank 0 closed its pair")
	}
	w.ctl[0].Close()
}

// TestRemoteDraft: a step's result sent by RemoteDraft reaches ServeRank's draft intact
// (accepted counts and tokens, after its plan), the drafts the worker proposes fill rank
// 0's result (counts per sequence and the drafts), a draft step's error comes back naming
// the dp rank, and a worker whose reply miscounts its drafts is refused by name.
func TestRemoteDraft(t *testing.T) {
	const vocab, rank = 2, 1
	pair, err := dist.NewInProcess(2, dist.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		served <- dp.ServeRank(pair[1], vocab, func(p *engine.BatchPlan, logits []float32) error { return nil },
			func(p *engine.BatchPlan, res *engine.StepResult) error {
				switch p.Step {
				case 2:
					return errors.New("no head")
				case 3: // a count that the drafts do not add up to
					res.NumNextDrafts[0] = 3
					res.Drafts = append(res.Drafts, 1)
					return nil
				}
				if !slices.Equal(res.Accepted, []int32{2}) || !slices.Equal(res.Tokens, []int32{7, 8}) {
					return fmt.Errorf("result %v %v", res.Accepted, res.Tokens)
				}
				res.NumNextDrafts[0] = 2
				res.Drafts = append(res.Drafts, 40, 41)
				return nil
			})
	}()
	forward, draft := dp.RemoteForward(pair[0], rank), dp.RemoteDraft(pair[0], rank)
	plan := func(step uint64) *engine.BatchPlan {
		return &engine.BatchPlan{Step: step, QueryStart: []int32{0, 1}, LogitsStart: []int32{0, 1}, ReqIDs: []uint64{1},
			Computed: []int32{0}, Scheduled: []int32{1}, PromptLen: []int32{1}, NumDrafts: []int32{0},
			Temperature: []float32{0}, TopP: []float32{0}, TopK: []int32{0}, MinP: []float32{0}, Seed: []uint64{0}, Logprobs: []int32{-1},
			Tokens: []int32{5}, Positions: []int32{0}, LogitsIndices: []int32{0}}
	}
	for step := uint64(1); step <= 3; step++ {
		p := plan(step)
		if err := forward(p, make([]float32, vocab)); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		var res engine.StepResult
		res.Reset(1)
		res.Accepted, res.Tokens = []int32{2}, []int32{7, 8}
		err := draft(p, &res)
		switch step {
		case 1:
			if err != nil || !slices.Equal(res.NumNextDrafts, []int32{2}) || !slices.Equal(res.Drafts, []int32{40, 41}) {
				t.Fatalf("step 1: %v, drafts %v %v", err, res.NumNextDrafts, res.Drafts)
			}
		case 2:
			if err == nil || !strings.Contains(err.Error(), "dp rank 1's worker: draft: no head") {
				t.Fatalf("step 2: %v, want the worker's draft error naming dp rank 1", err)
			}
		case 3:
			if err == nil || !strings.Contains(err.Error(), "counts adding up to 3 drafts, 1 sent") {
				t.Fatalf("step 3: %v, want the miscount refused", err)
			}
		}
	}
	if err := dp.StopRemote([]dist.Communicator{nil, pair[0]}); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err == nil || !strings.Contains(err.Error(), "no head") {
		t.Fatalf("the worker's end: %v, want its first draft error", err)
	}
}
