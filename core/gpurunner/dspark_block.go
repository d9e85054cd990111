package gpurunner

import (
	"fmt"
	"math"
	"slices"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// dsparkPageTokens is the page size of the block forward's packed K/V buffers.
const dsparkPageTokens = 16

// DSparkBlocks is DSpark's block forward on the device (core/dspark's Drafter.Blocks):
// the drafter's layers, final norm and lm_head over S·B slots in float32, uniform B per
// sequence, so the projections, norms, MLPs and head are single launches over all slots;
// the attention is the paged kernel with one query per slot over its sequence's context
// K/V followed by its block's K/V (no mask: every slot sees every context position and
// every slot of its block). The context K/V come from each sequence's dspark.Context (the
// CPU's Extend computes them: fc, hidden_norm, k/v projections, k_norm, RoPE) and are
// kept on the device, in pages of an arena DSparkBlocks owns: each call uploads only the
// positions a context gained (or had rewritten by a Truncate) since the last (Release
// frees a context's pages), and the block's own K/V are written after them on the device
// by slot mapping. Every launch reads its per-call values (ids, positions,
// slots, context lengths, page tables) from device arrays and its shape from S, B and the
// page-table width only, so that a graph per such shape could replay it; none is
// captured yet (every call launches its kernels). The Markov head and the confidence cut run on the host (Drafter.Propose)
// over the Hidden and Logits this returns.
type DSparkBlocks struct {
	d     *dspark.Drafter
	r     *Runner
	w     dsparkWeights
	rope  cudart.Buffer // cos then sin, float32
	ropeT ref.RopeTable

	bufs    []cudart.Buffer // grown as needed: see ensure
	sizes   []int64
	idsHost []int32
	posHost []int32
	lenHost []int32
	ptHost  []uint32
	slots   []int64

	heads *dsparkHeads // the Markov head and confidence cut (Propose)
	// HostOutputs makes Blocks bring every slot's hidden state and logits back (Block's
	// Hidden and Logits); without it they stay on the device for Propose, and the
	// Blocks' are nil.
	HostOutputs bool
	last        []*dspark.Block // the last Blocks call's, until Propose

	// The draft contexts' K/V on the device, in pages of an arena that grows as needed.
	arena      cudart.Buffer
	arenaPages int
	freePages  []uint32
	ctxs       map[*dspark.Context]*deviceContext
}

// deviceContext is one draft context's copy on the device: its pages (each holding
// dsparkPageTokens positions of every layer's K and V) and the positions uploaded.
type deviceContext struct {
	pages  []uint32
	synced int
}

// dsparkWeights are the drafter's float32 weights on the device.
type dsparkWeights struct {
	all          cudart.Buffer
	embed, norm  cudart.DevicePtr
	head         cudart.DevicePtr
	layers       []dsparkLayerWeights
	totalFloat32 int64
	// the Markov head's (markov_w1, markov_w2; gated gate_proj, rnn joint_proj) and the
	// confidence head's; 0 where the drafter has none
	w1, w2, gw, gb, jw, jb, cw, cb cudart.DevicePtr
	table                          cudart.Buffer // those eight pointers, for dspark_heads.cu
}

type dsparkLayerWeights struct {
	attnNorm, q, k, v, o, qNorm, kNorm, mlpNorm, gate, up, down cudart.DevicePtr
}

// The scratch buffers of a call, by index into DSparkBlocks.bufs.
const (
	bufIDs = iota
	bufPos
	bufX
	bufH
	bufQ
	bufK
	bufV
	bufAtt
	bufO
	bufGate
	bufUp
	bufLogits
	bufLens
	bufPages
	bufSlots
	// Propose's (dspark_heads.go)
	bufQOut
	bufChain
	bufConf
	bufN
	bufTemps
	bufThr
	bufMaxD
	bufUnif
	bufAnchors
	bufCount
)

// NewDSparkBlocks uploads the drafter's weights to the runner's device for block forwards
// at positions below maxPos. Drafters with attention biases are refused (DeepSpec's Qwen3
// drafters have none).
func (r *Runner) NewDSparkBlocks(d *dspark.Drafter, maxPos int) (*DSparkBlocks, error) {
	c := d.Config
	b := c.Base
	if len(d.W.Layers) > 0 && (d.W.Layers[0].QBias != nil || d.W.Layers[0].OBias != nil) {
		return nil, fmt.Errorf("gpurunner: DSpark drafter with attention biases: not on the device yet")
	}
	if b.NumAttentionHeads%b.NumKeyValueHeads != 0 || b.HeadDim > cuda.MaxHeadDim {
		return nil, fmt.Errorf("gpurunner: DSpark drafter of %d heads over %d kv heads, head dim %d: the paged attention kernel takes a multiple and at most %d",
			b.NumAttentionHeads, b.NumKeyValueHeads, b.HeadDim, cuda.MaxHeadDim)
	}
	rope, err := ref.NewRopeTable(b.HeadDim, maxPos, b.RopeTheta)
	if err != nil {
		return nil, fmt.Errorf("gpurunner: DSpark drafter: %w", err)
	}
	g := &DSparkBlocks{d: d, r: r, ropeT: *rope, HostOutputs: true, bufs: make([]cudart.Buffer, bufCount), sizes: make([]int64, bufCount),
		ctxs: map[*dspark.Context]*deviceContext{}}
	var host [][]float32
	add := func(v []float32) int64 {
		off := g.w.totalFloat32
		host = append(host, v)
		g.w.totalFloat32 += int64(len(v))
		return off
	}
	type layerOffs struct{ attnNorm, q, k, v, o, qNorm, kNorm, mlpNorm, gate, up, down int64 }
	embed := add(d.W.Embed)
	lo := make([]layerOffs, len(d.W.Layers))
	for i := range d.W.Layers {
		l := &d.W.Layers[i]
		lo[i] = layerOffs{add(l.AttnNorm), add(l.Q), add(l.K), add(l.V), add(l.O), add(l.QNorm), add(l.KNorm), add(l.MLPNorm), add(l.Gate), add(l.Up), add(l.Down)}
	}
	norm, head := add(d.W.Norm), add(d.W.Head)
	hw := []*[]float32{&d.W.MarkovW1, &d.W.MarkovW2, &d.W.GateW, &d.W.GateB, &d.W.JointW, &d.W.JointB, &d.W.ConfW, &d.W.ConfB}
	heads := make([]int64, len(hw))
	for i, v := range hw {
		heads[i] = -1
		if len(*v) > 0 {
			heads[i] = add(*v)
		}
	}
	if c.MarkovRank > dsparkMaxRank {
		return nil, fmt.Errorf("gpurunner: DSpark Markov rank %d: the device's head takes at most %d", c.MarkovRank, dsparkMaxRank)
	}
	err = r.dev.Do(func(cx *cudart.Ctx) error {
		var err error
		if g.w.all, err = cx.Alloc(4 * g.w.totalFloat32); err != nil {
			return err
		}
		off := int64(0)
		for _, v := range host {
			if len(v) > 0 {
				if err := cudart.Upload(cx, g.w.all.Ptr.Add(4*off), v); err != nil {
					return err
				}
			}
			off += int64(len(v))
		}
		if g.heads, err = loadDSparkHeads(cx, r.kcache); err != nil {
			return err
		}
		n := len(rope.Cos)
		if g.rope, err = cx.Alloc(int64(8 * n)); err != nil {
			return err
		}
		return firstErr(cudart.Upload(cx, g.rope.Ptr, rope.Cos), cudart.Upload(cx, g.rope.Ptr.Add(int64(4*n)), rope.Sin))
	})
	if err != nil {
		g.Close()
		return nil, fmt.Errorf("gpurunner: DSpark drafter weights (%d float32): %w", g.w.totalFloat32, err)
	}
	at := func(off int64) cudart.DevicePtr { return g.w.all.Ptr.Add(4 * off) }
	g.w.embed, g.w.norm, g.w.head = at(embed), at(norm), at(head)
	table := make([]uint64, len(heads))
	for i, dst := range []*cudart.DevicePtr{&g.w.w1, &g.w.w2, &g.w.gw, &g.w.gb, &g.w.jw, &g.w.jb, &g.w.cw, &g.w.cb} {
		if heads[i] >= 0 {
			*dst = at(heads[i])
			table[i] = uint64(*dst)
		}
	}
	err = r.dev.Do(func(cx *cudart.Ctx) error {
		var err error
		if g.w.table, err = cx.Alloc(int64(8 * len(table))); err != nil {
			return err
		}
		return cudart.Upload(cx, g.w.table.Ptr, table)
	})
	if err != nil {
		g.Close()
		return nil, fmt.Errorf("gpurunner: DSpark heads' weight table: %w", err)
	}
	for _, o := range lo {
		g.w.layers = append(g.w.layers, dsparkLayerWeights{at(o.attnNorm), at(o.q), at(o.k), at(o.v), at(o.o), at(o.qNorm), at(o.kNorm), at(o.mlpNorm), at(o.gate), at(o.up), at(o.down)})
	}
	return g, nil
}

// Close frees the drafter's device memory (UseDSpark's is freed by the runner's Close).
func (g *DSparkBlocks) Close() error {
	return g.r.dev.Do(func(c *cudart.Ctx) error { g.free(c); return nil })
}

func (g *DSparkBlocks) free(c *cudart.Ctx) {
	if g == nil {
		return
	}
	for i := range g.bufs {
		c.Free(g.bufs[i])
		g.bufs[i], g.sizes[i] = cudart.Buffer{}, 0
	}
	if g.heads != nil {
		c.UnloadModule(g.heads.mod)
		g.heads = nil
	}
	c.Free(g.w.all)
	c.Free(g.w.table)
	g.w.table = cudart.Buffer{}
	c.Free(g.rope)
	c.Free(g.arena)
	g.w.all, g.rope, g.arena = cudart.Buffer{}, cudart.Buffer{}, cudart.Buffer{}
	g.arenaPages, g.freePages, g.ctxs = 0, nil, map[*dspark.Context]*deviceContext{}
}

// Release frees the device copy of ctx (the Speculator's Released hook).
func (g *DSparkBlocks) Release(ctx *dspark.Context) {
	if dc := g.ctxs[ctx]; dc != nil {
		g.freePages = append(g.freePages, dc.pages...)
		delete(g.ctxs, ctx)
	}
}

// pageElems is the float32 of one arena page: [layers][K|V][PageTokens][kv·hd].
func (g *DSparkBlocks) pageElems() int64 {
	b := g.d.Config.Base
	return int64(len(g.w.layers)) * 2 * dsparkPageTokens * int64(b.NumKeyValueHeads*b.HeadDim)
}

// layerLayout is where layer l's keys and values sit in the arena's pages.
func (g *DSparkBlocks) layerLayout(l int) cuda.KVSlabLayout {
	pe, half := g.pageElems(), int64(dsparkPageTokens*g.d.Config.Base.NumKeyValueHeads*g.d.Config.Base.HeadDim)
	return cuda.KVSlabLayout{SlabElems: pe << cuda.PageSlotBits, PageElems: pe, KOffset: int64(l) * 2 * half, VOffset: int64(l)*2*half + half}
}

// allocPages takes n pages from the arena, growing it (a copy of its pages into one
// twice as large, at least) when too few are free.
func (g *DSparkBlocks) allocPages(c *cudart.Ctx, s *cudart.Stream, n int) ([]uint32, error) {
	if len(g.freePages) < n {
		grown := max(2*g.arenaPages, g.arenaPages+n-len(g.freePages), 64)
		if grown > cuda.PageSlotMask {
			return nil, fmt.Errorf("gpurunner: DSpark draft contexts need %d pages of %d positions, more than one slab's %d", grown, dsparkPageTokens, cuda.PageSlotMask)
		}
		buf, err := c.Alloc(4 * int64(grown) * g.pageElems())
		if err != nil {
			return nil, fmt.Errorf("gpurunner: DSpark draft contexts of %d pages: %w", grown, err)
		}
		if g.arenaPages > 0 {
			if err := firstErr(c.CopyDtoDAsync(buf.Ptr, g.arena.Ptr, 4*int64(g.arenaPages)*g.pageElems(), s), c.Sync(s)); err != nil {
				c.Free(buf)
				return nil, err
			}
			c.Free(g.arena)
		}
		for p := g.arenaPages; p < grown; p++ {
			g.freePages = append(g.freePages, uint32(p))
		}
		g.arena, g.arenaPages = buf, grown
	}
	out := slices.Clone(g.freePages[len(g.freePages)-n:])
	g.freePages = g.freePages[:len(g.freePages)-n]
	return out, nil
}

// ensure grows scratch buffer i to at least n bytes (keeping none of its contents).
func (g *DSparkBlocks) ensure(c *cudart.Ctx, i int, n int64) (cudart.DevicePtr, error) {
	if g.sizes[i] < n {
		c.Free(g.bufs[i])
		g.bufs[i], g.sizes[i] = cudart.Buffer{}, 0
		b, err := c.Alloc(n)
		if err != nil {
			return 0, fmt.Errorf("gpurunner: DSpark scratch of %d bytes: %w", n, err)
		}
		g.bufs[i], g.sizes[i] = b, n
	}
	return g.bufs[i].Ptr, nil
}

// Blocks runs the block forward of each sequence's context with its anchor: what
// dspark.Drafter.Blocks returns, computed on the device (float32 throughout; GEMM and
// attention sums in another order, so values differ from the CPU's by float32 rounding).
func (g *DSparkBlocks) Blocks(ctxs []*dspark.Context, anchors []int32) ([]*dspark.Block, error) {
	c := g.d.Config
	b := c.Base
	B, S := c.BlockSize, len(ctxs)
	if len(anchors) != S || S == 0 {
		return nil, fmt.Errorf("gpurunner: DSpark blocks: %d contexts and %d anchors", S, len(anchors))
	}
	kvd := b.NumKeyValueHeads * b.HeadDim
	R, PT := S*B, dsparkPageTokens
	maxPages := 0
	for i, ctx := range ctxs {
		n := ctx.Len()
		if err := g.check(n, anchors[i]); err != nil {
			return nil, err
		}
		maxPages = max(maxPages, (n+B+PT-1)/PT)
	}
	g.grow(R, maxPages)
	hidden, logits := g.outputs(R)
	r := g.r
	err := r.dev.Do(func(cx *cudart.Ctx) error {
		s := r.stream
		// Every context's pages, for its positions and its block's (the arena may grow).
		dcs := make([]*deviceContext, S)
		for i, ctx := range ctxs {
			dc := g.ctxs[ctx]
			if dc == nil {
				dc = &deviceContext{}
				g.ctxs[ctx] = dc
			}
			if need := (ctx.Len() + B + PT - 1) / PT; len(dc.pages) < need {
				pages, err := g.allocPages(cx, s, need-len(dc.pages))
				if err != nil {
					return err
				}
				dc.pages = append(dc.pages, pages...)
			}
			dcs[i] = dc
		}
		// The positions each context gained or had rewritten since its last upload.
		pe := g.pageElems()
		for i, ctx := range ctxs {
			dc, n := dcs[i], ctx.Len()
			for j := min(dc.synced, ctx.SyncedBelow()); j < n; {
				page, row := dc.pages[j/PT], j%PT
				end := min(n, (j/PT+1)*PT) // this page's run of positions
				for l := range g.w.layers {
					lay := g.layerLayout(l)
					at := g.arena.Ptr.Add(4 * (int64(page)*pe + int64(row*kvd)))
					k, v := ctx.K[l][j*kvd:end*kvd], ctx.V[l][j*kvd:end*kvd]
					if err := firstErr(cudart.UploadAsync(cx, at.Add(4*lay.KOffset), k, s), cudart.UploadAsync(cx, at.Add(4*lay.VOffset), v, s)); err != nil {
						return err
					}
				}
				j = end
			}
			dc.synced = n
		}
		for i, ctx := range ctxs {
			n, dc := ctx.Len(), dcs[i]
			g.stage(i, n, anchors[i], dc.pages, len(dc.pages), maxPages, PT)
		}
		return g.run(cx, S, maxPages, blockCache{g.arena.Ptr, g.layerLayout, PT}, hidden, logits)
	})
	if err != nil {
		return nil, fmt.Errorf("gpurunner: DSpark blocks: %w", err)
	}
	lens := make([]int, S)
	for i, ctx := range ctxs {
		ctx.MarkSynced()
		lens[i] = ctx.Len()
	}
	return g.blocks(lens, anchors, hidden, logits), nil
}

// check refuses a block at context length n past the drafter's positions or anchored at
// a token outside its vocabulary.
func (g *DSparkBlocks) check(n int, anchor int32) error {
	c := g.d.Config
	if B := c.BlockSize; n+B > g.ropeT.MaxPos {
		return fmt.Errorf("gpurunner: DSpark block at positions %d..%d past the drafter's %d", n, n+B-1, g.ropeT.MaxPos)
	}
	if V := c.Base.VocabSize; anchor < 0 || int(anchor) >= V {
		return fmt.Errorf("gpurunner: DSpark anchor token %d outside the vocabulary of %d", anchor, V)
	}
	return nil
}

// grow sizes the host staging for R slots of maxPages pages each (reused across calls;
// stage writes every element).
func (g *DSparkBlocks) grow(R, maxPages int) {
	g.idsHost, g.posHost, g.lenHost = slices.Grow(g.idsHost[:0], R)[:R], slices.Grow(g.posHost[:0], R)[:R], slices.Grow(g.lenHost[:0], R)[:R]
	g.slots, g.ptHost = slices.Grow(g.slots[:0], R)[:R], slices.Grow(g.ptHost[:0], R*maxPages)[:R*maxPages]
}

// stage writes the host staging of sequence i's block: context length n, anchor, and the
// first np of pages (page ids of the cache the forward reads, pageTokens positions each)
// holding positions [0, n+B), the block's own at n…n+B−1 by slot.
func (g *DSparkBlocks) stage(i, n int, anchor int32, pages []uint32, np, maxPages, pageTokens int) {
	c := g.d.Config
	B := c.BlockSize
	for j := range B {
		r := i*B + j
		g.idsHost[r], g.posHost[r], g.lenHost[r] = c.MaskTokenID, int32(n+j), int32(n+B)
		g.slots[r] = int64(pages[(n+j)/pageTokens])*int64(pageTokens) + int64((n+j)%pageTokens)
		for p := range maxPages {
			g.ptHost[r*maxPages+p] = pages[min(p, np-1)]
		}
	}
	g.idsHost[i*B] = anchor
}

// blockCache is the cache a block forward's attention reads: the context K/V and the
// block's own, in pages of pageTokens positions at ptr, layer l's laid out as layout(l).
type blockCache struct {
	ptr        cudart.DevicePtr
	layout     func(l int) cuda.KVSlabLayout
	pageTokens int
}

// run uploads the staged inputs of S blocks (stage), runs their forward over cache and
// brings the hidden states and logits back (nil: they stay on the device). It runs
// inside Do.
func (g *DSparkBlocks) run(cx *cudart.Ctx, S, maxPages int, cache blockCache, hidden, logits []float32) error {
	b := g.d.Config.Base
	hd, qd, kvd, inter, V := b.HiddenSize, b.NumAttentionHeads*b.HeadDim, b.NumKeyValueHeads*b.HeadDim, b.IntermediateSize, b.VocabSize
	R, s := S*g.d.Config.BlockSize, g.r.stream
	var p [bufCount]cudart.DevicePtr
	for i, n := range [bufCount]int64{
		bufIDs: 4 * int64(R), bufPos: 4 * int64(R), bufX: 4 * int64(R*hd), bufH: 4 * int64(R*hd),
		bufQ: 4 * int64(R*qd), bufK: 4 * int64(R*kvd), bufV: 4 * int64(R*kvd), bufAtt: 4 * int64(R*qd),
		bufO: 4 * int64(R*hd), bufGate: 4 * int64(R*inter), bufUp: 4 * int64(R*inter), bufLogits: 4 * int64(R*V),
		bufLens: 4 * int64(R), bufPages: 4 * int64(R*maxPages), bufSlots: 8 * int64(R),
	} {
		var err error
		if p[i], err = g.ensure(cx, i, n); err != nil {
			return err
		}
	}
	err := firstErr(
		cudart.UploadAsync(cx, p[bufIDs], g.idsHost, s), cudart.UploadAsync(cx, p[bufPos], g.posHost, s),
		cudart.UploadAsync(cx, p[bufLens], g.lenHost, s), cudart.UploadAsync(cx, p[bufPages], g.ptHost, s),
		cudart.UploadAsync(cx, p[bufSlots], g.slots, s),
	)
	if err != nil {
		return err
	}
	if err := g.forward(cx, s, p, R, maxPages, cache); err != nil {
		return err
	}
	if hidden != nil {
		err = firstErr(cudart.DownloadAsync(cx, hidden, p[bufH], s), cudart.DownloadAsync(cx, logits, p[bufLogits], s))
		if err != nil {
			return err
		}
	}
	return cx.Sync(s)
}

// outputs returns the host buffers of R slots' hidden states and logits, nil without
// HostOutputs.
func (g *DSparkBlocks) outputs(R int) (hidden, logits []float32) {
	if !g.HostOutputs {
		return nil, nil
	}
	b := g.d.Config.Base
	return make([]float32, R*b.HiddenSize), make([]float32, R*b.VocabSize)
}

// blocks wraps the hidden states and logits of S blocks at context lengths lens (nil
// without HostOutputs) and keeps them as the last call's, for Propose.
func (g *DSparkBlocks) blocks(lens []int, anchors []int32, hidden, logits []float32) []*dspark.Block {
	b := g.d.Config.Base
	B, hd, V := g.d.Config.BlockSize, b.HiddenSize, b.VocabSize
	out := make([]*dspark.Block, len(lens))
	for i, n := range lens {
		out[i] = &dspark.Block{Anchor: anchors[i], Position: n}
		if hidden != nil {
			out[i].Hidden, out[i].Logits = hidden[i*B*hd:(i+1)*B*hd:(i+1)*B*hd], logits[i*B*V:(i+1)*B*V:(i+1)*B*V]
		}
	}
	g.last = out
	return out
}

// forward launches the block forward of R slots over the uploaded inputs; p holds the
// scratch. Nothing in it depends on the call's contexts but through device arrays.
//
//	x, h, o: [R, hidden]   q, att: [R, heads·hd]   k, v: [R, kv·hd]   gate, up: [R, inter]
//	the arena's pages: [layers][K|V][PageTokens][kv·hd] each (layerLayout)
func (g *DSparkBlocks) forward(c *cudart.Ctx, s *cudart.Stream, p [bufCount]cudart.DevicePtr, R int, maxPages int, bc blockCache) error {
	b := g.d.Config.Base
	k, blas := g.r.kern, g.r.blas
	hd, dd, nh, nkv, inter, V := b.HiddenSize, b.HeadDim, b.NumAttentionHeads, b.NumKeyValueHeads, b.IntermediateSize, b.VocabSize
	qd, kvd := nh*dd, nkv*dd
	PT := bc.pageTokens
	eps := float32(b.RMSNormEps)
	gemm := func(out, x, w cudart.DevicePtr, rows, in, n int) error {
		return blas.MatMulT(c, s, cudart.F32, out, x, w, rows, in, n)
	}
	rope := cuda.Rope{Cos: g.rope.Ptr, Sin: g.rope.Ptr.Add(int64(len(g.ropeT.Cos)) * 4), Dim: g.ropeT.Dim, MaxPos: g.ropeT.MaxPos}
	x, h, o := p[bufX], p[bufH], p[bufO]
	q, kk, v, att := p[bufQ], p[bufK], p[bufV], p[bufAtt]
	if err := k.Embedding(c, s, x, g.w.embed, p[bufIDs], R, hd, V); err != nil {
		return fmt.Errorf("embedding: %w", err)
	}
	for l, lw := range g.w.layers {
		var err error
		if l == 0 {
			err = k.RMSNorm(c, s, h, x, lw.attnNorm, R, hd, eps)
		} else { // x += the last MLP's output; h = attn_norm(x)
			err = k.AddRMSNorm(c, s, cuda.F32, h, x, o, lw.attnNorm, R, hd, eps)
		}
		cache, layout := bc.ptr, bc.layout(l)
		err = firstErr(err,
			gemm(q, h, lw.q, R, hd, qd), gemm(kk, h, lw.k, R, hd, kvd), gemm(v, h, lw.v, R, hd, kvd),
			k.RMSNorm(c, s, q, q, lw.qNorm, R*nh, dd, eps), k.RMSNorm(c, s, kk, kk, lw.kNorm, R*nkv, dd, eps),
		)
		if err == nil { // rotary on q and k; the block's K/V into its pages after the context's
			err = k.RopeKV(c, s, cuda.RopeKV{
				Q: q, K: kk, V: v, Cache: cache, Positions: p[bufPos], Slots: p[bufSlots], Rope: rope, Layout: layout,
				DType: cuda.F32, Tokens: R, Heads: nh, KVHeads: nkv, HeadDim: dd, QStride: qd, KVStride: kvd, PageTokens: PT,
			})
		}
		if err == nil {
			err = k.PagedAttention(c, s, cuda.PagedAttention{
				Out: att, Q: q, KCache: cache, VCache: cache, PageTable: p[bufPages], CtxLens: p[bufLens], Layout: layout,
				Batch: R, NQ: 1, Heads: nh, KVHeads: nkv, HeadDim: dd, PageTokens: PT, MaxPages: maxPages,
				Scale: float32(1 / math.Sqrt(float64(dd))),
			})
		}
		err = firstErr(err,
			gemm(o, att, lw.o, R, qd, hd),
			k.AddRMSNorm(c, s, cuda.F32, h, x, o, lw.mlpNorm, R, hd, eps),
			gemm(p[bufGate], h, lw.gate, R, hd, inter), gemm(p[bufUp], h, lw.up, R, hd, inter),
			k.SiLUMulSplit(c, s, p[bufGate], p[bufGate], p[bufUp], R*inter),
			gemm(o, p[bufGate], lw.down, R, inter, hd),
		)
		if err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
	}
	// h = norm(x + the last MLP's output): the block's hidden states; then the head.
	err := firstErr(k.AddRMSNorm(c, s, cuda.F32, h, x, o, g.w.norm, R, hd, eps), gemm(p[bufLogits], h, g.w.head, R, hd, V))
	if err != nil {
		return fmt.Errorf("head: %w", err)
	}
	return nil
}
