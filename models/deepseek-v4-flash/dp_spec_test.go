package deepseekv4flash

import (
	"testing"

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
	dptest.CheckMTP(t, dpInProcess(t), v, reqs, dpWant(t, reqs))
}
