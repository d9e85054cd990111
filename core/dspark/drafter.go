package dspark

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/weights"
)

// FeatureTap asks a target forward for the hidden states of some of its rows at the
// drafter's tapped layers. The forward calls Capture after its embeddings (layer −1) and
// after each decoder layer; a nil tap captures nothing, so a forward without DSpark pays
// one nil check per layer.
type FeatureTap struct {
	LayerIDs []int   // the drafter's target_layer_ids
	Rows     []int32 // rows of the target's batch whose features are wanted
	Hidden   int     // the target's hidden size
	// Features is written by Capture: [len(Rows), len(LayerIDs)·Hidden], row r holding the
	// taps' hidden states in LayerIDs order (DeepSpec's extract_context_feature).
	Features []float32
}

// NewFeatureTap returns a tap for rows of a target with the given hidden size.
func NewFeatureTap(layerIDs []int, rows []int32, hidden int) *FeatureTap {
	return &FeatureTap{LayerIDs: layerIDs, Rows: rows, Hidden: hidden, Features: make([]float32, len(rows)*len(layerIDs)*hidden)}
}

// Capture copies the tapped rows of x ([tokens, Hidden], the residual stream after the
// target's layer `layer`, −1 for the embeddings) into Features if layer is tapped.
func (t *FeatureTap) Capture(layer int, x []float32) error {
	if t == nil {
		return nil
	}
	h, w := t.Hidden, len(t.LayerIDs)*t.Hidden
	if len(t.Features) != len(t.Rows)*w {
		return fmt.Errorf("dspark: feature tap holds %d values, want %d rows × %d", len(t.Features), len(t.Rows), w)
	}
	for j, l := range t.LayerIDs {
		if l != layer {
			continue
		}
		for i, r := range t.Rows {
			if r < 0 || int(r+1)*h > len(x) {
				return fmt.Errorf("dspark: feature tap row %d outside the target's %d rows", r, len(x)/h)
			}
			copy(t.Features[i*w+j*h:i*w+(j+1)*h], x[int(r)*h:int(r+1)*h])
		}
	}
	return nil
}

// Drafter is a loaded DSpark drafter with its rotary table and scratch buffers. Not safe
// for concurrent use.
type Drafter struct {
	Config *Config
	W      *Weights
	rope   *ref.RopeTable

	feat, x, h, q, k, v, att, o, gate, up, scores []float32
	ids                                           []int32
	pos                                           []int32
}

// New prepares a drafter for positions below maxContext.
func New(c *Config, w *Weights, maxContext int) (*Drafter, error) {
	rope, err := ref.NewRopeTable(c.Base.HeadDim, maxContext, c.Base.RopeTheta)
	if err != nil {
		return nil, fmt.Errorf("dspark: %w", err)
	}
	return &Drafter{Config: c, W: w, rope: rope}, nil
}

// Load reads a drafter directory as DeepSpec's save_pretrained writes it (config.json and
// safetensors) and prepares it for positions below maxContext (0: the config's
// max_position_embeddings).
func Load(dir string, maxContext int) (*Drafter, error) {
	c, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	ck, err := weights.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("dspark: %w", err)
	}
	defer ck.Close()
	w, err := LoadWeights(c, ck)
	if err != nil {
		return nil, err
	}
	if maxContext <= 0 {
		maxContext = c.Base.MaxPositionEmbeddings
	}
	return New(c, w, maxContext)
}

// Context is one sequence's draft context cache: for every draft layer the keys (k_norm
// and RoPE applied) and values of the context features at positions [0, Len). Rows are
// [KVHeads·HeadDim], the layout of a ref.PagedKV row.
type Context struct {
	K, V [][]float32 // per layer: [Len, KVHeads·HeadDim]
	n    int
	cut  int // the lowest length a Truncate left since MarkSynced; -1: none
}

// NewContext returns an empty draft context.
func (d *Drafter) NewContext() *Context {
	l := d.Config.Base.NumHiddenLayers
	return &Context{K: make([][]float32, l), V: make([][]float32, l), cut: -1}
}

