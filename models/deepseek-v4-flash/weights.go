package deepseekv4flash

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/resin-llm/resin/core/weights"
)

// HyperConn is one manifold-constrained hyper-connection (mHC): the projection of the
// hc_mult flattened streams to the pre, post and comb mixing weights.
type HyperConn struct {
	Fn    []float32 // [(2+hc)·hc, hc·hidden]
	Base  []float32 // [(2+hc)·hc]
	Scale []float32 // [3]: pre, post, comb
}

// Compressor is a CSA or HCA compressor (or the indexer's own compressor). Width is the
// per-token projection width: 2·dim for the overlapping (CSA) kind, dim for HCA.
type Compressor struct {
	KV, Gate     []float32 // [width, hidden]
	PositionBias []float32 // [ratio, width]
	Norm         []float32 // [dim]
}

// Indexer is the CSA lightning indexer.
type Indexer struct {
	Compressor
	QB          []float32 // [indexHeads·indexHeadDim, qLoraRank]
	WeightsProj []float32 // [indexHeads, hidden]
}

// Layer holds one decoder block's parameters, row-major as in the checkpoint (a Linear
// weight is [out, in]).
type Layer struct {
	AttnNorm, FFNNorm []float32 // [hidden]
	AttnHC, FFNHC     HyperConn

	QA     []float32 // [qLoraRank, hidden]
	QANorm []float32 // [qLoraRank]
	QB     []float32 // [heads·headDim, qLoraRank]
	KV     []float32 // [headDim, hidden]
	KVNorm []float32 // [headDim]
	OA     []float32 // [oGroups·oLoraRank, heads·headDim/oGroups]
	OB     []float32 // [hidden, oGroups·oLoraRank]
	Sinks  []float32 // [heads]

	Compressor *Compressor // nil on sliding layers
	Indexer    *Indexer    // CSA layers only

	Router               []float32 // [experts, hidden]
	RouteBias            []float32 // [experts] e_score_correction_bias (learned routing)
	Tid2Eid              []int32   // [vocab, topK] (hash routing)
	GateUp               []float32 // [experts, 2·moeInter, hidden]: rows gate then up
	Down                 []float32 // [experts, hidden, moeInter]
	SharedGate, SharedUp []float32 // [moeInter, hidden]
	SharedDown           []float32 // [hidden, moeInter]

	cpu *layerProj // the projections in the model's dtype (NewModelDType); nil: fp32
}

// MTP is the multi-token-prediction head (upstream layout mtp.0.*): the next token's
// embedding and the main model's last hidden streams are normalised, projected and summed
// into the streams of one sliding-attention block, then collapsed by the head's own
// hc_head and norm and read out by the shared lm_head.
type MTP struct {
	EProj, HProj       []float32 // [hidden, hidden]
	ENorm, HNorm, Norm []float32 // [hidden]
	HCFn               []float32 // [hc, hc·hidden]
	HCBase, HCScale    []float32 // [hc], [1]
	Block              Layer
}

// Weights holds every parameter of the model.
type Weights struct {
	Embed   []float32 // [vocab, hidden]
	Layers  []Layer
	HCFn    []float32 // [hc, hc·hidden]
	HCBase  []float32 // [hc]
	HCScale []float32 // [1]
	Norm    []float32 // [hidden]
	Head    []float32 // [vocab, hidden]; aliases Embed when tied
	MTP     *MTP      // nil when the checkpoint has no mtp.* tensors

	packed PackedWeights // the projections held as the checkpoint stores them (--dtype fp8)
}

// NameForm is one of the three tensor naming schemes transformers 5.23.0 loads.
type NameForm int

const (
	// ModuleNames: the module state_dict (model.layers.N.self_attn.q_a_proj.weight, packed
	// experts mlp.experts.gate_up_proj [E, 2I, D]).
	ModuleNames NameForm = iota
	// UpstreamNames: DeepSeek's checkpoint (layers.N.attn.wq_a.weight, embed.weight,
	// head.weight, per-expert ffn.experts.E.{w1,w2,w3}.weight).
	UpstreamNames
	// HybridNames: what save_pretrained writes: upstream leaf names under "model."
	// (model.layers.N.attn.wq_a.weight, model.embed_tokens.weight, model.norm.weight,
	// model.hc_head.hc_fn, head.weight).
	HybridNames
)

func (f NameForm) String() string {
	return [...]string{"module", "upstream", "hybrid"}[f]
}

