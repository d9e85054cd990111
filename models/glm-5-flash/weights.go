package glm5flash

import (
	"fmt"
	"slices"
	"strings"

	"github.com/resin-llm/resin/core/weights"
)

// TextPrefix is where transformers 5.23.0 puts the text model's modules (lm_head.weight has
// no prefix).
const TextPrefix = "model.language_model."

// textLayer holds one decoder layer's fp32 weights in module (state_dict) layout.
type textLayer struct {
	kind     string // LinearAttention or IndexedAttention
	kda      *kdaWeights
	mla      *mlaWeights
	dense    *mlpWeights // mlp_layer_types[i] == dense
	moe      *moeWeights // mlp_layer_types[i] == sparse
	inNorm   []float32   // input_layernorm [D]
	postNorm []float32   // post_attention_layernorm [D]
	attnHC   hcWeights
	ffnHC    hcWeights
}

// kdaWeights are a Kimi Delta Attention layer's (L = linear_num_heads·linear_head_dim).
type kdaWeights struct {
	q, k, v []float32 // [L, D] each
	conv    []float32 // [3L, K] (conv1d.weight [3L, 1, K])
	dtBias  []float32 // forget_gate.dt_bias [L]
	aLog    []float32 // forget_gate.A_log [H]
	fa, fb  []float32 // forget_gate.f_a_proj [Dh, D], f_b_proj [L, Dh]
	b       []float32 // b_proj [H, D]
	ga, gb  []float32 // g_a_proj [Dh, D], g_b_proj [L, Dh]
	oNorm   []float32 // o_norm [Dh]
	o       []float32 // o_proj [D, L]
}

// mlaWeights are a NoPE MLA (DSA) layer's; idx is nil for a shared-indexer layer.
type mlaWeights struct {
	qa, qaNorm, qb    []float32 // q_a_proj [Q, D], q_a_layernorm [Q], q_b_proj [H·nope, Q]
	kva, kvaNorm, kvb []float32 // kv_a_proj_with_mqa [R, D], kv_a_layernorm [R], kv_b_proj [H·(nope+v), R]
	o                 []float32 // o_proj [D, H·v]
	idx               *indexerWeights
}

// indexerWeights are the DSA indexer's (I = index_head_dim, N = index_n_heads).
type indexerWeights struct {
	wqb            []float32 // wq_b [N·I, Q]
	wk             []float32 // wk [I, D]
	kNormW, kNormB []float32 // k_norm (LayerNorm) [I]
	wProj          []float32 // weights_proj [N, D]
	ape            []float32 // index_kpool_compress_ape [kpool, I]
	gate           []float32 // index_kpool_compress_gate [I, D]
}

// mlpWeights is a clamped SwiGLU MLP (dense layers, shared experts).
type mlpWeights struct {
	gate, up, down []float32 // [F, D], [F, D], [D, F]
	width          int
}

// moeWeights are a sparse layer's router, routed experts and shared experts.
type moeWeights struct {
	router, bias []float32 // gate.weight [E, D], gate.e_score_correction_bias [E]
	gateUp       []float32 // experts.gate_up_proj [E, 2F, D] (rows: gate then up)
	down         []float32 // experts.down_proj [E, D, F]
	shared       mlpWeights
	// perExpert is the prefix ("…mlp.") of the checkpoint's per-expert tensors
	// (experts.N.gate_proj …) when it stores every expert so and all were read; "" for
	// the fused banks (TextWeights.names has their names), an expert-parallel or
	// tensor-parallel rank's share.
	perExpert string
}

// hcWeights are one mHC module's: fn [(2+hc)·hc, hc·D], base [(2+hc)·hc], scale [3].
type hcWeights struct{ fn, base, scale []float32 }

// mtpWeights is the MTP layer's (layers.{num_hidden_layers}; see loader.mtpLayer).
type mtpWeights struct {
	eNorm, hNorm, ehProj []float32 // enorm [D], hnorm [D], eh_proj [D, 2D] on [enorm(embed); hnorm(hidden)]
	inNorm, postNorm     []float32 // input_layernorm, post_attention_layernorm [D]
	mla                  *mlaWeights
	moe                  *moeWeights
	norm                 []float32 // shared_head.norm [D]
	head                 []float32 // shared_head.head [V, D], or lm_head
}

