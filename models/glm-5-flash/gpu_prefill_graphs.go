package glm5flash

import (
	"fmt"
	"slices"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/models/glm-5-flash/kernels"
)

// Prefill graphs: a prefill step of one sequence whose chunk is exactly a prefill bucket
// (gpurunner.PrefillBuckets: 16 … 512 tokens) replays a CUDA graph, one per bucket and
// position in the KDA block (pos0 mod blockTokens, the graph key's Variant: where the
// chunk's block ends fall), captured after the shape's first eager run as decode graphs
// are (gpu_graphs.go). What would make the launches depend on the sequence is moved into
// fixed buffers uploaded before the launch:
//
//   - the KDA layers run on a staging copy of the sequence's live state page (copied in
//     before the graph, back after it), in the chunked form cut at the same block ends as
//     the eager path; at each block end the layer's states are copied by PageRows into the
//     block's checkpoint page at an offset from a table (the spare state where the plan
//     gives no checkpoint page), so the copies are graph nodes whose destinations change
//     without recapture;
//   - the MLA layers run gpuDSA.decode's batched path on the row table (positions pos0 …
//     pos0+T−1, the sequence's slot), which computes each row as gpuDSA.forward does (the
//     same kernels over the same rows, the new latents, keys and gates scattered to the
//     slot, the pools the chunk completes closed);
//   - lm_head runs on the chunk's last row (its logits are downloaded only when the plan
//     asks for that row).
//
// Steps of several sequences, other token counts, other logits rows, drafts (the MTP
// runner) and a sequence without a KDA state page run eagerly. On the emulated device the
// replay equals the eager runner bit for bit (TestEmulatedGPUPrefillGraphsEqualEager); on a
// GPU cuBLASLt may pick other kernels for the eager path's differently aligned outputs,
// so there the two agree within the fp32 tolerance, not necessarily bit for bit (unchecked).

// gpuPrefillGraphs is the prefill graphs' share of gpuGraphs: the buckets, the staging
// state, the checkpoint table ([ends·kdaLayers] pairs of int64: PageRows' paged offset,
// then its dense row 0, one pair a launch) and how many block ends a step can hold.
type gpuPrefillGraphs struct {
	buckets  []int
	staging  cudart.DevicePtr // a state page's KDA floats
	ckptTab  cudart.DevicePtr
	maxEnds  int
	kdaCount int
	tab      []int64
}

// usePrefillGraphs allocates the prefill graphs' buffers (from useGraphs).
func (g *gpuModel) usePrefillGraphs(c *cudart.Ctx, gr *gpuGraphs) error {
	b := gpurunner.PrefillBuckets(g.maxTokens)
	if len(b) == 0 || g.L.kda < 0 {
		return nil
	}
	p := &gpuPrefillGraphs{buckets: b, maxEnds: b[len(b)-1]/g.blockTokens + 1}
	for _, o := range g.L.kdaOff {
		if o >= 0 {
			p.kdaCount++
		}
	}
	p.tab = make([]int64, 2*p.maxEnds*p.kdaCount)
	for _, t := range []struct {
		dst *cudart.DevicePtr
		n   int64
	}{{&p.staging, 4 * int64(max(g.kdaFloats, 1))}, {&p.ckptTab, 8 * int64(len(p.tab))}} {
		buf, err := c.Alloc(t.n)
		if err != nil {
			return fmt.Errorf("gpu graphs: %w", err)
		}
		gr.bufs = append(gr.bufs, buf)
		*t.dst = buf.Ptr
	}
	gr.prefill = p
	return nil
}

// prefillBucket returns whether a step runs as a prefill graph (see the file's comment).
func (g *gpuModel) prefillBucket(seqs []*gpuSeq, tokens [][]int32, rows []int32) bool {
	gr := g.graphs
	if gr == nil || gr.prefill == nil || g.pool == nil || len(seqs) != 1 || seqs[0].Drafts != 0 || seqs[0].State == 0 || (g.par != nil && g.par.dp) {
		return false // under DP-attention prefill steps run eagerly (their rows are not a bucket's)
	}
	T := len(tokens[0])
	if !slices.Contains(gr.prefill.buckets, T) || T > len(gr.rowPos32) {
		return false
	}
	return len(rows) == 0 || (len(rows) == 1 && int(rows[0]) == T-1)
}

// blockEnds returns the chunk-relative ends (s1) of the KDA segments of T tokens at pos0
// that end a block, in order: where gpuKDA.forward calls BlockEnd.
func blockEnds(pos0, T, block int) []int {
	var out []int
	for s0 := 0; s0 < T; {
		s1 := min(T, s0+block-(pos0+s0)%block)
		if (pos0+s1)%block == 0 {
			out = append(out, s1)
		}
		s0 = s1
	}
	return out
}