// param is one tensor the model reads: its name in each form, shape and destination.
type param struct {
	names [3]string // by NameForm
	shape []int
	dst   *[]float32
	ints  *[]int32 // integer tensor (tid2eid)
	kind  initKind
	// alias lists further names a checkpoint may hold the tensor under (any form).
	alias []string
	// experts: the packed tensor of module form, per-expert tensors in the others.
	experts    int
	expertLeaf [2]string // upstream leaves of the packed halves ("w1", "w3") or ("w2", "")
	// keep, when set, is the range [lo, hi) of experts to keep (a rank of expert
	// parallelism; possibly empty): per-expert tensors of the others are not read.
	keep *[2]int
	// part, when set, is the one slice of the tensor to read (a tensor-parallel rank's):
	// rows, or with cols the columns, [lo, hi) of the [out, in] matrix (of a vector, its
	// elements). An unquantized tensor is read in that range alone.
	part *part
	// expertPart, when set, is the intermediate range [lo, hi) of every routed expert to
	// read (a tensor-parallel rank's): gate and up rows, down columns.
	expertPart *part
}

// part is a range of a tensor's rows or columns (parallel.go).
type part struct {
	cols   bool
	lo, hi int
}

type initKind int

const (
	initNormal initKind = iota // N(0, 0.02)
	initNorm                   // 1 + N(0, 0.1)
	initBias                   // N(0, 0.1)
	initScale                  // 1 + N(0, 0.3)
	initRoute                  // tid2eid: random experts
)

