package deepseekv4flash

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/dist/dp/dptest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/runnertest"
)

// gpuDPOpts are the emulated DP ranks' sizes: room for every request of dptest's at once.
func gpuDPOpts() gpurunner.Options {
	return gpurunner.Options{Limits: gpurunner.Limits{MaxTokens: 32, MaxSeqs: 4}, KernelCache: os.Getenv("RESIN_KERNEL_CACHE"), Eager: true}
}

// TestEmulatedDPAttentionMatchesSingleEngine runs DP-attention 2 × EP 2 on two emulated
// GPUs (OpenGPUDPRanks: each rank attending its own requests on its own device and pool,
// the routed experts split 2 + 2, the rows exchanged by NCCL all-gather and
// reduce-scatter) under dptest.CheckMatchesSingleEngine: every request gets the tokens one
// GPU's engine gives (greedy and seeded), with rank 1 idle for several steps while the
// first request runs alone (its idle plans run the MoE collectives with padding rows),
// with and without graph-bucket padding. New allocations read NaN (RESIN_EMU_POISON), so
// a padding row left unset, or a rank adding another rank's stale expert blocks, fails;
// so does a reduce-scatter that hands a rank another's rows.
func TestEmulatedDPAttentionMatchesSingleEngine(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_POISON=1") {
		return
	}
	dir := tinyDir(t)
	reqs, want := gpuDPWant(t, dir)
	dptest.CheckMatchesSingleEngine(t, gpuDPInProcess(t, dir, gpuDPOpts(), nil), reqs, want)
}

// TestEmulatedDPMTP: DP-attention 2 × EP 2 on two emulated GPUs with every rank drafting
// 2 tokens a step with its MTP head on the device (GPURunner.DPDraft: the head's routed
// experts split over the ranks too, its MoE exchanges padded alike on both), by either
// exchange, with the head's own drafts and with drafts forced right but at every third
// position (dptest.CheckMTP): every request gets the tokens one GPU's engine gives without
// drafts, with rank 1 idle for several steps, its idle draft steps running the head's
// exchanges with no rows (without them rank 0's draft step waits in the head's
// all-gather).
func TestEmulatedDPMTP(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_POISON=1") {
		return
	}
	dir := tinyDir(t)
	reqs, want := gpuDPWant(t, dir)
	dptest.CheckMTP(t, gpuDPInProcess(t, dir, gpuDPOpts(), nil), tinyConfig(t).VocabSize, reqs, want)
}

// TestEmulatedDPAttentionGraphs is TestEmulatedDPAttentionMatchesSingleEngine with the dp
// ranks' decode steps replaying CUDA graphs (the gather exchange's all-gathers and
// reduce-scatter captured with them), the Group padding all-decode steps to the ranks'
// buckets (GPUDPRanks.GraphBuckets): every request gets one eager GPU engine's tokens,
// with rank 1 idle for several steps (its idle plans replaying, as graphs of padding rows,
// the collectives rank 0's graphs replay: NCCL forbids mixing graph and eager launches),
// and both ranks replay graphs.
func TestEmulatedDPAttentionGraphs(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_POISON=1") {
		return
	}
	dir := tinyDir(t)
	reqs, want := gpuDPWant(t, dir)
	opts := gpuDPOpts()
	opts.Eager = false
	var opened *GPUDPRanks
	dptest.CheckGraphs(t, gpuDPInProcess(t, dir, opts, &opened), []int{1, 2, 4}, reqs, want)
	if opened == nil {
		t.Fatal("no ranks opened")
	}
	if b := opened.GraphBuckets(); !slices.Equal(b, []int{1, 2, 4}) {
		t.Errorf("the ranks' graph buckets %v, want [1 2 4]", b)
	}
	for rank, run := range opened.Runners {
		if graph, _ := run.StepCounts(); graph == 0 {
			t.Errorf("rank %d replayed no decode graph", rank)
		}
	}
	// Rank 1 idles while the first request decodes alone: those steps are graphs of
	// padding rows on it (an eager idle step against rank 0's graph fails in the
	// emulated NCCL, as NCCL forbids).
	if n := opened.Runners[1].DPIdleGraphs(); n < 3 {
		t.Errorf("rank 1 ran %d idle steps as graphs, want at least 3", n)
	}
}

