package glm5flash

import (
	"fmt"
	"io"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/models/glm-5-flash/kernels"
)

// gpuGraphs are the CUDA graphs of decode steps, one per batch bucket
// (gpurunner.DecodeBuckets), as core/gpurunner's dense path and deepseek-v4-flash keep
// them. A decode step of b sequences (one token and one logits row each, no drafts) runs
// batched (gpuKDA.decode, gpuDSA.decode: one launch per kernel for all its rows), padded
// to the smallest bucket of at least b: the padding rows' KDA states are a spare state
// (decodeTabs' spare), their MLA rows the spare slot (index slots of every dsaPools, at
// position 0), which no real sequence reads. Every per-step value the graph reads is
// uploaded to fixed buffers before the launch: the tokens, each row's position and slot
// (the DSA row table) and the offset of its KDA state page in the arena (the KDA kernels'
// Offsets table), so the launches depend only on the bucket. The first step of a bucket
// runs eagerly (every cuBLASLt plan made, every module loaded outside the capture) and is
// then captured; later ones replay it. What a step writes outside the launches runs after
// it on the default stream, as the eager path: the new MLA rows written through to the
// pages and, for a token ending a block, the KDA checkpoint copies. Prefill steps of one
// sequence and a bucket's tokens replay prefill graphs (gpu_prefill_graphs.go); other
// prefill steps, steps with drafts (the MTP runner) and steps naming other logits rows
// run eagerly.
type gpuGraphs struct {
	cache   *cudart.GraphCache
	buckets []int
	failed  map[cudart.GraphKey]bool
	log     io.Writer
	stream  *cudart.Stream // every launch of a decode step (graphs cannot capture the default stream)
	// The step's tables, [bucket] each: positions and slots (int32), KDA state offsets
	// (int64, floats from the arena's base).
	rowPos, rowSlot, kdaOffs cudart.DevicePtr
	spare                    cudart.DevicePtr // the padding rows' KDA states (a state page's floats)
	bufs                     []cudart.Buffer
	// arena is the pool's arena the graphs hold (the KDA states' base pointers): a new
	// pool (NewPool) drops them.
	arena *cudart.DeviceArena
	// prefill is the prefill graphs' (gpu_prefill_graphs.go; nil without KDA layers);
	// rowPos32 and rowSlot32 the host side of the row table, sized as rowPos.
	prefill             *gpuPrefillGraphs
	rowPos32, rowSlot32 []int32
}

// gpuStats counts the decode steps that replayed a graph and those that ran a graph
// bucket eagerly (its first), and the same for prefill graphs.
type gpuStats struct{ Graph, Eager, PrefillGraph, PrefillEager, IdleGraph int }

// useGraphs turns decode graphs on (log: a capture that failed, its shape then eager) or
// off.
func (g *gpuModel) useGraphs(c *cudart.Ctx, on bool, log io.Writer) error {
	g.closeGraphs(c)
	if !on {
		return nil
	}
	if g.maxDrafts > 0 {
		return nil // the MTP runner's steps carry drafts: eager (see gpuGraphs)
	}
	b := gpurunner.DecodeBuckets(min(g.slots, g.maxRows))
	pb := gpurunner.PrefillBuckets(g.maxTokens)
	// Decode graphs and, per prefill bucket, a few positions in the KDA block.
	cache, err := cudart.NewGraphCache(len(b) + 4*len(pb))
	if err != nil {
		return err
	}
	if log == nil {
		log = io.Discard
	}
	gr := &gpuGraphs{cache: cache, buckets: b, failed: map[cudart.GraphKey]bool{}, log: log}
	g.graphs = gr
	if gr.stream, err = c.NewStream(); err != nil {
		g.closeGraphs(c)
		return fmt.Errorf("gpu graphs: %w", err)
	}
	top := b[len(b)-1]
	if len(pb) > 0 {
		top = max(top, pb[len(pb)-1])
	}
	gr.rowPos32, gr.rowSlot32 = make([]int32, top), make([]int32, top)
	for _, t := range []struct {
		p *cudart.DevicePtr
		n int64
	}{{&gr.rowPos, 4 * int64(top)}, {&gr.rowSlot, 4 * int64(top)}, {&gr.kdaOffs, 8 * int64(top)}, {&gr.spare, 4 * int64(max(g.L.stateFloats, 1))}} {
		buf, err := c.Alloc(t.n)
		if err != nil {
			g.closeGraphs(c)
			return fmt.Errorf("gpu graphs: %w", err)
		}
		gr.bufs = append(gr.bufs, buf)
		*t.p = buf.Ptr
	}
	if g.par != nil && g.par.dp {
		return nil // under DP-attention prefill steps run eagerly: no prefill graphs' buffers
	}
	if err := g.usePrefillGraphs(c, gr); err != nil {
		g.closeGraphs(c)
		return err
	}
	return nil
}