// SyncedBelow is where a copy of the context taken at the last MarkSynced (a device's)
// may differ from it: the lowest length a Truncate left since then, or Len() when there
// was none. Rows below it are unchanged; rows from it on were dropped or appended.
func (x *Context) SyncedBelow() int {
	if x.cut >= 0 {
		return min(x.cut, x.n)
	}
	return x.n
}

// MarkSynced records that a copy of the context now holds all of it.
func (x *Context) MarkSynced() { x.cut = -1 }

// Len is the number of context positions cached.
func (x *Context) Len() int { return x.n }

// Truncate drops the positions from n on (a prefix hit shorter than the cache, a rollback).
func (x *Context) Truncate(n int) error {
	if n < 0 || n > x.n {
		return fmt.Errorf("dspark: truncate a draft context of %d positions to %d", x.n, n)
	}
	if x.cut < 0 || n < x.cut {
		x.cut = n
	}
	if x.n == 0 {
		return nil
	}
	row := len(x.K[0]) / x.n
	for l := range x.K {
		x.K[l], x.V[l] = x.K[l][:n*row], x.V[l][:n*row]
	}
	x.n = n
	return nil
}

func grow(b *[]float32, n int) []float32 {
	if cap(*b) < n {
		*b = make([]float32, n)
	}
	*b = (*b)[:n]
	return *b
}

// Extend appends n rows of target features ([n, FeatureDim], raw: the target's hidden
// states at the taps) to the context at positions Len()..Len()+n−1: fc, hidden_norm, then
// every layer's k_proj (+ k_norm and RoPE) and v_proj (Qwen3DSparkAttention's k_ctx/v_ctx).
func (d *Drafter) Extend(ctx *Context, features []float32, n int) error {
	c := d.Config
	if n == 0 {
		return nil
	}
	if len(features) != n*c.FeatureDim() {
		return fmt.Errorf("dspark: extend: %d feature values, want %d rows × %d", len(features), n, c.FeatureDim())
	}
	if ctx.n+n > d.rope.MaxPos {
		return fmt.Errorf("dspark: extend: context of %d positions past the drafter's %d", ctx.n+n, d.rope.MaxPos)
	}
	err := d.contextKV(features, d.positions(ctx.n, n), n, func(l int, k, v []float32) error {
		ctx.K[l] = append(ctx.K[l], k...)
		ctx.V[l] = append(ctx.V[l], v...)
		return nil
	})
	if err != nil {
		return fmt.Errorf("dspark: extend: %w", err)
	}
	ctx.n += n
	return nil
}

// contextKV computes the context keys (k_norm and RoPE at pos applied) and values of n
// rows of features and hands them to emit layer by layer ([n, KVHeads·HeadDim] each,
// scratch reused for the next layer).
func (d *Drafter) contextKV(features []float32, pos []int32, n int, emit func(l int, k, v []float32) error) error {
	c := d.Config
	b := c.Base
	hd, dd, nkv := b.HiddenSize, b.HeadDim, b.NumKeyValueHeads
	kvd := nkv * dd
	eps := float32(b.RMSNormEps)
	f := grow(&d.feat, n*hd)
	k, v := grow(&d.k, n*kvd), grow(&d.v, n*kvd)
	if err := firstErr(ref.MatMulT(f, features, d.W.FC, n, c.FeatureDim(), hd), ref.RMSNorm(f, f, d.W.HiddenNorm, n, hd, eps)); err != nil {
		return err
	}
	for l := range d.W.Layers {
		lw := &d.W.Layers[l]
		err := firstErr(ref.MatMulT(k, f, lw.K, n, hd, kvd), ref.MatMulT(v, f, lw.V, n, hd, kvd))
		if err == nil {
			addBias(k, lw.KBias, n)
			addBias(v, lw.VBias, n)
			err = firstErr(ref.RMSNorm(k, k, lw.KNorm, n*nkv, dd, eps), d.rope.RoPENeoX(k, pos, n, nkv, dd))
		}
		if err == nil {
			err = emit(l, k, v)
		}
		if err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
	}
	return nil
}

func (d *Drafter) positions(start, n int) []int32 {
	if cap(d.pos) < n {
		d.pos = make([]int32, n)
	}
	d.pos = d.pos[:n]
	for i := range d.pos {
		d.pos[i] = int32(start + i)
	}
	return d.pos
}