// TextWeights is the GLM-5.3-Flash text model's fp32 weights; mtp is nil when the
// checkpoint has no MTP layer.
type TextWeights struct {
	embed, norm, lmHead []float32
	layers              []textLayer
	mtp                 *mtpWeights
	// names is the checkpoint tensor each tensor read whole came from, by its first
	// value's address: how --dtype fp8 finds a field's packed form (LoadTextDType).
	names map[*float32]string
	// packed counts the projections held as the checkpoint stores them (--dtype fp8).
	packed PackedWeights
}

// tensorSource is what loadTextWeights reads from: a safetensors checkpoint or a map.
type tensorSource interface {
	Names() []string
	Has(name string) bool
	Float32(name string, shape ...int) ([]float32, error)
}

// ignoredTensor matches what the text model does not read: the vision tower and merger
// (vision inputs are refused) and a copy of embed_tokens (or an hc_head) under the MTP
// layer n (the main embedding is shared; the MTP layer has no mHC streams).
func ignoredTensor(name string, n int) bool {
	if strings.HasPrefix(name, "model.visual.") || strings.HasPrefix(name, "visual.") ||
		strings.HasPrefix(name, "model.vision_tower.") {
		return true
	}
	return mtpTensor(name, n) && (strings.HasSuffix(name, ".embed_tokens.weight") || strings.Contains(name, ".hc_head"))
}

// loader reads tensors by their module name or a checkpoint-side alternative and records
// what it used, so that unused tensors can be named.
type loader struct {
	src  tensorSource
	used map[string]bool
	err  error
	// keep, when set, is the range [lo, hi) of routed experts to keep (a rank of expert
	// parallelism; possibly empty): per-expert tensors of the others are not read.
	keep *[2]int
	// tp, when set, is a tensor-parallel rank's part: the tensors TP splits (read through
	// rows, cols and vocab) come back as its slices, read alone from a source with partial
	// reads (weights.Checkpoint), else read whole and cut.
	tp *parallel
	// names records, for each tensor read whole (get), the name it was read under.
	names map[*float32]string
}

// splitsExperts reports whether l.tp splits every routed expert's intermediate columns
// (TP without EP; under TP × EP each rank's experts are whole).
func (l *loader) splitsExperts() bool { return l.tp != nil && l.tp.tp > 1 && l.tp.ep == 1 }

// partialSource reads rows or columns of a tensor alone (weights.Checkpoint).
type partialSource interface {
	Float32Rows(name string, lo, hi int, shape ...int) ([]float32, error)
	Float32Cols(name string, lo, hi int, shape ...int) ([]float32, error)
}

// rows reads a tensor TP splits by rows: under l.tp the rank's share of shape[0].
func (l *loader) rows(shape []int, names ...string) []float32 {
	if l.tp == nil || l.tp.tp == 1 {
		return l.get(shape, names...)
	}
	return l.slice(false, l.tp.tpRank*shape[0]/l.tp.tp, (l.tp.tpRank+1)*shape[0]/l.tp.tp, shape, names)
}

// cols reads a matrix TP splits by columns: under l.tp the rank's share of shape[1].
func (l *loader) cols(shape []int, names ...string) []float32 {
	if l.tp == nil || l.tp.tp == 1 {
		return l.get(shape, names...)
	}
	return l.slice(true, l.tp.tpRank*shape[1]/l.tp.tp, (l.tp.tpRank+1)*shape[1]/l.tp.tp, shape, names)
}

// vocab reads the embedding or the head: under l.tp the rank's vocabulary rows.
func (l *loader) vocab(shape []int, names ...string) []float32 {
	if l.tp == nil || l.tp.tp == 1 {
		return l.get(shape, names...)
	}
	return l.slice(false, l.tp.vocabLo, l.tp.vocabHi, shape, names)
}

func (l *loader) slice(cols bool, lo, hi int, shape []int, names []string) []float32 {
	if l.err != nil {
		return nil
	}
	for _, n := range names {
		if !l.src.Has(n) {
			continue
		}
		l.used[n] = true
		var v []float32
		var err error
		if ps, ok := l.src.(partialSource); ok && cols {
			v, err = ps.Float32Cols(n, lo, hi, shape...)
		} else if ok {
			v, err = ps.Float32Rows(n, lo, hi, shape...)
		} else if v, err = l.src.Float32(n, shape...); err == nil {
			inner := len(v) / max(shape[0], 1)
			if cols {
				v = columnsOf(v, shape[0], shape[1], lo, hi)
			} else {
				v = slices.Clone(v[lo*inner : hi*inner])
			}
		}
		if err != nil {
			l.err = err
			return nil
		}
		return v
	}
	l.err = fmt.Errorf("%w: tensor %s (shape %v) is missing", weights.ErrNotFound, names[0], shape)
	return nil
}