// closeGraphs destroys the graphs and their buffers.
func (g *gpuModel) closeGraphs(c *cudart.Ctx) {
	gr := g.graphs
	if gr == nil {
		return
	}
	gr.cache.Close(c)
	for _, b := range gr.bufs {
		c.Free(b)
	}
	if gr.stream != nil {
		c.DestroyStream(gr.stream)
	}
	g.graphs = nil
}

// decodeBucket returns the bucket a step runs in as a graph, 0 for an eager one.
func (g *gpuModel) decodeBucket(seqs []*gpuSeq, tokens [][]int32, rows []int32) int {
	if g.graphs == nil || g.pool == nil || g.L.kda < 0 || len(rows) != len(seqs) {
		return 0
	}
	for i, s := range seqs {
		if len(tokens[i]) != 1 || rows[i] != int32(i) || s.Drafts != 0 || s.State == 0 {
			return 0
		}
	}
	if p := g.par; p != nil && p.dp {
		// Under DP-attention the ranks agreed whether every one runs the step as the
		// graph of the dpRows rows their MoE layers exchange (gpu_dp.go).
		if p.dpGraph != gpurunner.DPEager {
			return p.dpRows
		}
		return 0
	}
	for _, b := range g.graphs.buckets {
		if b >= len(seqs) {
			return b
		}
	}
	return 0
}

// graphsOnArena drops the captured graphs (decode and prefill) when the pool's arena is
// not the one they were captured on (NewPool): they hold its KDA states' pointers.
func (g *gpuModel) graphsOnArena(c *cudart.Ctx) error {
	gr := g.graphs
	if gr.arena == g.arena {
		return nil
	}
	if err := gr.cache.Close(c); err != nil {
		return err
	}
	clear(gr.failed)
	gr.arena = g.arena
	return nil
}

// forwardGraph runs a decode step (decodeBucket's bucket > 0; the tokens checked by
// forward, each sequence prepared) as that bucket's graph and returns every real row's
// logits.
func (g *gpuModel) forwardGraph(c *cudart.Ctx, bucket int, seqs []*gpuSeq, tokens [][]int32) ([]float32, error) {
	cfg, w, gr := g.m.Config, &g.w, g.graphs
	hc, n := cfg.HCMult, len(seqs)
	if err := g.graphsOnArena(c); err != nil {
		return nil, err
	}
	ids := make([]int32, bucket*hc) // the padding rows' token 0
	pos, slot := make([]int32, bucket), make([]int32, bucket)
	offs := make([]int64, bucket)
	base := g.arena.Ptr(0)
	spare := int64(gr.spare-base) / 4
	for i := range bucket {
		pos[i], slot[i], offs[i] = 0, int32(g.slots), spare
		if i < n {
			s := seqs[i]
			for j := range hc {
				ids[i*hc+j] = tokens[i][0]
			}
			pos[i], slot[i], offs[i] = int32(s.Len), int32(s.slot), int64(s.State-base)/4
		}
	}
	g.vocab().LocalIDs(ids)
	for _, u := range []error{cudart.Upload(c, w.idsRep, ids), cudart.Upload(c, gr.rowPos, pos), cudart.Upload(c, gr.rowSlot, slot),
		cudart.Upload(c, gr.kdaOffs, offs)} {
		if u != nil {
			return nil, u
		}
	}
	if p := g.par; p != nil && p.dp {
		// The rows the MoE layers keep (DPMoE.MaskReal): the padding is routed nowhere.
		if err := cudart.Upload(c, w.dp.Real, []int32{int32(n)}); err != nil {
			return nil, err
		}
	}
	if bucket > n {
		// The padding rows share the spare state: cleared each step, so that what they
		// compute is finite (a fresh allocation's bytes may read NaN, and a padding row's
		// NaN reached a real row's output through the dp ranks' MoE exchange).
		if err := c.MemsetAsync(gr.spare, 0, int64(4*max(g.L.stateFloats, 1)), nil); err != nil {
			return nil, err
		}
	}
	// The eager path's work (prepare's clears and gathers) is on the default stream and
	// the graph's on its own non-blocking one: wait between them.
	if err := c.Synchronize(); err != nil {
		return nil, err
	}
	if p := g.par; p != nil && p.dp && p.dpGraph == gpurunner.DPCapture {
		// Some dp rank lacks the graph: every rank captures it anew at this step.
		if err := gr.cache.Drop(c, cudart.GraphKey{Kind: cudart.GraphDecode, Bucket: bucket}); err != nil {
			return nil, err
		}
	}
	g.s = gr.stream
	err := g.runGraph(c, bucket, func() error { return g.decodeStep(c, bucket) })
	g.s = nil
	if err != nil {
		return nil, err
	}
	if err := c.Synchronize(); err != nil {
		return nil, err
	}
	for _, s := range seqs {
		if err := g.pageRows(c, s, s.Len, s.Len+1, false); err != nil {
			return nil, err
		}
		if (s.Len+1)%g.blockTokens == 0 {
			for li, l := range g.layers {
				if l.kda != nil {
					if err := g.checkpoint(c, s, li, s.Len); err != nil {
						return nil, err
					}
				}
			}
		}
		s.Len++
	}
	if err := c.Synchronize(); err != nil {
		return nil, err
	}
	return g.downloadLogits(c, w.logits, bucket, n)
}