// Block is one block forward's output for one sequence.
type Block struct {
	Anchor   int32     // slot 0's token, the last committed token
	Position int       // the anchor's position (the context's length)
	Hidden   []float32 // [B, hidden]: the final norm's output; slot i predicts position Position+i+1
	Logits   []float32 // [B, vocab]: lm_head over Hidden, before the Markov bias
}

// Block runs the drafter over B slots at positions ctx.Len()..ctx.Len()+B−1: slot 0 the
// anchor, the others mask_token_id. Each slot attends to every context position and to
// every slot of the block; the block's own K/V are scratch and do not enter ctx.
func (d *Drafter) Block(ctx *Context, anchor int32) (*Block, error) {
	bs, err := d.Blocks([]*Context{ctx}, []int32{anchor})
	if err != nil {
		return nil, err
	}
	return bs[0], nil
}

// Blocks is Block for several sequences at once: every sequence has B slots, so the
// projections, MLPs and lm_head are GEMMs over S·B rows (the uniform shape a device graph
// would capture); only the attention is per sequence, over its own context. A row's
// values can differ from Block's by float32 rounding (see ref.GEMMBackend), so a sampled
// draft can, with a probability of that order, depend on the batch; the output's
// distribution does not, as verification is exact for any q.
func (d *Drafter) Blocks(ctxs []*Context, anchors []int32) ([]*Block, error) {
	c := d.Config
	b := c.Base
	B, S := c.BlockSize, len(ctxs)
	hd, dd, nh, nkv, inter := b.HiddenSize, b.HeadDim, b.NumAttentionHeads, b.NumKeyValueHeads, b.IntermediateSize
	qd, kvd := nh*dd, nkv*dd
	eps := float32(b.RMSNormEps)
	if len(anchors) != S || S == 0 {
		return nil, fmt.Errorf("dspark: %d contexts and %d anchors", S, len(anchors))
	}
	R := S * B
	if cap(d.ids) < R {
		d.ids = make([]int32, R)
	}
	ids, pos := d.ids[:R], d.positions(0, R)
	for i, ctx := range ctxs {
		P := ctx.n
		if P+B > d.rope.MaxPos {
			return nil, fmt.Errorf("dspark: block at positions %d..%d past the drafter's %d", P, P+B-1, d.rope.MaxPos)
		}
		if a := anchors[i]; a < 0 || int(a) >= b.VocabSize {
			return nil, fmt.Errorf("dspark: anchor token %d outside the vocabulary of %d", a, b.VocabSize)
		}
		for j := range B {
			ids[i*B+j], pos[i*B+j] = c.MaskTokenID, int32(P+j)
		}
		ids[i*B] = anchors[i]
	}
	x, h := grow(&d.x, R*hd), grow(&d.h, R*hd)
	q, k, v := grow(&d.q, R*qd), grow(&d.k, R*kvd), grow(&d.v, R*kvd)
	att, o := grow(&d.att, R*qd), grow(&d.o, R*hd)
	gate, up := grow(&d.gate, R*inter), grow(&d.up, R*inter)
	if err := ref.Embedding(x, d.W.Embed, ids, hd); err != nil {
		return nil, fmt.Errorf("dspark: block: %w", err)
	}
	for l := range d.W.Layers {
		lw := &d.W.Layers[l]
		err := firstErr(
			ref.RMSNorm(h, x, lw.AttnNorm, R, hd, eps),
			ref.MatMulT(q, h, lw.Q, R, hd, qd),
			ref.MatMulT(k, h, lw.K, R, hd, kvd),
			ref.MatMulT(v, h, lw.V, R, hd, kvd),
		)
		if err == nil {
			addBias(q, lw.QBias, R)
			addBias(k, lw.KBias, R)
			addBias(v, lw.VBias, R)
			err = firstErr(
				ref.RMSNorm(q, q, lw.QNorm, R*nh, dd, eps),
				ref.RMSNorm(k, k, lw.KNorm, R*nkv, dd, eps),
				d.rope.RoPENeoX(q, pos, R, nh, dd),
				d.rope.RoPENeoX(k, pos, R, nkv, dd),
			)
		}
		if err != nil {
			return nil, fmt.Errorf("dspark: block: layer %d: %w", l, err)
		}
		for i, ctx := range ctxs {
			lo, hi := i*B, (i+1)*B
			d.attend(att[lo*qd:hi*qd], q[lo*qd:hi*qd], ctx.K[l], ctx.V[l], k[lo*kvd:hi*kvd], v[lo*kvd:hi*kvd], ctx.n, B)
		}
		err = ref.MatMulT(o, att, lw.O, R, qd, hd)
		if err == nil {
			addBias(o, lw.OBias, R)
			err = firstErr(
				ref.Add(x, x, o),
				ref.RMSNorm(h, x, lw.MLPNorm, R, hd, eps),
				ref.MatMulT(gate, h, lw.Gate, R, hd, inter),
				ref.MatMulT(up, h, lw.Up, R, hd, inter),
				ref.SiLUMulSplit(gate, gate, up, R, inter),
				ref.MatMulT(o, gate, lw.Down, R, inter, hd),
				ref.Add(x, x, o),
			)
		}
		if err != nil {
			return nil, fmt.Errorf("dspark: block: layer %d: %w", l, err)
		}
	}
	hidden, logits := make([]float32, R*hd), make([]float32, R*b.VocabSize)
	if err := firstErr(ref.RMSNorm(hidden, x, d.W.Norm, R, hd, eps), ref.MatMulT(logits, hidden, d.W.Head, R, hd, b.VocabSize)); err != nil {
		return nil, fmt.Errorf("dspark: block: head: %w", err)
	}
	out := make([]*Block, S)
	for i, ctx := range ctxs {
		V := b.VocabSize
		out[i] = &Block{Anchor: anchors[i], Position: ctx.n,
			Hidden: hidden[i*B*hd : (i+1)*B*hd : (i+1)*B*hd], Logits: logits[i*B*V : (i+1)*B*V : (i+1)*B*V]}
	}
	return out, nil
}