// columnsOf returns columns [lo, hi) of the row-major [rows, cols] matrix m.
func columnsOf(m []float32, rows, cols, lo, hi int) []float32 {
	out := make([]float32, 0, rows*(hi-lo))
	for r := range rows {
		out = append(out, m[r*cols+lo:r*cols+hi]...)
	}
	return out
}

func (l *loader) get(shape []int, names ...string) []float32 {
	if l.err != nil {
		return nil
	}
	for _, n := range names {
		if l.src.Has(n) {
			v, err := l.src.Float32(n, shape...)
			if err != nil {
				l.err = err
				return nil
			}
			l.used[n] = true
			if len(v) > 0 && l.names != nil {
				l.names[&v[0]] = n
			}
			return v
		}
	}
	l.err = fmt.Errorf("%w: tensor %s (shape %v) is missing", weights.ErrNotFound, names[0], shape)
	return nil
}

// loadTextWeights reads every text weight in module names or the checkpoint-side names
// the 5.23.0 conversion mapping renames (flat forget-gate keys, hc_*, per-expert keys,
// q/k/v_conv1d). A missing or mis-shaped tensor is an error naming it; so is a tensor the
// model does not read, unless it belongs to the vision tower or the MTP layer.
func loadTextWeights(src tensorSource, c *TextConfig) (*TextWeights, []string, error) {
	w, notes, err := loadText(src, c, nil, nil)
	return w, notes, err
}

// loadTextShard is loadTextWeights keeping only the routed experts in keep ([lo, hi)):
// their per-expert tensors alone are read (a fused experts tensor is read whole and cut).
// With tp (a rank's part; nil: none) the tensors TP splits outside the routed experts and
// the KDA convolution come back as the rank's slices (loader.rows, cols, vocab), and the
// MTP layer is not read.
func loadTextShard(src tensorSource, c *TextConfig, keep *[2]int, tp *parallel) (*TextWeights, error) {
	w, _, err := loadText(src, c, keep, tp)
	return w, err
}