// gpuDPWant is dptest's requests and the tokens one eager GPU engine gives them, for the
// model in dir.
func gpuDPWant(t *testing.T, dir string) ([]engine.Request, map[string][]int32) {
	t.Helper()
	one, pool, err := OpenGPU(dir, 8<<20, gpuDPOpts())
	if err != nil {
		t.Fatal(err)
	}
	r := one.(*GPURunner)
	r.hostSampling = true // the dp ranks' engines sample on the host, through core/cpurunner
	defer r.Close()
	reqs := dptest.Requests(tinyConfig(t).VocabSize)
	return reqs, dptest.Want(t, r, pool, reqs)
}

// gpuDPInProcess is the tiny model's GPU dp ranks in this process, opened with opts, for
// dptest's checks; opened (when set) is left the last ranks opened.
func gpuDPInProcess(t *testing.T, dir string, opts gpurunner.Options, opened **GPUDPRanks) dptest.InProcessModel {
	return dptest.InProcessModel{
		Dispatches: []int{int(DispatchGather), int(DispatchAllToAll)},
		Open: func(d, drafts int, forced func(promptLen, pos int, logits []float32) int32, data []dist.Communicator) ([]dptest.InProcessRank, error) {
			g, err := OpenGPUDPRanks(dir, 8<<20, opts, Dispatch(d), drafts, data)
			if err != nil {
				return nil, err
			}
			if opened != nil {
				*opened = g
			}
			t.Cleanup(func() {
				if err := g.Close(); err != nil {
					t.Error(err)
				}
			})
			ranks := make([]dptest.InProcessRank, len(g.Runners))
			for r, run := range g.Runners {
				e := g.Experts()[r]
				ranks[r] = dptest.InProcessRank{Forward: g.Forward(r), Draft: g.Draft(r), Pool: g.Pools[r], Info: run.Info(), Groups: len(run.Info().CacheGroups),
					Split: e[1]-e[0] < run.Model.Config.NRoutedExperts}
				if forced != nil {
					run.forceDraft = forced
				}
			}
			return ranks, nil
		},
	}
}