// attend is the block's attention without a mask: each of the B queries over the n
// context keys followed by the B block keys.
//
//	q, out: [B, heads, hd]   ck, cv: [n, kv, hd]   bk, bv: [B, kv, hd]
//	query head h reads kv head h / (heads/kv); scores and the softmax sum in float64
func (d *Drafter) attend(out, q, ck, cv, bk, bv []float32, n, B int) {
	b := d.Config.Base
	dd, nh, nkv := b.HeadDim, b.NumAttentionHeads, b.NumKeyValueHeads
	kvd, group := nkv*dd, nh/nkv
	scale := 1 / math.Sqrt(float64(dd))
	s := grow(&d.scores, n+B)
	key := func(j, g int) (kr, vr []float32) {
		if j < n {
			return ck[j*kvd+g*dd : j*kvd+(g+1)*dd], cv[j*kvd+g*dd : j*kvd+(g+1)*dd]
		}
		j -= n
		return bk[j*kvd+g*dd : j*kvd+(g+1)*dd], bv[j*kvd+g*dd : j*kvd+(g+1)*dd]
	}
	acc := make([]float64, dd)
	for i := range B {
		for hh := range nh {
			g := hh / group
			qr := q[(i*nh+hh)*dd : (i*nh+hh+1)*dd]
			mx := math.Inf(-1)
			for j := range n + B {
				kr, _ := key(j, g)
				var dot float64
				for e := range dd {
					dot += float64(qr[e]) * float64(kr[e])
				}
				s[j] = float32(dot * scale)
				mx = math.Max(mx, float64(s[j]))
			}
			var sum float64
			clear(acc)
			for j := range n + B {
				p := math.Exp(float64(s[j]) - mx)
				sum += p
				_, vr := key(j, g)
				for e := range dd {
					acc[e] += p * float64(vr[e])
				}
			}
			or := out[(i*nh+hh)*dd : (i*nh+hh+1)*dd]
			for e := range dd {
				or[e] = float32(acc[e] / sum)
			}
		}
	}
}

// addBias adds bias to each of the rows of x; a nil bias adds nothing.
func addBias(x, bias []float32, rows int) {
	if bias == nil {
		return
	}
	n := len(bias)
	for r := range rows {
		row := x[r*n : (r+1)*n]
		for i := range row {
			row[i] += bias[i]
		}
	}
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