// forwardPrefillGraph runs a prefill step of one sequence (prefillBucket's) of T tokens,
// each hc times in idsRep (forward's), as its bucket's graph and returns the logits of
// the rows asked (none or the last).
func (g *gpuModel) forwardPrefillGraph(c *cudart.Ctx, s *gpuSeq, T int, idsRep []int32, rows []int32) ([]float32, error) {
	w, gr := &g.w, g.graphs
	p := gr.prefill
	pos0 := s.Len
	if err := g.graphsOnArena(c); err != nil {
		return nil, err
	}
	for i := range T {
		gr.rowPos32[i], gr.rowSlot32[i] = int32(pos0+i), int32(s.slot)
	}
	// The checkpoint table: for block end k and KDA layer j, the offset of the layer's
	// states in block end k's checkpoint page (the spare state without one).
	base := g.arena.Ptr(0)
	ends := blockEnds(pos0, T, g.blockTokens)
	clear(p.tab)
	for k, e := range ends {
		b := (pos0 + e - 1) / g.blockTokens
		page := gr.spare
		if b < len(s.Ckpt) && s.Ckpt[b] != 0 {
			page = s.Ckpt[b]
		}
		j := 0
		for _, o := range g.L.kdaOff {
			if o >= 0 {
				p.tab[2*(k*p.kdaCount+j)] = int64(page-base)/4 + int64(o)
				j++
			}
		}
	}
	for _, u := range []error{cudart.Upload(c, w.idsRep, idsRep), cudart.Upload(c, gr.rowPos, gr.rowPos32[:T]),
		cudart.Upload(c, gr.rowSlot, gr.rowSlot32[:T]), cudart.Upload(c, p.ckptTab, p.tab),
		c.CopyDtoDAsync(p.staging, s.State, int64(4*g.kdaFloats), nil)} {
		if u != nil {
			return nil, u
		}
	}
	if err := c.Synchronize(); err != nil {
		return nil, err
	}
	g.s = gr.stream
	key := cudart.GraphKey{Kind: cudart.GraphPrefill, Bucket: T, Variant: pos0 % g.blockTokens}
	err := g.runGraphKey(c, key, func() error { return g.prefillStep(c, T, pos0, len(ends)) })
	g.s = nil
	if err != nil {
		return nil, err
	}
	if err := c.Synchronize(); err != nil {
		return nil, err
	}
	if err := c.CopyDtoDAsync(s.State, p.staging, int64(4*g.kdaFloats), nil); err != nil {
		return nil, err
	}
	if err := g.pageRows(c, s, s.Len, s.Len+T, false); err != nil {
		return nil, err
	}
	s.Len += T
	if err := c.Synchronize(); err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, nil
	}
	return g.downloadLogits(c, w.logits, 1, 1)
}

// prefillStep queues a prefill step of T rows at pos0 on g.s, every value it reads in
// device memory (forwardPrefillGraph's tables and staging state, the tokens in w.idsRep);
// ends is how many block ends the chunk holds (pos0 only fixes where they fall, the
// graph's variant).
func (g *gpuModel) prefillStep(c *cudart.Ctx, T, pos0, ends int) error {
	cfg, w, gr := g.m.Config, &g.w, g.graphs
	p := gr.prefill
	D, hc := cfg.HiddenSize, cfg.HCMult
	if ends > p.maxEnds {
		return fmt.Errorf("gpu graphs: %d block ends in a prefill of %d tokens, room for %d", ends, T, p.maxEnds)
	}
	if err := g.embedRows(c, g.s, w.streams, w.idsRep, T*hc); err != nil {
		return err
	}
	base := g.arena.Ptr(0)
	rows := kernels.RowTable{RowPos: gr.rowPos, RowSlot: gr.rowSlot}
	j := 0 // the KDA layer's index among the KDA layers
	for li := range g.layers {
		l := &g.layers[li]
		attn := func() error {
			if l.kda != nil {
				o, kj, k := g.L.kdaOff[li], j, 0
				j++
				st := gpuKDAState{Conv: off(p.staging, o), Recurrent: off(p.staging, o+g.convFloats)}
				call := gpuKDACall{X: w.x, Y: w.att, T: T, Pos0: pos0, BlockTokens: g.blockTokens, State: st,
					BlockEnd: func(int) error {
						tab := p.ckptTab + cudart.DevicePtr(16*(k*p.kdaCount+kj))
						k++
						return kernels.Run(g.dsa.ks, c, g.s, kernels.PageRows{Paged: base, Dense: st.Conv, Table: tab, Rows: 1,
							Dim: g.convFloats + g.recFloats})
					}}
				return g.kda.forward(c, g.s, l.kda, call)
			}
			sel := gpuDSASel{Sel: w.sel, Count: w.count, MaxSel: w.maxSel}
			return g.dsa.decode(c, g.s, l.dsa, l.dsaPools, rows, sel, w.x, w.att, T)
		}
		if err := g.layerWith(c, li, T, attn); err != nil {
			return fmt.Errorf("gpu: layer %d: %w", li, err)
		}
	}
	if err := kernels.Run(g.dsa.ks, c, g.s, kernels.StreamMean{Out: w.hidden, Streams: w.streams, Rows: T, HC: hc, Dim: D}); err != nil {
		return fmt.Errorf("gpu: %w", err)
	}
	if err := g.kk.RMSNorm(c, g.s, w.hidden, w.hidden, g.norm, T, D, float32(cfg.RMSNormEps)); err != nil {
		return err
	}
	if err := c.CopyDtoDAsync(w.y, off(w.hidden, (T-1)*D), int64(4*D), g.s); err != nil {
		return err
	}
	return g.vocabHead(c, g.headL, w.logits, w.y, g.head, 1)
}
