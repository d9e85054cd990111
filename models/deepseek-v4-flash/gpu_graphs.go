package deepseekv4flash

import (
	"fmt"
	"io"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
)

// gpuGraphs are the CUDA graphs of decode steps, one per batch bucket
// (gpurunner.DecodeBuckets), as core/gpurunner's dense path keeps them: a decode step of
// b sequences (one token and one logits row each) runs padded to the smallest bucket of at
// least b, the padding rows in the spare slot (index slots, allocated beside the real
// ones: it holds only their writes, at position 0, and no real sequence reads it). The
// first step of a bucket runs eagerly (every cuBLASLt plan made and every module loaded
// outside the capture) and is then captured; the later ones replay it. Every per-step
// value the graph reads (tokens, positions, slots, row offsets, the logits rows) is
// uploaded to fixed buffers before the launch, and the launches depend only on the
// bucket. Prefill steps, steps with drafts (the MTP runner) and steps naming other logits
// rows run eagerly.
type gpuGraphs struct {
	cache   *cudart.GraphCache
	buckets []int
	failed  map[cudart.GraphKey]bool
	log     io.Writer
}

// useGraphs turns decode graphs on (log: a capture that failed, its shape then eager) or
// off (nil log and off).
func (g *gpuModel) useGraphs(c *cudart.Ctx, on bool, log io.Writer) error {
	if g.graphs != nil {
		g.graphs.cache.Close(c)
		g.graphs = nil
	}
	if !on {
		return nil
	}
	b := gpurunner.DecodeBuckets(min(g.slots, g.maxRows))
	cache, err := cudart.NewGraphCache(len(b))
	if err != nil {
		return err
	}
	if log == nil {
		log = io.Discard
	}
	g.graphs = &gpuGraphs{cache: cache, buckets: b, failed: map[cudart.GraphKey]bool{}, log: log}
	return nil
}

// decodeBucket returns the bucket a step runs in as a graph, 0 for an eager one.
func (g *gpuModel) decodeBucket(seqs []*gpuSeq, tokens [][]int32, rows []int32) int {
	if g.graphs == nil || g.mtp != nil || len(rows) != len(seqs) {
		return 0
	}
	for i := range seqs {
		if len(tokens[i]) != 1 || rows[i] != int32(i) {
			return 0
		}
	}
	for _, b := range g.graphs.buckets {
		if b >= len(seqs) {
			return b
		}
	}
	return 0
}

// runGraph runs step, the launches of a decode step of bucket sequences: the bucket's
// graph when it was captured, else eagerly and then captured.
func (g *gpuModel) runGraph(c *cudart.Ctx, bucket int, step func() error) error {
	gr := g.graphs
	key := cudart.GraphKey{Kind: cudart.GraphDecode, Bucket: bucket, Variant: 1}
	if !gr.failed[key] {
		ok, err := gr.cache.Replay(c, g.s, key)
		if err != nil {
			return err
		}
		if ok {
			g.Stats.Graph++
			return nil
		}
	}
	g.Stats.Eager++
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

// decoded writes what a graph step (one token per sequence) left in the device slots and
// the per-layer hook (mirrorStep.layer) did not see: each layer's sliding-window row of the
// position fed, from the ring, and, where that position ends a block, the checkpoint of
// every compressor: its buffers right after it, which are the slot's now.
func (ms *mirrorStep) decoded(c *cudart.Ctx, g *gpuModel, seqs []*gpuSeq) error {
	cfg := g.m.Config
	d, win, pt := cfg.HeadDim, cfg.SlidingWindow, ms.kv.pt
	for li := range g.layers {
		l := &g.layers[li]
		for i, st := range ms.states {
			p, slot := ms.len0[i], seqs[i].slot
			if err := cudart.Download(c, st.Layers[li].Window.Row(p), l.ring+cudart.DevicePtr(4*(slot*win+p%win)*d)); err != nil {
				return err
			}
			b := p / pt
			if (p+1)%pt != 0 || b >= len(ms.ckpt[i]) || ms.ckpt[i][b] == kvslab.NoPage {
				continue
			}
			for _, cp := range g.comps(li) {
				kc := cp.dev
				r, wd, dim := kc.Ratio, kc.Width(), kc.Dim
				o := int(ms.kv.pool.PageOffset(ms.kv.L.state, ms.ckpt[i][b])/4) + cp.offset(ms.kv.L, li)
				dst := ms.kv.mem[o:]
				parts := []struct {
					src cudart.DevicePtr
					n   int
				}{{kc.PendingKV + cudart.DevicePtr(4*slot*r*wd), r * wd}, {kc.PendingGate + cudart.DevicePtr(4*slot*r*wd), r * wd}}
				if kc.Overlap {
					parts = append(parts, struct {
						src cudart.DevicePtr
						n   int
					}{kc.PrevKV + cudart.DevicePtr(4*slot*r*dim), r * dim}, struct {
						src cudart.DevicePtr
						n   int
					}{kc.PrevGate + cudart.DevicePtr(4*slot*r*dim), r * dim})
				}
				at := 0
				for _, pp := range parts {
					if err := cudart.Download(c, dst[at:at+pp.n], pp.src); err != nil {
						return err
					}
					at += pp.n
				}
			}
		}
	}
	return nil
}
