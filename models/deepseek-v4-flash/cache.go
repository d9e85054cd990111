package deepseekv4flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/kvslab"
)

// CacheGroups declares the model's per-sequence state to a kvslab pool, sized as the
// state the forward keeps (float32):
//
//   - "swa" (SlidingWindow, every layer): the shared K=V row of each token in the window,
//     head_dim values;
//   - "csa" / "hca" (Compressed at each ratio, CSA and HCA layers): one entry per ratio
//     tokens: head_dim values (+ index_head_dim for the CSA indexer's key); a ratio that
//     does not divide pageTokens (HCA's 128 with 16-token pages) cannot be a kvslab
//     Compressed group, and is left out of the accounting for now;
//   - "state" (Recurrent, one per sequence): the compressors' partial windows and the
//     previous window's Ca half. Checkpoints 0: the forward cannot resume a sequence
//     from another's cached prefix, so the pool serves no prefix hits.
//
// TEMPORARY: the runner keeps the state itself in Go (runner.go, a map keyed by request
// id); the pool only accounts for it. Backing each part by its group's pages is the next
// step (state.go lists the parts).
func CacheGroups(c *Config, pageTokens int) []kvslab.GroupSpec {
	const f32 = 4
	gs := []kvslab.GroupSpec{{
		Name: "swa", Kind: kvslab.SlidingWindow, Layers: c.NumHiddenLayers + c.NumNextNPredictLayers,
		BytesPerToken: c.HeadDim * f32, PageTokens: pageTokens, Window: max(c.SlidingWindow, pageTokens),
	}}
	var nCSA, nHCA int
	for _, t := range c.LayerTypes {
		switch t {
		case CompressedSparse:
			nCSA++
		case HeavilyCompressed:
			nHCA++
		}
	}
	if r := c.CompressRates[CompressedSparse]; nCSA > 0 && r > 0 && pageTokens%r == 0 {
		gs = append(gs, kvslab.GroupSpec{Name: "csa", Kind: kvslab.Compressed, Layers: nCSA,
			BytesPerToken: (c.HeadDim + c.IndexHeadDim) * f32, PageTokens: pageTokens, Ratio: r})
	}
	if r := c.CompressRates[HeavilyCompressed]; nHCA > 0 && r > 0 && pageTokens%r == 0 {
		gs = append(gs, kvslab.GroupSpec{Name: "hca", Kind: kvslab.Compressed, Layers: nHCA,
			BytesPerToken: c.HeadDim * f32, PageTokens: pageTokens, Ratio: r})
	}
	// Partial windows (< ratio tokens of kv and gate) and the Ca half, per compressed layer.
	state := 0
	for _, t := range c.LayerTypes {
		switch t {
		case CompressedSparse:
			r := c.CompressRates[t]
			state += 2*r*2*c.HeadDim + 2*r*c.HeadDim           // compressor: pending kv+gate, Ca kv+gate
			state += 2*r*2*c.IndexHeadDim + 2*r*c.IndexHeadDim // indexer
		case HeavilyCompressed:
			state += 2 * c.CompressRates[t] * c.HeadDim
		}
	}
	if state > 0 {
		gs = append(gs, kvslab.GroupSpec{Name: "state", Kind: kvslab.Recurrent, Layers: 1,
			BytesPerToken: state * f32, PageTokens: pageTokens})
	}
	return gs
}

// checkPool verifies pool holds the model's groups.
func checkPool(c *Config, pool *kvslab.Pool) error {
	want := CacheGroups(c, pool.BlockTokens())
	got := pool.Groups()
	if len(got) != len(want) {
		return fmt.Errorf("cache: the pool has %d groups, the model needs %d (%+v)", len(got), len(want), want)
	}
	for i := range want {
		if got[i].Name != want[i].Name || got[i].Kind != want[i].Kind || got[i].Layers != want[i].Layers || got[i].BytesPerToken != want[i].BytesPerToken {
			return fmt.Errorf("cache: pool group %d %+v does not match the model's %+v", i, got[i], want[i])
		}
	}
	return nil
}
