package deepseekv4flash

import (
	"fmt"
	"io"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
)

// gpuGraphs are the CUDA graphs of the forward's steps, as core/gpurunner's dense path
// keeps them:
//
//   - decode steps, one graph per batch bucket (gpurunner.DecodeBuckets): a decode step of
//     b sequences (one token and one logits row each) runs padded to the smallest bucket
//     of at least b, the padding rows in the spare slot (index slots, allocated beside the
//     real ones: it holds only their writes, at position 0, and no real sequence reads it);
//   - every other step (prefill, chunked prefill, prefill beside decode rows) of fewer rows
//     than the largest token bucket (gpurunner.PrefillBuckets), one graph per token bucket
//     and number of sequences (and whether any row is sampled): the step runs padded to
//     the smallest bucket of more rows than it has, the padding one more sequence of the
//     spare slot from position 0, and the head runs over one row per real sequence (the
//     rows the step names, the last repeated). A step naming more logits rows than it has
//     sequences runs eagerly.
//
// The first step of a shape runs eagerly (every cuBLASLt plan made and every module
// loaded outside the capture) and is then captured; the later ones replay it. Every
// per-step value the graph reads (tokens, positions, slots, row offsets, the logits rows)
// is uploaded to fixed buffers before the launch, and the launches depend only on the
// shape. What the host pool's write-through reads between layers (mirrorStep.layer: each
// layer's K=V rows and compressor projections) a prefill graph copies on the device into
// a stash of its own after each block, read back after the replay. The MTP runner's
// forward steps (verification, prefill) and the first MTP step of its drafting run
// eagerly; the drafting chain after it (gpuModel.draftChain: argmax, the next step's
// inputs, the head, for every further draft) is one graph per count of drafting
// sequences (GraphDecode, Variant draftChainGraph | drafts), unpadded. Under
// DP-attention (gpu_dp.go) only decode steps run as graphs, on every rank or on none (as
// the ranks agree), in the bucket of the rows every rank's MoE layers exchange
// (gpuPar.dpRows), an idle rank's rows all padding: the gather exchange's collectives are
// captured with the step on every rank at the same step.
// draftChainGraph marks the Variant of a drafting chain's graph key.
const draftChainGraph = 1 << 20

type gpuGraphs struct {
	cache   *cudart.GraphCache
	buckets []int // decode batch sizes
	prefill []int // prefill token counts
	failed  map[cudart.GraphKey]bool
	log     io.Writer
}

// useGraphs turns graphs on (log: a capture that failed, its shape then eager) or off
// (nil log and off).
func (g *gpuModel) useGraphs(c *cudart.Ctx, on bool, log io.Writer) error {
	if g.graphs != nil {
		g.graphs.cache.Close(c)
		g.graphs = nil
	}
	if !on {
		return nil
	}
	b := gpurunner.DecodeBuckets(min(g.slots, g.maxRows))
	pb := gpurunner.PrefillBuckets(g.maxTokens)
	if g.par != nil && g.par.dp {
		pb = nil // under DP-attention prefill steps run eagerly: no stash
	}
	if err := g.allocStash(c, pb); err != nil {
		return err
	}
	// Room for every decode bucket and a few sequence counts per token bucket; the least
	// recently used graph goes first.
	cache, err := cudart.NewGraphCache(len(b) + 4*len(pb))
	if err != nil {
		return err
	}
	if log == nil {
		log = io.Discard
	}
	g.graphs = &gpuGraphs{cache: cache, buckets: b, prefill: pb, failed: map[cudart.GraphKey]bool{}, log: log}
	return nil
}

