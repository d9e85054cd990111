package deepseekv4flash

import (
	"testing"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp/dptest"
)

// TestDPAttentionMTP: DP-attention 2 × EP 2 with every rank drafting 2 tokens per step
// from its MTP head (the block's routed experts split over the ranks too), by either
// exchange, with the head's own drafts and with drafts forced right but at every third
// position, gives every request the tokens one engine gives without drafts, with rank 1
// idle for several steps: its idle drafts run the MTP block's exchanges with rank 0's
// rows (dptest.CheckMTP).
func TestDPAttentionMTP(t *testing.T) {
	v := tinyConfig(t).VocabSize
	reqs := dpRequests(v)
	dir := tinyDir(t)
	dptest.CheckMTP(t, dptest.DraftModel{
		Drafts:     2,
		Dispatches: []int{int(DispatchGather), int(DispatchAllToAll)},
		Open: func(d int, forced func(promptLen, pos int, logits []float32) int32, data []dist.Communicator) ([]dptest.DraftRank, error) {
			opts := tinyOpts
			opts.Drafts = 2
			runners, pools, err := OpenDPRanks(dir, opts, Dispatch(d), data, 8<<20)
			if err != nil {
				return nil, err
			}
			ranks := make([]dptest.DraftRank, len(runners))
			for r, run := range runners {
				if forced != nil {
					run.forceDraft = forced
				}
				e := run.Model.par
				ranks[r] = dptest.DraftRank{Forward: run.DPForward, Draft: run.DPDraft, Pool: pools[r], Info: run.Info(),
					Groups: len(run.CacheGroups()), Split: e.expHi-e.expLo < run.Model.Config.NRoutedExperts}
			}
			return ranks, nil
		},
	}, v, reqs, dpWant(t, reqs))
}