// layerParams lists one decoder block's tensors. mod is the module prefix
// ("model.layers.N."), up the upstream one ("layers.N." or "mtp.0."), hyb the hybrid one.
func layerParams(c *Config, l *Layer, kind, mlpKind string, mod, up, hyb string) []param {
	h, d, qr := c.HiddenSize, c.HeadDim, c.QLoraRank
	hc := c.HCMult
	nm := func(m, u string) [3]string { return [3]string{mod + m, up + u, hyb + u} }
	ps := []param{
		{names: nm("input_layernorm.weight", "attn_norm.weight"), shape: []int{h}, dst: &l.AttnNorm, kind: initNorm},
		{names: nm("post_attention_layernorm.weight", "ffn_norm.weight"), shape: []int{h}, dst: &l.FFNNorm, kind: initNorm},
	}
	for _, x := range []struct {
		m, u string
		hc   *HyperConn
	}{{"attn_hc", "hc_attn", &l.AttnHC}, {"ffn_hc", "hc_ffn", &l.FFNHC}} {
		ps = append(ps,
			param{names: nm(x.m+".fn", x.u+"_fn"), shape: []int{(2 + hc) * hc, hc * h}, dst: &x.hc.Fn},
			param{names: nm(x.m+".base", x.u+"_base"), shape: []int{(2 + hc) * hc}, dst: &x.hc.Base, kind: initBias},
			param{names: nm(x.m+".scale", x.u+"_scale"), shape: []int{3}, dst: &x.hc.Scale, kind: initScale},
		)
	}
	a := "self_attn."
	ps = append(ps,
		param{names: nm(a+"q_a_proj.weight", "attn.wq_a.weight"), shape: []int{qr, h}, dst: &l.QA},
		param{names: nm(a+"q_a_norm.weight", "attn.q_norm.weight"), shape: []int{qr}, dst: &l.QANorm, kind: initNorm},
		param{names: nm(a+"q_b_proj.weight", "attn.wq_b.weight"), shape: []int{c.NumAttentionHeads * d, qr}, dst: &l.QB},
		param{names: nm(a+"kv_proj.weight", "attn.wkv.weight"), shape: []int{d, h}, dst: &l.KV},
		// DeepSeek's checkpoint names the KV norm attn.kv_norm (inference/model.py's
		// Attention.kv_norm); transformers 5.23.0's save_pretrained writes attn.norm. Both
		// are read, in either form.
		param{names: [3]string{mod + a + "kv_norm.weight", up + "attn.kv_norm.weight", hyb + "attn.norm.weight"},
			alias: []string{up + "attn.norm.weight", hyb + "attn.kv_norm.weight"}, shape: []int{d}, dst: &l.KVNorm, kind: initNorm},
		param{names: nm(a+"o_a_proj.weight", "attn.wo_a.weight"), shape: []int{c.OGroups * c.OLoraRank, c.NumAttentionHeads * d / c.OGroups}, dst: &l.OA},
		param{names: nm(a+"o_b_proj.weight", "attn.wo_b.weight"), shape: []int{h, c.OGroups * c.OLoraRank}, dst: &l.OB},
		param{names: nm(a+"sinks", "attn.attn_sink"), shape: []int{c.NumAttentionHeads}, dst: &l.Sinks, kind: initBias},
	)
	if kind != SlidingAttention {
		ratio := c.CompressRates[kind]
		width := d
		if kind == CompressedSparse {
			width = 2 * d
		}
		if l.Compressor == nil {
			l.Compressor = &Compressor{}
		}
		cp := l.Compressor
		ps = append(ps,
			param{names: nm(a+"compressor.kv_proj.weight", "attn.compressor.wkv.weight"), shape: []int{width, h}, dst: &cp.KV},
			param{names: nm(a+"compressor.gate_proj.weight", "attn.compressor.wgate.weight"), shape: []int{width, h}, dst: &cp.Gate},
			param{names: nm(a+"compressor.position_bias", "attn.compressor.ape"), shape: []int{ratio, width}, dst: &cp.PositionBias, kind: initBias},
			param{names: nm(a+"compressor.kv_norm.weight", "attn.compressor.norm.weight"), shape: []int{d}, dst: &cp.Norm, kind: initNorm},
		)
		if kind == CompressedSparse {
			id := c.IndexHeadDim
			if l.Indexer == nil {
				l.Indexer = &Indexer{}
			}
			ix := l.Indexer
			p := a + "compressor.indexer."
			ps = append(ps,
				param{names: nm(p+"kv_proj.weight", "attn.indexer.compressor.wkv.weight"), shape: []int{2 * id, h}, dst: &ix.KV},
				param{names: nm(p+"gate_proj.weight", "attn.indexer.compressor.wgate.weight"), shape: []int{2 * id, h}, dst: &ix.Gate},
				param{names: nm(p+"position_bias", "attn.indexer.compressor.ape"), shape: []int{ratio, 2 * id}, dst: &ix.PositionBias, kind: initBias},
				param{names: nm(p+"kv_norm.weight", "attn.indexer.compressor.norm.weight"), shape: []int{id}, dst: &ix.Norm, kind: initNorm},
				param{names: nm(p+"q_b_proj.weight", "attn.indexer.wq_b.weight"), shape: []int{c.IndexNHeads * id, qr}, dst: &ix.QB},
				param{names: nm(p+"scorer.weights_proj.weight", "attn.indexer.weights_proj.weight"), shape: []int{c.IndexNHeads, h}, dst: &ix.WeightsProj},
			)
		}
	}
	e, in := c.NRoutedExperts, c.MoEIntermediateSize
	ps = append(ps, param{names: nm("mlp.gate.weight", "ffn.gate.weight"), shape: []int{e, h}, dst: &l.Router})
	if mlpKind == HashMoE {
		ps = append(ps, param{names: nm("mlp.gate.tid2eid", "ffn.gate.tid2eid"), shape: []int{c.VocabSize, c.NumExpertsPerTok}, ints: &l.Tid2Eid, kind: initRoute})
	} else {
		ps = append(ps, param{names: nm("mlp.gate.e_score_correction_bias", "ffn.gate.bias"), shape: []int{e}, dst: &l.RouteBias, kind: initBias})
	}
	ps = append(ps,
		param{names: nm("mlp.experts.gate_up_proj", "ffn.experts.%d.%s.weight"), shape: []int{e, 2 * in, h}, dst: &l.GateUp, experts: e, expertLeaf: [2]string{"w1", "w3"}},
		param{names: nm("mlp.experts.down_proj", "ffn.experts.%d.%s.weight"), shape: []int{e, h, in}, dst: &l.Down, experts: e, expertLeaf: [2]string{"w2", ""}},
		param{names: nm("mlp.shared_experts.gate_proj.weight", "ffn.shared_experts.w1.weight"), shape: []int{in, h}, dst: &l.SharedGate},
		param{names: nm("mlp.shared_experts.up_proj.weight", "ffn.shared_experts.w3.weight"), shape: []int{in, h}, dst: &l.SharedUp},
		param{names: nm("mlp.shared_experts.down_proj.weight", "ffn.shared_experts.w2.weight"), shape: []int{h, in}, dst: &l.SharedDown},
	)
	return ps
}

