package glm5flash

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// ungroupedDir is a checkpoint directory of ungroupedTiny's config (seeded random
// weights): a token's two experts may sit on two ranks, so the exchange carries rows
// both ways (the tiny config's grouped routing puts both on one rank).
func ungroupedDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	js := strings.Replace(tinyTextConfigJSON, `"n_group": 2, "topk_group": 1`, `"n_group": 1, "topk_group": 1`, 1)
	if js == tinyTextConfigJSON {
		t.Fatal("the tiny config's routing groups moved: ungroup it here")
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestEmulatedDPAttentionMatchesSingleEngine runs DP-attention 2 × EP 2 on two emulated
// GPUs (OpenGPUDPRanks: each rank attending its own requests on its own device and pool,
// the routed experts split 2 + 2, the rows exchanged by NCCL all-gather and
// reduce-scatter) under dptest.CheckMatchesSingleEngine: every request gets the tokens one
// GPU's engine gives (greedy and seeded), with rank 1 idle for several steps while the
// first request runs alone, with and without graph-bucket padding. New allocations read
// NaN (RESIN_EMU_POISON), so a padding row left unset fails.
func TestEmulatedDPAttentionMatchesSingleEngine(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_POISON=1") {
		return
	}
	dir := ungroupedDir(t)
	reqs, want := gpuDPWant(t, dir)
	dptest.CheckMatchesSingleEngine(t, gpuDPInProcess(t, dir, gpuDPOpts(), nil), reqs, want)
}

// TestEmulatedDPMTP: DP-attention 2 × EP 2 on two emulated GPUs with every rank drafting
// 2 tokens a step with its MTP layer on the device (GPURunner.DPDraft: the layer's routed
// experts split over the ranks too, its MoE exchanges padded alike on both), by either
// exchange, with the layer's own drafts and with drafts forced right but at every third
// position (dptest.CheckMTP): every request gets the tokens one GPU's engine gives without
// drafts, with rank 1 idle for several steps, its idle draft steps running the layer's
// exchanges with no rows.
func TestEmulatedDPMTP(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_POISON=1") {
		return
	}
	dir := ungroupedDir(t)
	reqs, want := gpuDPWant(t, dir)
	dptest.CheckMTP(t, gpuDPInProcess(t, dir, gpuDPOpts(), nil), tinyTextModel(t).Config.VocabSize, reqs, want)
}

// TestEmulatedDPMTPFullChunk is TestEmulatedDPMTP with steps of 16 tokens, the runners'
// budget, and a 32-token prompt: its second chunk fills a step, and the MTP layer then
// runs over 17 rows (the step's and the one before it), more than the step's budget. The
// draft exchanges pad to the layer's workspace rows, not the budget: padded to 16, that
// rank's exchange was refused on it alone and the other rank waited in the all-gather.
func TestEmulatedDPMTPFullChunk(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	dir := ungroupedDir(t)
	opts := gpuDPOpts()
	opts.Limits.MaxTokens = 16
	one, pool, err := OpenGPU(dir, 8<<20, opts)
	if err != nil {
		t.Fatal(err)
	}
	v := tinyTextModel(t).Config.VocabSize
	reqs := dptest.Requests(v)
	for len(reqs[2].Prompt) < 32 {
		reqs[2].Prompt = append(reqs[2].Prompt, int32(len(reqs[2].Prompt)*7%v))
	}
	want := dptest.Want(t, one, pool, reqs)
	one.(*GPURunner).Close()
	dptest.CheckMTP(t, gpuDPInProcess(t, dir, opts, nil), v, reqs, want)
}

// TestEmulatedDPAttentionGraphs is TestEmulatedDPAttentionMatchesSingleEngine with the dp
// ranks' decode steps replaying CUDA graphs (the gather exchange's all-gathers and
// reduce-scatter captured with them, the KDA and MLA layers' decode as one GPU's graphs
// run it), the Group padding all-decode steps to the ranks' buckets: every request gets
// one eager GPU engine's tokens, with rank 1 idle for several steps (its idle plans
// replaying, as graphs of padding rows, the collectives rank 0's graphs replay: NCCL
// forbids mixing graph and eager launches), and both ranks replay graphs.
func TestEmulatedDPAttentionGraphs(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_POISON=1") {
		return
	}
	dir := ungroupedDir(t)
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
	defer one.(*GPURunner).Close()
	reqs := dptest.Requests(tinyTextModel(t).Config.VocabSize)
	return reqs, dptest.Want(t, one, pool, reqs)
}

// gpuDPInProcess is the model in dir's GPU dp ranks in this process, opened with opts,
// for dptest's checks; opened (when set) is left the last ranks opened.
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
					run.forceDraft = func(promptLen, pos, _ int, logits []float32) int32 { return forced(promptLen, pos, logits) }
				}
			}
			return ranks, nil
		},
	}
}

