package glm5flash

import (
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp/dptest"
	"github.com/resin-llm/resin/core/engine"
)

// dpRequests are dptest's requests over the tiny model's vocabulary.
func dpRequests(vocab int) []engine.Request { return dptest.Requests(vocab) }

// dpWant is what one engine on the tiny model gives each request, run one after another.
func dpWant(t *testing.T, reqs []engine.Request) map[string][]int32 {
	t.Helper()
	r, pool := tinyTextRunner(t)
	return dptest.Want(t, r, pool, reqs)
}

// dpInProcess is the tiny checkpoint's dp ranks in this process, as dptest's in-process
// checks open them.
func dpInProcess(t *testing.T) dptest.InProcessModel {
	dir := tinyDir(t)
	return dptest.InProcessModel{
		Dispatches: []int{int(DispatchGather), int(DispatchAllToAll)},
		Open: func(d, drafts int, forced func(promptLen, pos int, logits []float32) int32, data []dist.Communicator) ([]dptest.InProcessRank, error) {
			opts := tinyOpts
			opts.Drafts = drafts
			runners, pools, err := OpenDPRanks(dir, opts, Dispatch(d), data)
			if err != nil {
				return nil, err
			}
			ranks := make([]dptest.InProcessRank, len(runners))
			for r, run := range runners {
				if forced != nil {
					run.forceDraft = func(promptLen, pos, _ int, logits []float32) int32 { return forced(promptLen, pos, logits) }
				}
				lo, hi := run.Model.experts()
				split := hi-lo < run.Model.Config.NRoutedExperts
				ranks[r] = dptest.InProcessRank{Forward: run.DPForward, Pool: pools[r], Info: run.Info(), Groups: len(run.CacheGroups()), Split: split}
				if drafts > 0 {
					ranks[r].Draft = run.DPDraft
				}
			}
			return ranks, nil
		},
	}
}

// TestDPAttentionMatchesSingleEngine: DP-attention 2 × EP 2 (each rank attending its own
// requests, the routed experts of the sparse layers split over the two ranks, both exchanges, with and
// without graph-bucket padding) gives every request exactly the tokens one engine gives
// (greedy and seeded), with rank 1 idle for several steps while the first request runs
// alone: its idle plans run the MoE exchanges with rank 0's rows
// (dptest.CheckMatchesSingleEngine).
func TestDPAttentionMatchesSingleEngine(t *testing.T) {
	reqs := dpRequests(tinyTextModel(t).Config.VocabSize)
	dptest.CheckMatchesSingleEngine(t, dpInProcess(t), reqs, dpWant(t, reqs))
}

// TestDPForwardRefuses: a plan of another dp rank, or whose step miscounts its tokens, is
// refused before any collective; OpenDPRanks refuses one rank, DPDraft a rank opened
// without drafts.
func TestDPForwardRefuses(t *testing.T) {
	data, err := dist.NewInProcess(2, dist.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runners, _, err := OpenDPRanks(tinyDir(t), tinyOpts, DispatchAllToAll, data)
	if err != nil {
		t.Fatal(err)
	}
	idle := engine.BatchPlan{QueryStart: []int32{0}, LogitsStart: []int32{0}}
	for name, st := range map[string]engine.DPStep{
		"other rank": {Rank: 1, Tokens: []int32{0, 0}},
		"no dp":      {},
		"miscount":   {Rank: 0, Tokens: []int32{3, 0}},
	} {
		p := idle
		p.DP = st
		if err := runners[0].DPForward(&p, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, _, err := OpenDPRanks(tinyDir(t), tinyOpts, DispatchGather, data[:1]); err == nil {
		t.Error("one dp rank accepted")
	}
	// Ranks opened without drafts have no draft step (TestDPAttentionMTP: with them).
	if err := runners[0].DPDraft(&idle, &engine.StepResult{}); err == nil || !strings.Contains(err.Error(), "not opened for DP-attention with drafts") {
		t.Errorf("DPDraft on a rank without drafts: %v", err)
	}
}

// dpTPInProcess is dpInProcess with attention TP 2 in each of the 2 dp ranks: 4 ranks of
// this process, each dp rank's two splitting its MLA and KDA heads, the routed experts
// split over all 4.
func dpTPInProcess(t *testing.T) dptest.InProcessModel {
	dir := tinyDir(t)
	const tp = 2
	return dptest.WithAttentionTP(t, tp, []int{int(DispatchGather), int(DispatchAllToAll)}, tinyTextModel(t).Config.VocabSize,
		func(d int, world []dist.Communicator) ([]dptest.InProcessRank, error) {
			runners, pools, err := OpenDPTPRanks(dir, tinyOpts, Dispatch(d), tp, world)
			if err != nil {
				return nil, err
			}
			ranks := make([]dptest.InProcessRank, len(runners))
			for w, run := range runners {
				if mla, kda := run.Model.heads(); mla != run.Model.Config.NumAttentionHeads/tp || kda != run.Model.Config.LinearNumHeads/tp {
					t.Fatalf("rank %d holds %d MLA and %d KDA heads: the attention is not split", w, mla, kda)
				}
				lo, hi := run.Model.experts()
				split := hi-lo < run.Model.Config.NRoutedExperts
				ranks[w] = dptest.InProcessRank{Forward: run.DPForward, Pool: pools[w], Info: run.Info(), Groups: len(run.CacheGroups()), Split: split, Check: run.CheckPlan}
			}
			return ranks, nil
		})
}

// TestDPAttentionTPMatchesSingleEngine: DP-attention 2 × attention TP 2 (4 ranks: each
// dp rank's two split its MLA and KDA heads, dense and shared experts' columns and
// vocabulary; the routed experts split over all four; both exchanges, with and without
// graph-bucket padding) gives every request the tokens one engine gives (greedy and
// seeded), with dp rank 1 idle for several steps. It fails without the shared experts'
// all-reduce over the TP group.
func TestDPAttentionTPMatchesSingleEngine(t *testing.T) {
	reqs := dpRequests(tinyTextModel(t).Config.VocabSize)
	dptest.CheckMatchesSingleEngine(t, dpTPInProcess(t), reqs, dpWant(t, reqs))
}