// params lists every tensor the config needs, with its name in each form and its field in
// w: the one place the model's weight names live (loading, random weights and saving walk
// it). withMTP adds the MTP head's mtp.0.* tensors (upstream names in every form:
// transformers neither loads nor writes them).
func params(c *Config, w *Weights, withMTP bool) []param {
	h, hc := c.HiddenSize, c.HCMult
	if len(w.Layers) != c.NumHiddenLayers {
		w.Layers = make([]Layer, c.NumHiddenLayers)
	}
	ps := []param{{names: [3]string{"model.embed_tokens.weight", "embed.weight", "model.embed_tokens.weight"}, shape: []int{c.VocabSize, h}, dst: &w.Embed}}
	for i := range w.Layers {
		ps = append(ps, layerParams(c, &w.Layers[i], c.LayerTypes[i], c.MLPLayerTypes[i],
			fmt.Sprintf("model.layers.%d.", i), fmt.Sprintf("layers.%d.", i), fmt.Sprintf("model.layers.%d.", i))...)
	}
	ps = append(ps,
		param{names: [3]string{"model.hc_head.hc_fn", "hc_head_fn", "model.hc_head.hc_fn"}, shape: []int{hc, hc * h}, dst: &w.HCFn},
		param{names: [3]string{"model.hc_head.hc_base", "hc_head_base", "model.hc_head.hc_base"}, shape: []int{hc}, dst: &w.HCBase, kind: initBias},
		param{names: [3]string{"model.hc_head.hc_scale", "hc_head_scale", "model.hc_head.hc_scale"}, shape: []int{1}, dst: &w.HCScale, kind: initScale},
		param{names: [3]string{"model.norm.weight", "norm.weight", "model.norm.weight"}, shape: []int{h}, dst: &w.Norm, kind: initNorm},
	)
	if !c.TieWordEmbeddings {
		ps = append(ps, param{names: [3]string{"lm_head.weight", "head.weight", "head.weight"}, shape: []int{c.VocabSize, h}, dst: &w.Head})
	}
	if withMTP {
		if w.MTP == nil {
			w.MTP = &MTP{}
		}
		m := w.MTP
		u := func(s string) [3]string { return [3]string{"mtp.0." + s, "mtp.0." + s, "mtp.0." + s} }
		ps = append(ps,
			param{names: u("e_proj.weight"), shape: []int{h, h}, dst: &m.EProj},
			param{names: u("h_proj.weight"), shape: []int{h, h}, dst: &m.HProj},
			param{names: u("enorm.weight"), shape: []int{h}, dst: &m.ENorm, kind: initNorm},
			param{names: u("hnorm.weight"), shape: []int{h}, dst: &m.HNorm, kind: initNorm},
			param{names: u("norm.weight"), shape: []int{h}, dst: &m.Norm, kind: initNorm},
			param{names: u("hc_head_fn"), shape: []int{hc, hc * h}, dst: &m.HCFn},
			param{names: u("hc_head_base"), shape: []int{hc}, dst: &m.HCBase, kind: initBias},
			param{names: u("hc_head_scale"), shape: []int{1}, dst: &m.HCScale, kind: initScale},
		)
		// The MTP block: sliding attention (compress ratio 0) and a learned-routing MoE,
		// in upstream names under mtp.0. whatever the main model's form.
		for _, p := range layerParams(c, &m.Block, SlidingAttention, MoE, "mtp.0.", "mtp.0.", "mtp.0.") {
			p.names[ModuleNames] = p.names[UpstreamNames]
			p.names[HybridNames] = p.names[UpstreamNames]
			ps = append(ps, p)
		}
	}
	return ps
}

// detectForm guesses which name form a checkpoint uses, to name missing tensors as it
// would.
func detectForm(ck *weights.Checkpoint) NameForm {
	if ck.Has("embed.weight") {
		return UpstreamNames
	}
	for _, n := range ck.Names() {
		if strings.HasPrefix(n, "model.layers.") && (strings.Contains(n, ".attn.") || strings.Contains(n, ".ffn.")) {
			return HybridNames
		}
		if strings.HasPrefix(n, "layers.") {
			return UpstreamNames
		}
	}
	return ModuleNames
}

// hasMTP reports whether a checkpoint carries an MTP head.
func hasMTP(ck *weights.Checkpoint) bool {
	return ck.Has("mtp.0.e_proj.weight")
}

// LoadWeights reads every tensor the config needs from ck, under any of the three name
// forms (tensor by tensor, as from_pretrained's renaming does), widened to float32. A
// missing, unexpected or mis-shaped tensor is an error naming it. mtp.* tensors load
// into the MTP head when present.
func LoadWeights(c *Config, ck *weights.Checkpoint) (*Weights, error) {
	return loadWeights(c, ck, nil, nil)
}

