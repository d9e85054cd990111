package gpurunner

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/weights"
)

// dsparkTap is DSpark's feature tap on the device: the forward copies the residual
// stream of every row at each tapped layer into feats, and the rows the Speculator asks
// for come back through host.
//
//	feats, host: [len(layers)][maxTokens][hidden] bf16
type dsparkTap struct {
	layers    []int // the drafter's target_layer_ids, in its order
	maxTokens int   // the workspace's tokens per step (graph buckets included)
	hidden    int
	feats     cudart.Buffer
	host      *cudart.HostBuffer
	spec      *dspark.Speculator
	blocks    *DSparkBlocks // the block forward on the device
}

func (d *dsparkTap) tapBytes() int64 { return int64(d.maxTokens) * int64(d.hidden) * 2 }

// capture copies the residual stream of tokens rows ([tokens, hidden] bf16) into the
// buffers of the taps on layer. All rows are copied, so a captured graph does the same
// copy whichever rows a later step wants.
func (d *dsparkTap) capture(c *cudart.Ctx, s *cudart.Stream, layer int, residual cudart.DevicePtr, tokens int) error {
	for j, l := range d.layers {
		if l != layer {
			continue
		}
		if err := c.CopyDtoDAsync(d.feats.Ptr.Add(int64(j)*d.tapBytes()), residual, int64(tokens)*int64(d.hidden)*2, s); err != nil {
			return fmt.Errorf("dspark feature tap of layer %d: %w", layer, err)
		}
	}
	return nil
}

// tapAt hands the residual stream after layer (−1: the embeddings) to the feature tap,
// if the model has one.
func (m *Dense) tapAt(c *cudart.Ctx, s *cudart.Stream, layer int, residual cudart.DevicePtr, tokens int) error {
	if m.tap == nil {
		return nil
	}
	return m.tap(c, s, layer, residual, tokens)
}

// UseDSpark makes the runner draft with a DSpark drafter (core/dspark): every step's
// forward copies the residual stream at the drafter's tapped layers on the device, the
// rows of the drafting sequences come back to the host as the drafter's features, the
// CPU computes their draft context K/V (fc, hidden_norm, k/v projections, k_norm, RoPE),
// and the block forward runs on the device (DSparkBlocks), then the Markov head and the
// confidence cut (DSparkBlocks.Propose, dspark_heads.cu): of a block only its chain,
// confidences, cut and, for sampled rows, its drafts' distributions come back.
//
// Where the runner was opened with Options.DSpark, the pool holds the drafter's cache
// group and the draft context lives there, in device pages (dsparkPool): each fed row's
// K/V are written at its slots of that group, and the block's attention reads them
// through the sequence's page table, so the engine's rollback, copy-on-write and prefix
// cache cover it, and a request that starts from a prefix hit or resumes after a
// preemption is drafted from its first step. Otherwise the draft context is kept per
// request on the host (an unbound Speculator: such a request is not drafted), its K/V
// mirrored on the device by DSparkBlocks, which uploads the new positions each step.
// Every step with DSpark is sampled on the host by core/cpurunner, which
// verifies the drafts exactly (greedy by comparison, sampled rows by rejection
// sampling). maxDrafts ≤ 0 drafts whole blocks; threshold is the confidence cut (0:
// none). Call it before the first step, on a one-GPU runner. A drafter built for another
// vocabulary, hidden size or depth is refused by name.
func (r *Runner) UseDSpark(d *dspark.Drafter, maxDrafts int, threshold float32) (*dspark.Speculator, error) {
	cfg := r.model.Config
	if err := d.Config.CheckTarget(cfg.Vocab, cfg.Hidden, cfg.Layers); err != nil {
		return nil, fmt.Errorf("gpurunner: %s: %w", cfg.Name, err)
	}
	switch {
	case r.dspark != nil:
		return nil, fmt.Errorf("gpurunner: UseDSpark called twice")
	case r.Stats.Graph+r.Stats.Eager > 0:
		return nil, fmt.Errorf("gpurunner: UseDSpark after the runner's first step: its graphs were captured without the feature tap")
	}
	t := &dsparkTap{layers: slices.Clone(d.Config.TargetLayerIDs), maxTokens: r.model.ws.PlanLayout.Dims.Tokens, hidden: cfg.Hidden}
	n := int64(len(t.layers)) * t.tapBytes()
	err := r.dev.Do(func(c *cudart.Ctx) error {
		var err error
		if t.feats, err = c.Alloc(n); err != nil {
			return err
		}
		t.host, err = c.AllocHostOn(n, r.NUMA.Node)
		return err
	})
	if err != nil {
		r.dev.Do(func(c *cudart.Ctx) error { t.free(c); return nil })
		return nil, fmt.Errorf("gpurunner: DSpark feature buffers of %d bytes: %w", n, err)
	}
	if t.blocks, err = r.NewDSparkBlocks(d, r.info.MaxContext+d.Config.BlockSize); err != nil {
		r.dev.Do(func(c *cudart.Ctx) error { t.free(c); return nil })
		return nil, err
	}
	t.spec = dspark.NewSpeculator(gpuTapForward{r}, d, maxDrafts, threshold)
	t.spec.BlockForward, t.spec.Released = t.blocks.Blocks, t.blocks.Release
	// the Markov head and the confidence cut on the device: the blocks' hidden states and
	// logits stay there
	t.blocks.HostOutputs, t.spec.ProposeBlocks = false, t.blocks.Propose
	if g := len(r.pool.Groups()) - 1; g > 0 && r.pool.Groups()[g].Name == dspark.CacheGroupName {
		scratch := int((r.arena.Size() - int64(r.pool.Slabs())*r.pool.SlabBytes()) / r.pool.SlabBytes())
		dp, err := r.newDSparkPool(t.blocks, g, scratch)
		if err == nil {
			err = t.spec.BindDevice(r.pool, g, dp)
		}
		if err != nil {
			r.dev.Do(func(c *cudart.Ctx) error { t.free(c); return nil })
			return nil, fmt.Errorf("gpurunner: %w", err)
		}
	}
	r.dspark = t
	r.model.tap = t.capture
	r.cpu = cpurunner.New(r.info, t.spec)
	r.info.MaxDrafts = t.spec.MaxDrafts()
	return t.spec, nil
}