func loadText(src tensorSource, c *TextConfig, keep *[2]int, tp *parallel) (*TextWeights, []string, error) {
	l := &loader{src: src, used: map[string]bool{}, keep: keep, tp: tp, names: map[*float32]string{}}
	D, V, hc := c.HiddenSize, c.VocabSize, c.HCMult
	p := TextPrefix
	w := &TextWeights{names: l.names}
	w.embed = l.vocab([]int{V, D}, p+"embed_tokens.weight")
	w.norm = l.get([]int{D}, p+"norm.weight")
	if c.TieWordEmbeddings {
		w.lmHead = w.embed
		if src.Has("lm_head.weight") {
			l.vocab([]int{V, D}, "lm_head.weight")
		}
	} else {
		w.lmHead = l.vocab([]int{V, D}, "lm_head.weight")
	}
	nMix := (2 + hc) * hc
	for i := range c.NumHiddenLayers {
		lp := fmt.Sprintf("%slayers.%d.", p, i)
		ly := textLayer{kind: c.LayerTypes[i]}
		ly.inNorm = l.get([]int{D}, lp+"input_layernorm.weight")
		ly.postNorm = l.get([]int{D}, lp+"post_attention_layernorm.weight")
		for _, h := range []struct {
			dst  *hcWeights
			kind string
		}{{&ly.attnHC, "attn"}, {&ly.ffnHC, "ffn"}} {
			h.dst.fn = l.get([]int{nMix, hc * D}, lp+h.kind+"_hc.fn", lp+"hc_"+h.kind+"_fn")
			h.dst.base = l.get([]int{nMix}, lp+h.kind+"_hc.base", lp+"hc_"+h.kind+"_base")
			h.dst.scale = l.get([]int{3}, lp+h.kind+"_hc.scale", lp+"hc_"+h.kind+"_scale")
		}
		a := lp + "self_attn."
		if ly.kind == LinearAttention {
			H, Dh, K := c.LinearNumHeads, c.LinearHeadDim, c.LinearConvKernelDim
			L := H * Dh
			k := &kdaWeights{}
			k.q = l.rows([]int{L, D}, a+"q_proj.weight")
			k.k = l.rows([]int{L, D}, a+"k_proj.weight")
			k.v = l.rows([]int{L, D}, a+"v_proj.weight")
			if src.Has(a + "conv1d.weight") {
				k.conv = l.get([]int{3 * L, 1, K}, a+"conv1d.weight")
			} else {
				for _, n := range []string{"q", "k", "v"} {
					k.conv = append(k.conv, l.get([]int{L, 1, K}, a+n+"_conv1d.weight")...)
				}
			}
			k.dtBias = l.rows([]int{L}, a+"forget_gate.dt_bias", a+"dt_bias")
			k.aLog = l.rows([]int{H}, a+"forget_gate.A_log", a+"A_log")
			k.fa = l.get([]int{Dh, D}, a+"forget_gate.f_a_proj.weight", a+"f_a_proj.weight")
			k.fb = l.rows([]int{L, Dh}, a+"forget_gate.f_b_proj.weight", a+"f_b_proj.weight")
			k.b = l.rows([]int{H, D}, a+"b_proj.weight")
			k.ga = l.get([]int{Dh, D}, a+"g_a_proj.weight")
			k.gb = l.rows([]int{L, Dh}, a+"g_b_proj.weight")
			k.oNorm = l.get([]int{Dh}, a+"o_norm.weight")
			k.o = l.cols([]int{D, L}, a+"o_proj.weight")
			ly.kda = k
		} else {
			ly.mla = l.mla(c, a, c.IndexerTypes[i] != IndexerShared)
		}
		f := lp + "mlp."
		if c.MLPLayerTypes[i] == DenseMLP {
			ly.dense = l.mlp(f, D, c.IntermediateSize)
		} else {
			ly.moe = l.moe(c, f)
		}
		w.layers = append(w.layers, ly)
		if l.err != nil {
			return nil, nil, l.err
		}
	}
	if l.err != nil {
		return nil, nil, l.err
	}
	if l.tp != nil { // a rank: the MTP layer is not split, nor read (marked used)
		for _, n := range src.Names() {
			if mtpTensor(n, c.NumHiddenLayers) {
				l.used[n] = true
			}
		}
	} else {
		w.mtp = l.mtpLayer(c, w)
	}
	if l.err != nil {
		return nil, nil, l.err
	}
	var notes []string
	var ignored int
	for _, n := range slices.Sorted(slices.Values(src.Names())) {
		if l.used[n] {
			continue
		}
		if ignoredTensor(n, c.NumHiddenLayers) {
			ignored++
			continue
		}
		if w.mtp == nil && mtpTensor(n, c.NumHiddenLayers) {
			return nil, nil, fmt.Errorf("tensor %s belongs to the MTP layer, but the checkpoint has no %s (the MTP layer's eh_proj)", n, mtpPrefixes(c.NumHiddenLayers)[0]+"eh_proj.weight")
		}
		return nil, nil, fmt.Errorf("tensor %s is not read by glm-5-flash (unexpected in a glm5_next text checkpoint)", n)
	}
	if ignored > 0 {
		notes = append(notes, fmt.Sprintf("%d tensors ignored by the text model: the vision tower's, and embed_tokens or hc_head copies under the MTP layer (it shares the embedding and has no mHC streams)", ignored))
	}
	if w.mtp == nil {
		notes = append(notes, "no MTP layer (layers.{num_hidden_layers}.eh_proj): speculative decoding with MTP drafts is unavailable")
	}
	return w, notes, nil
}

// mtpPrefixes are the names the MTP layer's tensors take: under the text model's modules
// (model.language_model.layers.{n}.) or the flat checkpoint's (model.layers.{n}.).
func mtpPrefixes(n int) []string {
	return []string{fmt.Sprintf("%slayers.%d.", TextPrefix, n), fmt.Sprintf("model.layers.%d.", n)}
}