// TestEmulatedDPRefusals: one rank is refused before any device is touched, and a step one dp rank refuses (a plan of another rank, one that
// miscounts its tokens, a token outside the vocabulary) is refused by both ranks, the idle one naming the other, with neither
// left waiting in a collective (dptest.CheckRefusalAgreed); the group still runs after.
func TestEmulatedDPRefusals(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	dir := tinyDir(t)
	data, err := dist.NewInProcess(2, dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenGPUDPRanks(dir, 8<<20, gpuDPOpts(), DispatchGather, 0, data[:1]); err == nil || !strings.Contains(err.Error(), "2 or more") {
		t.Errorf("one rank: %v", err)
	}
	g, err := OpenGPUDPRanks(dir, 8<<20, gpuDPOpts(), DispatchGather, 0, data)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	forwards := []dp.Forward{g.Runners[0].DPForward, g.Runners[1].DPForward}
	idle := func(rank int32, tokens ...int32) *engine.BatchPlan {
		return &engine.BatchPlan{QueryStart: []int32{0}, LogitsStart: []int32{0}, Groups: make([]engine.GroupPlan, len(g.Runners[1].Info().CacheGroups)),
			DP: engine.DPStep{Rank: rank, Tokens: tokens}}
	}
	for _, tc := range []struct {
		p    *engine.BatchPlan
		want string
	}{
		{idle(0, 0, 3), "a plan of dp rank 0"},
		{idle(1, 0, 3), "has 0 tokens, its step says 3"},
	} {
		dptest.CheckRefusalAgreed(t, forwards, tc.p, nil, tc.want)
	}
	v := tinyConfig(t).VocabSize
	bad := runnertest.Plan(t, g.Pools[1], []*runnertest.Seq{runnertest.OpenSeq(t, g.Pools[1], []int32{3, int32(v)})}, []int{2}, false)
	bad.DP = engine.DPStep{Rank: 1, Tokens: []int32{0, 2}}
	dptest.CheckRefusalAgreed(t, forwards, bad, make([]float32, len(bad.LogitsIndices)*v), "outside the vocabulary")
	// The group still runs: rank 1 alone gives one GPU's logits.
	one, pool, err := OpenGPU(dir, 8<<20, gpuDPOpts())
	if err != nil {
		t.Fatal(err)
	}
	want, _ := decode(t, one.(*GPURunner).forward, pool, 1)
	one.(*GPURunner).Close()
	got, _ := decode(t, dptest.Alone(1, forwards), g.Pools[1], 1)
	closeLogits(t, "after the refusals", got, want, v, gpuEPTol)
}

// TestEmulatedDPRankEqualsOne: a DP-attention rank on an emulated GPU that runs the steps
// alone (prefill of two prompts, 19 rows, then 3 decode steps) while the other rank
// idles gives one GPU's logits within gpuEPTol, rank 0 busy and rank 1 busy: the idle
// rank's padding rows are routed to no expert, so they take none of a routed expert's
// rows from the busy rank (routed to expert 0 instead, as a first cut had them, rank 0's
// padding filled expert 0's rows and rank 1's tokens lost it).
func TestEmulatedDPRankEqualsOne(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	dir := tinyDir(t)
	one, pool, err := OpenGPU(dir, 8<<20, gpuDPOpts())
	if err != nil {
		t.Fatal(err)
	}
	want, _ := decode(t, one.(*GPURunner).forward, pool, 3)
	one.(*GPURunner).Close()
	v := tinyConfig(t).VocabSize
	for _, tc := range []struct {
		busy int
		d    Dispatch
	}{{0, DispatchGather}, {1, DispatchGather}, {0, DispatchAllToAll}, {1, DispatchAllToAll}} {
		busy := tc.busy
		data, err := dist.NewInProcess(2, dist.Options{Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		g, err := OpenGPUDPRanks(dir, 8<<20, gpuDPOpts(), tc.d, 0, data)
		if err != nil {
			t.Fatal(err)
		}
		if tc.d == DispatchAllToAll {
			if err := g.Runners[busy].UseGraphs(true, nil); err == nil || !strings.Contains(err.Error(), "gather exchange only") {
				t.Errorf("graphs under DP-attention's all-to-all exchange: %v", err)
			}
		}
		f := dptest.Alone(busy, []dp.Forward{g.Runners[0].DPForward, g.Runners[1].DPForward})
		got, _ := decode(t, f, g.Pools[busy], 3)
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		closeLogits(t, fmt.Sprintf("dispatch %d, rank %d busy", tc.d, busy), got, want, v, gpuEPTol)
	}
}

// TestEmulatedDPGraphRecapture: dp rank 0 decodes two sequences alone while rank 1 idles,
// each decode step padded to bucket 2 so that both ranks run it as that bucket's graph
// (rank 1's of padding rows), the first captured together and the next replayed; then
// rank 1's graphs are dropped (UseGraphs again) and the next step is captured anew on both
// ranks (gpurunner.DPCapture) rather than replayed on rank 0 against rank 1's eager run,
// which the emulated NCCL fails as NCCL forbids. The logits stay one eager GPU's.
func TestEmulatedDPGraphRecapture(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_POISON=1") {
		return
	}
	dir := tinyDir(t)
	one, pool, err := OpenGPU(dir, 8<<20, gpuDPOpts())
	if err != nil {
		t.Fatal(err)
	}
	const steps = 5
	want, _ := decode(t, one.(*GPURunner).forward, pool, steps)
	one.(*GPURunner).Close()
	data, err := dist.NewInProcess(2, dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	opts := gpuDPOpts()
	opts.Eager = false
	g, err := OpenGPUDPRanks(dir, 8<<20, opts, DispatchGather, 0, data)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	alone := dptest.Alone(0, []dp.Forward{g.Forward(0), g.Forward(1)})
	calls := 0
	f := func(p *engine.BatchPlan, logits []float32) error {
		calls++
		if calls == 5 {
			if err := g.Runners[1].UseGraphs(true, nil); err != nil { // rank 1's graphs dropped
				return err
			}
		}
		if p.NumTokens() == len(p.ReqIDs) {
			p.DP.Pad = 2 // a decode step: padded to the bucket, as the Group pads it
		}
		return alone(p, logits)
	}
	got, _ := decode(t, f, g.Pools[0], steps)
	closeLogits(t, "rank 0 alone, graphs recaptured", got, want, tinyConfig(t).VocabSize, gpuEPTol)
	// Decode steps 1 and 4 ran eagerly and were captured; 2, 3 and 5 replayed.
	if graph, _ := g.Runners[0].StepCounts(); graph != 3 {
		t.Errorf("rank 0 replayed %d decode graphs, want 3", graph)
	}
	if n := g.Runners[1].DPIdleGraphs(); n != steps {
		t.Errorf("rank 1 ran %d idle steps as graphs, want %d", n, steps)
	}
}