// TestEmulatedDPRankEqualsOne: a DP-attention rank on an emulated GPU that runs the steps
// alone (a prefill of two prompts, 19 rows, then decode steps) while the other rank idles
// gives one GPU's logits within gpuEPTol, rank 0 busy and rank 1 busy: the idle rank's
// padding rows are routed to no expert, so they take none of an expert's rows from the
// busy rank's tokens. A step one rank refuses is refused by both; one rank is refused.
func TestEmulatedDPRankEqualsOne(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	dir := ungroupedDir(t)
	one, pool, err := OpenGPU(dir, 8<<20, gpuDPOpts())
	if err != nil {
		t.Fatal(err)
	}
	want, _ := decode(t, one.(*GPURunner).forward, pool, 3)
	one.(*GPURunner).Close()
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
		worst := 0.0
		for s := range want {
			d := relDiff(got[s], want[s])
			if worst = max(worst, d); !(d <= gpuEPTol) {
				t.Errorf("dispatch %d, rank %d busy, step %d: logits differ from one GPU's by %.3g of their largest (tolerance %g)", tc.d, busy, s, d, gpuEPTol)
			}
		}
		t.Logf("dispatch %d, rank %d busy: logits within %.3g of one GPU's", tc.d, busy, worst)
	}
	// A step rank 1 refuses (a token outside the vocabulary) is refused by both ranks, the
	// idle one naming it, neither left waiting in a collective.
	data, err := dist.NewInProcess(2, dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	g, err := OpenGPUDPRanks(dir, 8<<20, gpuDPOpts(), DispatchGather, 0, data)
	if err != nil {
		t.Fatal(err)
	}
	v := tinyTextModel(t).Config.VocabSize
	bad := runnertest.Plan(t, g.Pools[1], []*runnertest.Seq{runnertest.OpenSeq(t, g.Pools[1], []int32{3, int32(v)})}, []int{2}, false)
	bad.DP = engine.DPStep{Rank: 1, Tokens: []int32{0, 2}}
	dptest.CheckRefusalAgreed(t, []dp.Forward{g.Runners[0].DPForward, g.Runners[1].DPForward}, bad, make([]float32, len(bad.LogitsIndices)*v), "outside the vocabulary")
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		d    Dispatch
		data []dist.Communicator
		want string
	}{{DispatchGather, data[:1], "2 or more"}} {
		if _, err := OpenGPUDPRanks(dir, 8<<20, gpuDPOpts(), tc.d, 0, tc.data); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a refusal naming %q", fmt.Sprint(tc.d, len(tc.data)), err, tc.want)
		}
	}
}

// TestEmulatedDPWatchdog: with the emulated NCCL waiting as NCCL does (no deadline,
// RESIN_EMU_NCCL_HANG) and dp rank 1 hung in its first collective, a step of the ranks of
// this process (OpenGPUDPRanks' Forward: each rank's DPForward under its watchdog) fails
// at the 2 s watchdog (Options.Watchdog) with the NCCL communicator aborted, instead of
// waiting in the MoE exchange for good; the ranks' next step fails at once with the same
// permanent error.
func TestEmulatedDPWatchdog(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_NCCL_HANG=1", "RESIN_EMU_NCCL_STALL_RANK=1") {
		return
	}
	dir := ungroupedDir(t)
	data, err := dist.NewInProcess(2, dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	opts := gpuDPOpts()
	opts.Watchdog = 2 * time.Second
	g, err := OpenGPUDPRanks(dir, 8<<20, opts, DispatchGather, 0, data)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	v := tinyTextModel(t).Config.VocabSize
	p := runnertest.Plan(t, g.Pools[0], []*runnertest.Seq{runnertest.OpenSeq(t, g.Pools[0], []int32{3, 4, 5})}, []int{3}, false)
	step := dptest.Alone(0, []dp.Forward{g.Forward(0), g.Forward(1)})
	for _, what := range []string{"the step rank 1 hangs in", "the next step"} {
		var err error
		dptest.Within(t, time.Minute, what, func() { err = step(p, make([]float32, len(p.LogitsIndices)*v)) })
		// Rank 0 waits in the MoE exchange and its watchdog aborts it; rank 1 ends by its
		// own watchdog or by the communicator rank 0 aborted, whichever comes first.
		var abort *gpurunner.AbortError
		if !errors.As(err, &abort) || !strings.Contains(err.Error(), "dp rank 0 of 2: step 1 ran past the watchdog's 2s") {
			t.Fatalf("%s: %v, want rank 0's watchdog abort", what, err)
		}
		t.Logf("%s: %v", what, err)
	}
}