// loadWeights is LoadWeights keeping only the routed experts in keep ([lo, hi)) when it
// is set: their per-expert tensors alone are read. parts, when set, gives the slice to
// read of the tensors it maps (by destination in the Weights being filled); the others
// are read whole, and the result holds those slices (a rank's: its shapes are not the
// model's, so w.check is left to the caller).
func loadWeights(c *Config, ck *weights.Checkpoint, keep *[2]int, parts func(*Weights) map[*[]float32]part) (*Weights, error) {
	w := &Weights{}
	ps := params(c, w, hasMTP(ck))
	var cut map[*[]float32]part
	if parts != nil {
		cut = parts(w)
	}
	used := map[string]bool{}
	form := detectForm(ck)
	var missing []string
	for _, p := range ps {
		if p.experts > 0 {
			p.keep = keep
		}
		if pt, ok := cut[p.dst]; ok && p.dst != nil && p.experts == 0 {
			p.part = &pt
		} else if ok && p.dst != nil {
			p.expertPart = &pt
		}
		name, err := loadParam(ck, c.Quant, p, used)
		if err != nil {
			return nil, err
		}
		if name != "" {
			if alt := p.names[form]; form != ModuleNames && alt != name {
				name += " (" + alt + ")"
			}
			missing = append(missing, name)
		}
	}
	if c.TieWordEmbeddings {
		w.Head = w.Embed
	}
	// A rank's cut embedding and head cannot be compared with a whole copy.
	if err := checkSharedCopies(c, ck, w, used, len(missing) == 0 && cut == nil); err != nil {
		return nil, err
	}
	var unexpected []string
	for _, n := range ck.Names() {
		if c.dspark != nil && strings.HasPrefix(n, "mtp.") {
			continue // a DSpark checkpoint's drafter stages: LoadDSparkStages reads them
		}
		if !used[n] {
			if c.TieWordEmbeddings && (n == "lm_head.weight" || n == "head.weight") {
				return nil, fmt.Errorf("load weights: %s is in the checkpoint but tie_word_embeddings is true", n)
			}
			unexpected = append(unexpected, n)
		}
	}
	if len(missing) > 0 || len(unexpected) > 0 {
		return nil, fmt.Errorf("load weights: DeepseekV4ForCausalLM LOAD REPORT: MISSING %v; UNEXPECTED %v", missing, unexpected)
	}
	if cut != nil {
		return w, nil // a rank's slices: NewRankModel checks their shapes
	}
	if err := w.check(c); err != nil {
		return nil, err
	}
	return w, nil
}

// sharedCopies are tensors some V4 checkpoints carry beside the MTP head: copies of the
// embedding and the lm_head, which DeepSeek's MTPBlock shares with the main model
// (inference/model.py sets mtp.embed and mtp.head to the main model's; its convert.py
// skips the copies, vLLM and SGLang map them onto the shared tensors).
var sharedCopies = [...]struct{ name, of string }{
	{"mtp.0.emb.tok_emb.weight", "embed"},
	{"mtp.0.head.weight", "head"},
}

// checkSharedCopies marks the copies ck holds as read and, when compare is set (the
// shared tensors loaded), checks that each equals the tensor it copies: value for value,
// or as that tensor rounds to the copy's BF16 or F16. A copy that differs is an error
// naming it: the model would run the MTP head on weights other than the checkpoint's.
func checkSharedCopies(c *Config, ck *weights.Checkpoint, w *Weights, used map[string]bool, compare bool) error {
	for _, cp := range sharedCopies {
		if !ck.Has(cp.name) {
			continue
		}
		used[cp.name] = true
		if s, ok := ck.ScaleName(cp.name); ok {
			used[s] = true
		}
		if !compare {
			continue
		}
		want, of := w.Embed, "the embedding"
		if cp.of == "head" {
			want, of = w.Head, "the lm_head"
		}
		got, err := ck.Dequantize(cp.name, c.Quant, c.VocabSize, c.HiddenSize)
		if err != nil {
			return fmt.Errorf("load weights: %w", err)
		}
		info, _ := ck.Info(cp.name)
		if at := copyDiff(got, want, info.DType); at >= 0 {
			return fmt.Errorf("load weights: %s is not a copy of %s: [%d, %d] is %g there, %g in %s",
				cp.name, of, at/c.HiddenSize, at%c.HiddenSize, got[at], want[at], of)
		}
	}
	return nil
}