// runGraph runs step, the launches of a decode step of bucket rows on the graphs'
// stream: the bucket's graph when it was captured, else eagerly and then captured.
func (g *gpuModel) runGraph(c *cudart.Ctx, bucket int, step func() error) error {
	return g.runGraphKey(c, cudart.GraphKey{Kind: cudart.GraphDecode, Bucket: bucket}, step)
}

// runGraphKey is runGraph for the graph of key (a decode or a prefill step).
func (g *gpuModel) runGraphKey(c *cudart.Ctx, key cudart.GraphKey, step func() error) error {
	gr := g.graphs
	graphs, eager := &g.Stats.Graph, &g.Stats.Eager
	if key.Kind == cudart.GraphPrefill {
		graphs, eager = &g.Stats.PrefillGraph, &g.Stats.PrefillEager
	}
	if !gr.failed[key] {
		ok, err := gr.cache.Replay(c, gr.stream, key)
		if err != nil {
			return err
		}
		if ok {
			*graphs++
			return nil
		}
	}
	*eager++
	if err := step(); err != nil {
		return err
	}
	if gr.failed[key] {
		return nil
	}
	// Capturing records the step without running it: the eager run above was this step.
	if _, err := gr.cache.Capture(c, gr.stream, key, step); err != nil {
		gr.failed[key] = true
		fmt.Fprintf(gr.log, "gpu: %v; that shape runs eagerly\n", err)
	}
	return nil
}

// decodeStep queues a decode step of bucket rows on g.s, every value it reads already in
// device memory (forwardGraph's tables, the tokens in w.idsRep): the embedding, the
// layers (the attention batched over the rows), hc_head and lm_head into w.logits.
func (g *gpuModel) decodeStep(c *cudart.Ctx, bucket int) error {
	cfg, w, gr := g.m.Config, &g.w, g.graphs
	D, hc := cfg.HiddenSize, cfg.HCMult
	if err := g.embedRows(c, g.s, w.streams, w.idsRep, bucket*hc); err != nil {
		return err
	}
	base := g.arena.Ptr(0)
	rows := kernels.RowTable{RowPos: gr.rowPos, RowSlot: gr.rowSlot}
	for li := range g.layers {
		l := &g.layers[li]
		attn := func() error {
			if l.kda != nil {
				o := g.L.kdaOff[li]
				return g.kda.decode(c, g.s, l.kda, gpuKDADecode{X: w.x, Y: w.att, Seqs: bucket, Offsets: gr.kdaOffs,
					States: gpuKDAState{Conv: off(base, o), Recurrent: off(base, o+g.convFloats)}})
			}
			sel := gpuDSASel{Sel: w.sel, Count: w.count, MaxSel: w.maxSel}
			return g.dsa.decode(c, g.s, l.dsa, l.dsaPools, rows, sel, w.x, w.att, bucket)
		}
		if err := g.layerWith(c, li, bucket, attn); err != nil {
			return fmt.Errorf("gpu: layer %d: %w", li, err)
		}
	}
	if err := kernels.Run(g.dsa.ks, c, g.s, kernels.StreamMean{Out: w.hidden, Streams: w.streams, Rows: bucket, HC: hc, Dim: D}); err != nil {
		return fmt.Errorf("gpu: %w", err)
	}
	if err := g.kk.RMSNorm(c, g.s, w.hidden, w.hidden, g.norm, bucket, D, float32(cfg.RMSNormEps)); err != nil {
		return err
	}
	return g.vocabHead(c, g.headL, w.logits, w.hidden, g.head, bucket)
}