func (d *dsparkTap) free(c *cudart.Ctx) {
	if d == nil {
		return
	}
	d.blocks.free(c)
	c.Free(d.feats)
	d.feats = cudart.Buffer{}
	if d.host != nil {
		c.FreeHost(d.host)
		d.host = nil
	}
}

// gpuTapForward is the runner's step as DSpark's target forward (dspark.TapForwarder):
// the logits rows, and the tapped features of the rows the tap asks for.
type gpuTapForward struct{ r *Runner }

var _ dspark.TapForwarder = gpuTapForward{}

func (f gpuTapForward) Forward(plan *engine.BatchPlan, logits []float32) error {
	return f.ForwardTap(plan, logits, nil)
}

// ForwardTap runs plan's step on the device, then copies its logits rows into logits and
// the features of tap.Rows into tap.Features (bf16 on the device, widened to float32).
func (f gpuTapForward) ForwardTap(plan *engine.BatchPlan, logits []float32, tap *dspark.FeatureTap) error {
	r, d := f.r, f.r.dspark
	tokens := PlanDims(plan).Tokens
	want := tap != nil && len(tap.Rows) > 0
	if want {
		if !slices.Equal(tap.LayerIDs, d.layers) || tap.Hidden != d.hidden {
			return fmt.Errorf("gpurunner: feature tap of layers %v (hidden %d); the device taps %v (hidden %d)", tap.LayerIDs, tap.Hidden, d.layers, d.hidden)
		}
		for _, row := range tap.Rows {
			if row < 0 || int(row) >= tokens {
				return fmt.Errorf("gpurunner: feature tap row %d outside the step's %d rows", row, tokens)
			}
		}
		if w := len(d.layers) * d.hidden; len(tap.Features) != len(tap.Rows)*w {
			return fmt.Errorf("gpurunner: feature tap holds %d values, want %d rows × %d", len(tap.Features), len(tap.Rows), w)
		}
	}
	err := r.step(plan, false, func(c *cudart.Ctx) error {
		if n := len(logits); n > 0 {
			err := c.CopyDtoHAsync(unsafe.Slice((*byte)(unsafe.Pointer(&logits[0])), 4*n), r.model.work.Ptr.Add(r.model.ws.Logits.Off), r.stream)
			if err != nil {
				return err
			}
		}
		if !want {
			return nil
		}
		// only the span of rows the tap asks for comes back (a prefill's every row, a
		// verification's few at its end)
		lo, hi := int64(slices.Min(tap.Rows)), int64(slices.Max(tap.Rows))+1
		rowBytes := int64(d.hidden) * 2
		for j := range d.layers {
			off := int64(j)*d.tapBytes() + lo*rowBytes
			if err := c.CopyDtoHAsync(d.host.Bytes[off:off+(hi-lo)*rowBytes], d.feats.Ptr.Add(off), r.stream); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil || !want {
		return err
	}
	h, w := d.hidden, len(d.layers)*d.hidden
	for j := range d.layers {
		base := int64(j) * d.tapBytes()
		for i, row := range tap.Rows {
			src := d.host.Bytes[base+int64(row)*int64(h)*2 : base+int64(row+1)*int64(h)*2]
			if err := weights.DecodeFloat32(tap.Features[i*w+j*h:i*w+(j+1)*h], src, weights.BF16); err != nil {
				return err
			}
		}
	}
	return nil
}