// mtpTensor reports whether name is under the MTP layer (layers.{n}.).
func mtpTensor(name string, n int) bool {
	for _, p := range mtpPrefixes(n) {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// mtpLayer reads the MTP layer when the checkpoint has one (its eh_proj), else returns nil.
// Layout (layers.{num_hidden_layers}, as vLLM's and SGLang's glm5_next MTP read it; the
// layer has no mHC): enorm, hnorm, eh_proj; one decoder layer with NoPE MLA attention and
// its own DSA indexer, and an MoE; shared_head.norm and shared_head.head, the main lm_head
// when the checkpoint has no shared_head.head. An embed_tokens copy under the layer is
// ignored: the main embedding is shared.
func (l *loader) mtpLayer(c *TextConfig, w *TextWeights) *mtpWeights {
	D, V := c.HiddenSize, c.VocabSize
	var p string
	for _, q := range mtpPrefixes(c.NumHiddenLayers) {
		if l.src.Has(q + "eh_proj.weight") {
			p = q
			break
		}
	}
	if p == "" {
		return nil
	}
	m := &mtpWeights{
		eNorm:    l.get([]int{D}, p+"enorm.weight"),
		hNorm:    l.get([]int{D}, p+"hnorm.weight"),
		ehProj:   l.get([]int{D, 2 * D}, p+"eh_proj.weight"),
		inNorm:   l.get([]int{D}, p+"input_layernorm.weight"),
		postNorm: l.get([]int{D}, p+"post_attention_layernorm.weight"),
		mla:      l.mla(c, p+"self_attn.", true),
		moe:      l.moe(c, p+"mlp."),
		norm:     l.get([]int{D}, p+"shared_head.norm.weight"),
		head:     w.lmHead,
	}
	if l.src.Has(p + "shared_head.head.weight") {
		m.head = l.get([]int{V, D}, p+"shared_head.head.weight")
	}
	return m
}

func (l *loader) mla(c *TextConfig, a string, indexed bool) *mlaWeights {
	D, H, Q, R := c.HiddenSize, c.NumAttentionHeads, c.QLoraRank, c.KVLoraRank
	m := &mlaWeights{}
	m.qa = l.get([]int{Q, D}, a+"q_a_proj.weight")
	m.qaNorm = l.get([]int{Q}, a+"q_a_layernorm.weight")
	m.qb = l.rows([]int{H * c.QKHeadDim, Q}, a+"q_b_proj.weight")
	m.kva = l.get([]int{R + c.QKRopeHeadDim, D}, a+"kv_a_proj_with_mqa.weight")
	m.kvaNorm = l.get([]int{R}, a+"kv_a_layernorm.weight")
	m.kvb = l.rows([]int{H * (c.QKNopeHeadDim + c.VHeadDim), R}, a+"kv_b_proj.weight")
	m.o = l.cols([]int{D, H * c.VHeadDim}, a+"o_proj.weight")
	if indexed {
		x := a + "indexer."
		I, N := c.IndexHeadDim, c.IndexNHeads
		m.idx = &indexerWeights{
			wqb:    l.get([]int{N * I, Q}, x+"wq_b.weight"),
			wk:     l.get([]int{I, D}, x+"wk.weight"),
			kNormW: l.get([]int{I}, x+"k_norm.weight"),
			kNormB: l.get([]int{I}, x+"k_norm.bias"),
			wProj:  l.get([]int{N, D}, x+"weights_proj.weight"),
			ape:    l.get([]int{c.IndexKPool, I}, x+"index_kpool_compress_ape"),
			gate:   l.get([]int{I, D}, x+"index_kpool_compress_gate"),
		}
	}
	return m
}

// moe reads a sparse MLP under prefix f ("...mlp."): the router, the routed experts
// (fused experts.gate_up_proj / down_proj, or per-expert keys) and the shared experts.
func (l *loader) moe(c *TextConfig, f string) *moeWeights {
	D, E, F := c.HiddenSize, c.NRoutedExperts, c.MoEIntermediateSize
	m := &moeWeights{}
	m.router = l.get([]int{E, D}, f+"gate.weight")
	m.bias = l.get([]int{E}, f+"gate.e_score_correction_bias")
	lo, hi := 0, E
	if l.keep != nil {
		lo, hi = l.keep[0], l.keep[1]
	}
	if l.src.Has(f + "experts.gate_up_proj") {
		m.gateUp = l.get([]int{E, 2 * F, D}, f+"experts.gate_up_proj")
		m.down = l.get([]int{E, D, F}, f+"experts.down_proj")
		if l.keep != nil && l.err == nil {
			m.gateUp = slices.Clone(m.gateUp[lo*2*F*D : hi*2*F*D])
			m.down = slices.Clone(m.down[lo*D*F : hi*D*F])
		}
		if l.splitsExperts() && l.err == nil { // cut here: the fused tensors are read whole
			a, b := l.tp.tpRank*F/l.tp.tp, (l.tp.tpRank+1)*F/l.tp.tp
			var gu, down []float32
			for e := range len(m.down) / (D * F) {
				ge, de := m.gateUp[e*2*F*D:(e+1)*2*F*D], m.down[e*D*F:(e+1)*D*F]
				gu = append(append(gu, ge[a*D:b*D]...), ge[(F+a)*D:(F+b)*D]...)
				down = append(down, columnsOf(de, D, F, a, b)...)
			}
			m.gateUp, m.down = gu, down
		}
	} else {
		if l.keep == nil && !l.splitsExperts() {
			m.perExpert = f
		}
		for e := range E {
			ep := fmt.Sprintf("%sexperts.%d.", f, e)
			if e < lo || e >= hi {
				for _, n := range []string{"gate_proj", "up_proj", "down_proj"} {
					l.used[ep+n+".weight"] = true // another rank's expert: not read
				}
				continue
			}
			if l.splitsExperts() { // this rank's intermediate rows and columns alone
				m.gateUp = append(m.gateUp, l.rows([]int{F, D}, ep+"gate_proj.weight")...)
				m.gateUp = append(m.gateUp, l.rows([]int{F, D}, ep+"up_proj.weight")...)
				m.down = append(m.down, l.cols([]int{D, F}, ep+"down_proj.weight")...)
				continue
			}
			m.gateUp = append(m.gateUp, l.get([]int{F, D}, ep+"gate_proj.weight")...)
			m.gateUp = append(m.gateUp, l.get([]int{F, D}, ep+"up_proj.weight")...)
			m.down = append(m.down, l.get([]int{D, F}, ep+"down_proj.weight")...)
		}
	}
	m.shared = *l.mlp(f+"shared_experts.", D, F*c.NSharedExperts)
	return m
}

func (l *loader) mlp(prefix string, d, f int) *mlpWeights {
	return &mlpWeights{
		gate:  l.rows([]int{f, d}, prefix+"gate_proj.weight"),
		up:    l.rows([]int{f, d}, prefix+"up_proj.weight"),
		down:  l.cols([]int{d, f}, prefix+"down_proj.weight"),
		width: f,
	}
}

// LoadTextModel opens a glm5_next checkpoint directory (config.json and safetensors,
// sharded or not) as a TextModel.
func LoadTextModel(dir string) (*TextModel, error) {
	c, err := LoadTextConfig(dir)
	if err != nil {
		return nil, err
	}
	ck, err := weights.Open(dir)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	var src tensorSource = ck
	if c.Quant != nil {
		src = dequantSource{ck, c.Quant}
	}
	w, notes, err := loadTextWeights(src, c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	c.Notes = append(c.Notes, notes...)
	return &TextModel{Config: c, W: w}, nil
}

// dequantSource reads quantized tensors through core/weights' Dequantize (fine-grained
// FP8 blocks; NVIDIA ModelOpt FP8, NVFP4 and MIXED_PRECISION; the ignore list's modules
// kept BF16) and hides their scale tensors.
type dequantSource struct {
	ck *weights.Checkpoint
	q  *weights.Quant
}

func (d dequantSource) Names() []string {
	var out []string
	for _, n := range d.ck.Names() {
		if strings.HasSuffix(n, "_scale_inv") || d.q.ScaleTensor(n) {
			continue
		}
		if base, ok := strings.CutSuffix(n, ".scale"); ok && d.ck.Has(base+".weight") {
			continue
		}
		out = append(out, n)
	}
	return out
}
func (d dequantSource) Has(name string) bool { return d.ck.Has(name) }
func (d dequantSource) Float32(name string, shape ...int) ([]float32, error) {
	return d.ck.Dequantize(name, d.q, shape...)
}

// Float32Rows reads rows [lo, hi) of a matrix alone (weights.Checkpoint.DequantizeRows:
// the scale blocks holding them); a vector is dequantized whole and cut.
func (d dequantSource) Float32Rows(name string, lo, hi int, shape ...int) ([]float32, error) {
	if len(shape) == 2 {
		return d.ck.DequantizeRows(name, d.q, lo, hi, shape...)
	}
	v, err := d.ck.Dequantize(name, d.q, shape...)
	if err != nil {
		return nil, err
	}
	if len(shape) != 1 || lo < 0 || hi < lo || hi > shape[0] {
		return nil, fmt.Errorf("tensor %s: rows [%d, %d) of a %v tensor", name, lo, hi, shape)
	}
	return v[lo:hi], nil
}

// Float32Cols reads columns [lo, hi) of a matrix alone (DequantizeCols).
func (d dequantSource) Float32Cols(name string, lo, hi int, shape ...int) ([]float32, error) {
	return d.ck.DequantizeCols(name, d.q, lo, hi, shape...)
}