// copyDiff returns the first index where got (stored as dt) is not want, exactly or, for a
// 16-bit dt, as want rounds to dt; -1 when it is a copy.
func copyDiff(got, want []float32, dt weights.DType) int {
	at := -1
	for i := range got {
		if got[i] != want[i] && !(got[i] != got[i] && want[i] != want[i]) {
			at = i
			break
		}
	}
	if at < 0 || (dt != weights.BF16 && dt != weights.F16) {
		return at
	}
	raw, err := weights.EncodeFloat32(want, dt)
	if err != nil {
		return at
	}
	rounded := make([]float32, len(want))
	if weights.DecodeFloat32(rounded, raw, dt) != nil {
		return at
	}
	for i := range got {
		if got[i] != rounded[i] && !(got[i] != got[i] && rounded[i] != rounded[i]) {
			return i
		}
	}
	return -1
}

// loadParam reads p under whichever form ck holds it in, marking what it read in used
// (with the scale tensor of a quantized weight). It returns the module name when no form
// holds it.
func loadParam(ck *weights.Checkpoint, q *weights.Quant, p param, used map[string]bool) (string, error) {
	read := func(name string, shape ...int) ([]float32, error) {
		used[name] = true
		if s, ok := ck.ScaleName(name); ok {
			used[s] = true
		}
		return ck.Dequantize(name, q, shape...)
	}
	for _, name := range slices.Concat(p.names[:], p.alias) {
		if !ck.Has(name) {
			continue
		}
		used[name] = true
		if p.ints != nil {
			v, err := readInts(ck, name, p.shape)
			*p.ints = v
			return "", err
		}
		var v []float32
		var err error
		if p.part != nil {
			v, err = readPart(ck, q, name, p, used)
		} else {
			v, err = read(name, p.shape...)
		}
		if err == nil && p.keep != nil {
			per := len(v) / p.experts
			v = slices.Clone(v[p.keep[0]*per : p.keep[1]*per])
		}
		if err == nil && p.experts > 0 && p.expertPart != nil {
			v = cutExperts(v, p) // a packed tensor is read whole
		}
		*p.dst = v
		return "", err
	}
	if p.experts == 0 {
		return p.names[ModuleNames], nil
	}
	// Per-expert tensors: ffn.experts.E.{w1,w3} stacked into gate_up [E, 2I, D] (gate
	// rows then up rows), ffn.experts.E.w2 into down [E, D, I].
	for _, pat := range []string{p.names[UpstreamNames], p.names[HybridNames]} {
		first := fmt.Sprintf(pat, 0, p.expertLeaf[0])
		if !ck.Has(first) {
			continue
		}
		per := p.shape[1] * p.shape[2]
		half := []int{p.shape[1], p.shape[2]}
		if p.expertLeaf[1] != "" {
			half[0] /= 2
		}
		lo, hi := 0, p.experts
		if p.keep != nil {
			lo, hi = p.keep[0], p.keep[1]
		}
		out := make([]float32, 0, (hi-lo)*per)
		for e := range p.experts {
			for _, leaf := range p.expertLeaf {
				if leaf == "" {
					continue
				}
				name := fmt.Sprintf(pat, e, leaf)
				if !ck.Has(name) {
					return "", fmt.Errorf("load weights: %s is missing (the other experts' tensors are there)", name)
				}
				if e < lo || e >= hi {
					used[name] = true // another rank's expert: not read
					if s, ok := ck.ScaleName(name); ok {
						used[s] = true
					}
					continue
				}
				var v []float32
				var err error
				switch ep := p.expertPart; {
				case ep == nil:
					v, err = read(name, half...)
				case p.expertLeaf[1] == "": // down [D, I]: its columns
					used[name] = true
					v, err = ck.DequantizeCols(name, q, ep.lo, ep.hi, half...)
				default:
					used[name] = true
					v, err = ck.DequantizeRows(name, q, ep.lo, ep.hi, half...)
				}
				if s, ok := ck.ScaleName(name); ok {
					used[s] = true
				}
				if err != nil {
					return "", err
				}
				out = append(out, v...)
			}
		}
		*p.dst = out
		return "", nil
	}
	return p.names[ModuleNames], nil
}