// decodeBucket returns the bucket a step runs in as a decode graph, 0 for none.
func (g *gpuModel) decodeBucket(seqs []*gpuSeq, tokens [][]int32, rows []int32) int {
	if g.graphs == nil || g.mtp != nil || len(rows) != len(seqs) {
		return 0
	}
	for i := range seqs {
		if len(tokens[i]) != 1 || rows[i] != int32(i) {
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

// prefillBucket returns the token bucket a step of n rows over seqs, want of them
// sampled, runs in as a prefill graph: the smallest of more than n rows (the padding
// sequence has at least one), 0 for none.
func (g *gpuModel) prefillBucket(seqs []*gpuSeq, n, want int) int {
	if g.graphs == nil || g.mtp != nil || want > len(seqs) || len(seqs) > g.slots || (want > 0 && len(seqs) > g.maxRows) || (g.par != nil && g.par.dp) {
		return 0 // under DP-attention prefill steps run eagerly (their rows are not a bucket's)
	}
	for _, t := range g.graphs.prefill {
		if t > n && t <= g.maxTokens && t-n <= g.m.maxContext && t <= g.stash.rows {
			return t
		}
	}
	return 0
}

// prefillKey names the prefill graph of t rows over seqs real sequences, with the head
// when want > 0.
func (g *gpuModel) prefillKey(t, seqs, want int) cudart.GraphKey {
	v := seqs
	if want == 0 {
		v |= 1 << 16 // no row sampled: the graph has no head
	}
	return cudart.GraphKey{Kind: cudart.GraphPrefill, Bucket: t, Variant: v}
}

// gpuStash is where a prefill graph leaves each layer's rows (layerRows) for the host
// pool's write-through: rows rows per layer.
type gpuStash struct {
	rows   int
	layers []layerRows
}

// allocStash allocates the stash for the largest of the token buckets pb, once.
func (g *gpuModel) allocStash(c *cudart.Ctx, pb []int) error {
	if len(pb) == 0 || (g.stash != nil && g.stash.rows >= pb[len(pb)-1]) {
		return nil
	}
	st := &gpuStash{rows: pb[len(pb)-1]}
	d := g.m.Config.HeadDim
	for li := range g.layers {
		var lr layerRows
		var err error
		if lr.kv, err = g.arena.alloc(c, 4*st.rows*d); err != nil {
			return fmt.Errorf("gpu: prefill graphs' stash: %w", err)
		}
		for _, cp := range g.comps(li) {
			var p [2]cudart.DevicePtr
			for k := range p {
				if p[k], err = g.arena.alloc(c, 4*st.rows*cp.dev.Width()); err != nil {
					return fmt.Errorf("gpu: prefill graphs' stash: %w", err)
				}
			}
			lr.proj = append(lr.proj, p)
		}
		st.layers = append(st.layers, lr)
	}
	g.stash = st
	return nil
}

// stashRows queues the copy of layer li's n rows from the work buffers into the stash.
func (g *gpuModel) stashRows(c *cudart.Ctx, li, n int) error {
	dst, src := g.stash.layers[li], g.workRows(li)
	d := g.m.Config.HeadDim
	if err := c.CopyDtoDAsync(dst.kv, src.kv, int64(4*n*d), g.s); err != nil {
		return err
	}
	for ci, cp := range g.comps(li) {
		for k := range 2 {
			if err := c.CopyDtoDAsync(dst.proj[ci][k], src.proj[ci][k], int64(4*n*cp.dev.Width()), g.s); err != nil {
				return err
			}
		}
	}
	return nil
}

// stashed is layer li's rows in the stash.
func (g *gpuModel) stashed(li int) layerRows { return g.stash.layers[li] }

// decodeKey names the decode graph of bucket b.
func decodeKey(b int) cudart.GraphKey {
	return cudart.GraphKey{Kind: cudart.GraphDecode, Bucket: b, Variant: 1}
}

// runGraph runs step, the launches of the step of shape key: its graph when it was
// captured, else eagerly and then captured.
func (g *gpuModel) runGraph(c *cudart.Ctx, key cudart.GraphKey, step func() error) error {
	gr := g.graphs
	chain := key.Kind == cudart.GraphDecode && key.Variant&draftChainGraph != 0
	if !gr.failed[key] {
		ok, err := gr.cache.Replay(c, g.s, key)
		if err != nil {
			return err
		}
		if ok {
			switch {
			case chain:
				g.Stats.DraftGraph++
			case key.Kind == cudart.GraphPrefill:
				g.Stats.PrefillGraph++
				fallthrough
			default:
				g.Stats.Graph++
			}
			return nil
		}
	}
	if !chain {
		g.Stats.Eager++
	}
	if err := step(); err != nil {
		return err
	}
	if gr.failed[key] {
		return nil
	}
	// Capturing records the step without running it: the eager run above was this step.
	if _, err := gr.cache.Capture(c, g.s, key, step); err != nil {
		gr.failed[key] = true
		fmt.Fprintf(gr.log, "gpu: %v; that shape runs eagerly\n", err)
	}
	return nil
}

// decoded writes what a decode graph step (one token per sequence) left in the device
// slots and the per-layer hook (mirrorStep.layer) did not see: each layer's
// sliding-window row of the position fed, from the ring, and, where that position ends a
// block, the checkpoint of every compressor: its buffers right after it, which are the
// slot's now.
func (ms *mirrorStep) decoded(c *cudart.Ctx, g *gpuModel, seqs []*gpuSeq) error {
	cfg := g.m.Config
	d, win, pt := cfg.HeadDim, cfg.SlidingWindow, ms.kv.pt
	for li := range g.layers {
		l := &g.layers[li]
		for i := range ms.seqs {
			sp, p, slot := &ms.seqs[i], ms.len0[i], seqs[i].slot
			row, _, err := ms.kv.window(sp, li, p)
			if err != nil {
				return err
			}
			if err := ms.copy(c, row, floatAt(l.ring, (slot*win+p%win)*d), d); err != nil {
				return err
			}
			b := p / pt
			if (p+1)%pt != 0 || b >= len(sp.ckpt) || sp.ckpt[b] == kvslab.NoPage {
				continue
			}
			for _, cp := range g.comps(li) {
				kc := cp.dev
				r, wd, dim := kc.Ratio, kc.Width(), kc.Dim
				dst := ms.kv.state(sp.ckpt[b], cp.offset(ms.kv.L, li))
				if err := ms.copy(c, dst, floatAt(kc.PendingKV, slot*r*wd), r*wd); err != nil {
					return err
				}
				if err := ms.copy(c, floatAt(dst, r*wd), floatAt(kc.PendingGate, slot*r*wd), r*wd); err != nil {
					return err
				}
				if !kc.Overlap {
					continue
				}
				if err := ms.copy(c, floatAt(dst, 2*r*wd), floatAt(kc.PrevKV, slot*r*dim), r*dim); err != nil {
					return err
				}
				if err := ms.copy(c, floatAt(dst, 2*r*wd+r*dim), floatAt(kc.PrevGate, slot*r*dim), r*dim); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
