package glm5flash

import (
	"testing"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp/dptest"
)

// TestDPAttentionMTP: DP-attention 2 × EP 2 with every rank drafting 2 tokens per step
// from its MTP layer (the layer's routed experts split over the ranks too), by either
// exchange, with the layer's own drafts and with drafts forced right but at every third
// position, gives every request the tokens one engine gives without drafts, with rank 1
// idle for several steps (dptest.CheckMTP). Without the idle rank's exchanges (DPDraft)
// the busy rank's draft rounds would wait for it until the data group's deadline.
func TestDPAttentionMTP(t *testing.T) {
	m := tinyTextModel(t)
	reqs := dpRequests(m.Config.VocabSize)
	dir := tinyDir(t)
	dptest.CheckMTP(t, dptest.DraftModel{
		Drafts:     2,
		Dispatches: []int{int(DispatchGather), int(DispatchAllToAll)},
		Open: func(d int, forced func(promptLen, pos int, logits []float32) int32, data []dist.Communicator) ([]dptest.DraftRank, error) {
			opts := tinyOpts
			opts.Drafts = 2
			runners, pools, err := OpenDPRanks(dir, opts, Dispatch(d), data)
			if err != nil {
				return nil, err
			}
			ranks := make([]dptest.DraftRank, len(runners))
			for r, run := range runners {
				if forced != nil {
					run.forceDraft = func(promptLen, pos, _ int, logits []float32) int32 { return forced(promptLen, pos, logits) }
				}
				lo, hi := run.Model.experts()
				ranks[r] = dptest.DraftRank{Forward: run.DPForward, Draft: run.DPDraft, Pool: pools[r], Info: run.Info(),
					Groups: len(run.CacheGroups()), Split: hi-lo < run.Model.Config.NRoutedExperts}
			}
			return ranks, nil
		},
	}, m.Config.VocabSize, reqs, dpWant(t, reqs))
}