// cutExperts cuts every expert of a packed tensor v ([experts, 2I, D] gate then up rows,
// or [experts, D, I]) to p.expertPart: gate and up rows, or down columns.
func cutExperts(v []float32, p param) []float32 {
	ep := p.expertPart
	n := len(v) / max(1, p.shape[1]*p.shape[2])
	var out []float32
	for e := range n {
		m := v[e*p.shape[1]*p.shape[2] : (e+1)*p.shape[1]*p.shape[2]]
		if p.expertLeaf[1] == "" { // down [D, I]
			out = append(out, columns(m, p.shape[1], p.shape[2], ep.lo, ep.hi)...)
			continue
		}
		in, d := p.shape[1]/2, p.shape[2]
		out = append(out, m[ep.lo*d:ep.hi*d]...)
		out = append(out, m[(in+ep.lo)*d:(in+ep.hi)*d]...)
	}
	return out
}

// readPart reads p.part of tensor name (p.shape whole) alone: a matrix by
// weights.Checkpoint's DequantizeRows or DequantizeCols (a quantized one by the scale
// blocks holding the range), an unquantized vector by Float32Rows; a quantized vector is
// read whole (Dequantize refuses or widens it) and cut.
func readPart(ck *weights.Checkpoint, q *weights.Quant, name string, p param, used map[string]bool) ([]float32, error) {
	pt, shape := p.part, p.shape
	used[name] = true
	s, scaled := ck.ScaleName(name)
	if scaled {
		used[s] = true
	}
	switch {
	case len(shape) == 2 && pt.cols:
		return ck.DequantizeCols(name, q, pt.lo, pt.hi, shape...)
	case len(shape) == 2:
		return ck.DequantizeRows(name, q, pt.lo, pt.hi, shape...)
	case pt.cols || len(shape) != 1:
		return nil, fmt.Errorf("load weights: %s: columns [%d, %d) of a %v tensor", name, pt.lo, pt.hi, shape)
	case scaled:
		v, err := ck.Dequantize(name, q, shape...)
		if err != nil {
			return nil, err
		}
		return slices.Clone(v[pt.lo:pt.hi]), nil
	}
	return ck.Float32Rows(name, pt.lo, pt.hi, shape...)
}

// readInts reads an integer tensor (tid2eid: I64 in transformers' checkpoints, I32
// accepted) with its shape checked.
func readInts(ck *weights.Checkpoint, name string, shape []int) ([]int32, error) {
	info, _ := ck.Info(name)
	if !slices.Equal(info.Shape, shape) {
		return nil, fmt.Errorf("tensor %q: %w: checkpoint has %v, model expects %v", name, weights.ErrShape, info.Shape, shape)
	}
	if info.DType != weights.I64 && info.DType != weights.I32 {
		return nil, fmt.Errorf("tensor %q: %w: %s, want I64 or I32", name, weights.ErrDType, info.DType)
	}
	files, _ := filepath.Glob(filepath.Join(ck.Dir, "*.safetensors"))
	for _, path := range files {
		f, err := weights.OpenFile(path)
		if err != nil {
			return nil, err
		}
		_, raw, err := f.ReadRaw(name)
		f.Close()
		if err != nil {
			continue
		}
		return weights.DecodeIDs(info.DType, raw)
	}
	return nil, fmt.Errorf("tensor %q: %w in %s", name, weights.ErrNotFound, ck.Dir)
}

// check validates values a shape cannot: tid2eid must name existing experts, k distinct
// ones a token (a token routed twice to one expert would count it twice, and overflow
// the GPU's masked MoE layout, which has room for each row once an expert).
func (w *Weights) check(c *Config) error {
	k := c.NumExpertsPerTok
	chk := func(where string, l *Layer) error {
		for i, e := range l.Tid2Eid {
			if e < 0 || int(e) >= c.NRoutedExperts {
				return fmt.Errorf("load weights: %s tid2eid[%d][%d] = %d is not an expert (n_routed_experts %d)", where, i/k, i%k, e, c.NRoutedExperts)
			}
			for j := i - i%k; j < i; j++ {
				if l.Tid2Eid[j] == e {
					return fmt.Errorf("load weights: %s tid2eid[%d] routes the token to expert %d twice (columns %d and %d): want %d distinct experts a token", where, i/k, e, j%k, i%k, k)
				}
			}
		}
		return nil
	}
	for i := range w.Layers {
		if err := chk(fmt.Sprintf("layer %d", i), &w.Layers[i]); err != nil {
			return err
		}
	}
	return nil
}

