package glm5flash

import (
	"testing"

	"github.com/resin-llm/resin/core/dist/dp/dptest"
)

// TestDPAttentionMTP: DP-attention 2 × EP 2 with every rank drafting 2 tokens per step
// from its MTP layer (the layer's routed experts split over the ranks too), by either
// exchange, with the layer's own drafts and with drafts forced right but at every third
// position, gives every request the tokens one engine gives without drafts, with rank 1
// idle for several steps (dptest.CheckMTP). Without the idle rank's exchanges (DPDraft)
// the busy rank's draft rounds would wait for it until the data group's deadline.
func TestDPAttentionMTP(t *testing.T) {
	v := tinyTextModel(t).Config.VocabSize
	reqs := dpRequests(v)
	dptest.CheckMTP(t, dpInProcess(t), v, reqs, dpWant(t, reqs))
}