// RandomWeights returns seeded random weights for c, perturbed off transformers' init so
// that every tensor moves the logits: Linear weights N(0, 0.02)·(scaled for width), norm
// weights 1+N(0, 0.1), biases, sinks and position biases N(0, 0.1), hc scales
// 1+N(0, 0.3), tid2eid random distinct experts per token. withMTP adds an MTP head.
func RandomWeights(c *Config, seed uint64, withMTP bool) *Weights {
	w := &Weights{}
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	for _, p := range params(c, w, withMTP) {
		n := 1
		for _, d := range p.shape {
			n *= d
		}
		if p.ints != nil {
			k := p.shape[1]
			v := make([]int32, n)
			for t := range p.shape[0] {
				perm := rng.Perm(c.NRoutedExperts)
				for j := range k {
					v[t*k+j] = int32(perm[j])
				}
			}
			*p.ints = v
			continue
		}
		*p.dst = randomValues(rng, p, n)
	}
	if c.TieWordEmbeddings {
		w.Head = w.Embed
	}
	return w
}

// randomValues returns n seeded random values for p by its kind: norms near 1, biases
// and scales small around 0 and 1, weights normal (linear ones scaled to their fan-in).
func randomValues(rng *rand.Rand, p param, n int) []float32 {
	v := make([]float32, n)
	std := 0.02
	if len(p.shape) >= 2 && p.kind == initNormal {
		// Linear weights scaled to their fan-in so activations stay O(1) in tiny models.
		std = 1 / math.Sqrt(float64(p.shape[len(p.shape)-1]))
	}
	for i := range v {
		g := rng.NormFloat64()
		switch p.kind {
		case initNorm:
			v[i] = float32(1 + 0.1*g)
		case initBias:
			v[i] = float32(0.1 * g)
		case initScale:
			v[i] = float32(1 + 0.3*g)
		default:
			v[i] = float32(std * g)
		}
	}
	return v
}

// WeightBytes is the size of the weights RandomWeights builds for c (fp32, tid2eid as
// int32; a tied lm_head counted once), counted over the loader's tensor list without
// building anything.
func WeightBytes(c *Config, withMTP bool) int64 {
	var n int64
	for _, p := range params(c, &Weights{}, withMTP) {
		k := int64(4)
		for _, d := range p.shape {
			k *= int64(d)
		}
		n += k
	}
	return n
}

// Tensors returns the weights as safetensors tensors named in form, in dtype dt (tid2eid
// as I64).
func (w *Weights) Tensors(c *Config, dt weights.DType, form NameForm) ([]weights.Tensor, error) {
	var ts []weights.Tensor
	for _, p := range params(c, w, w.MTP != nil) {
		name := p.names[form]
		if p.ints != nil {
			raw := make([]byte, 8*len(*p.ints))
			for i, v := range *p.ints {
				binary.LittleEndian.PutUint64(raw[8*i:], uint64(int64(v)))
			}
			ts = append(ts, weights.Tensor{Name: name, DType: weights.I64, Shape: slices.Clone(p.shape), Data: raw})
			continue
		}
		if p.experts > 0 && strings.Contains(name, "%d") {
			per := p.shape[1] * p.shape[2]
			rows := p.shape[1]
			if p.expertLeaf[1] != "" {
				rows /= 2
			}
			for e := range p.experts {
				blk := (*p.dst)[e*per : (e+1)*per]
				for j, leaf := range p.expertLeaf {
					if leaf == "" {
						continue
					}
					t, err := weights.NewTensor(fmt.Sprintf(name, e, leaf), dt, []int{rows, p.shape[2]}, blk[j*rows*p.shape[2]:(j+1)*rows*p.shape[2]])
					if err != nil {
						return nil, err
					}
					ts = append(ts, t)
				}
			}
			continue
		}
		t, err := weights.NewTensor(name, dt, p.shape, *p.dst)
		if err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, nil
}

// Save writes the weights as dir/model.safetensors in dtype dt and name form form.
func (w *Weights) Save(c *Config, dir string, dt weights.DType, form NameForm) error {
	ts, err := w.Tensors(c, dt, form)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, map[string]string{"format": "pt"})
}

// TensorNames lists the names the model reads in form (experts expanded), for docs and
// tests.
func TensorNames(c *Config, form NameForm, withMTP bool) []string {
	w := RandomWeights(c, 1, withMTP)
	ts, _ := w.Tensors(c, weights.F32, form)
	var out []string
	for _, t := range ts {
		out = append(out, t.Name)
	}
	return out
}
