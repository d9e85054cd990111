package deepseekv4flash

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

// publishedConfigJSON is a 4-layer DeepSeek-V4-Flash in the config.json fields DeepSeek
// publishes (as the full model's: compress_ratios with the MTP layer's entry last,
// num_hash_layers, qk_rope_head_dim, rope_scaling yarn, expert_dtype at the top level, a
// quantization_config of e4m3 weights with ue8m0 scales in 128×128 blocks). hidden_size
// 192 and moe_intermediate_size 48 leave partial scale blocks and FP4 groups.
const publishedConfigJSON = `{
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 80, "hidden_size": 192, "moe_intermediate_size": 48, "num_hidden_layers": 4,
  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "qk_rope_head_dim": 16,
  "q_lora_rank": 64, "o_groups": 2, "o_lora_rank": 32, "n_routed_experts": 4,
  "n_shared_experts": 1, "num_experts_per_tok": 2, "num_hash_layers": 1,
  "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": true,
  "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "hc_mult": 4, "hc_sinkhorn_iters": 20,
  "hc_eps": 1e-06, "index_n_heads": 16, "index_head_dim": 32, "index_topk": 3,
  "sliding_window": 8, "compress_ratios": [0, 4, 128, 4, 0], "compress_rope_theta": 160000,
  "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 16,
    "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1},
  "max_position_embeddings": 4096, "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-06,
  "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "expert_dtype": "fp4",
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
    "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
}`

// pubKind is how the published checkpoint stores a tensor.
type pubKind int

const (
	pubBF16 pubKind = iota // norms, the embedding, the router, the indexer's weights_proj
	pubF32                 // hc_*, ape, attn_sink, the router bias, the head
	pubFP8                 // float8 e4m3 with an F8_E8M0 scale per 128×128 block ("X.scale")
	pubFP4                 // routed experts: e2m1 packed two per I8, F8_E8M0 scale per row per 32
	pubI64                 // tid2eid
)

// pubTensor is one tensor of the published inventory and the field of Weights it fills.
type pubTensor struct {
	name  string
	kind  pubKind
	shape []int
	dst   *[]float32
	ints  []int32
}

// publishedInventory lists the tensors of DeepSeek's inference/model.py state dict for c
// (Transformer: embed, layers.N Block, norm, head, hc_head_*; MTPBlock mtp.0), in its
// names and storage types, each with the field of w it fills. It is written out by hand
// from DeepSeek's module tree, not taken from the loader's tables, so that it checks them.
func publishedInventory(c *Config, w *Weights) []pubTensor {
	h, hc, d := c.HiddenSize, c.HCMult, c.HeadDim
	mix := (2 + hc) * hc
	block := func(p string, l *Layer, ratio int, hash bool) []pubTensor {
		ts := []pubTensor{
			{p + "attn_norm.weight", pubBF16, []int{h}, &l.AttnNorm, nil},
			{p + "ffn_norm.weight", pubBF16, []int{h}, &l.FFNNorm, nil},
			{p + "hc_attn_fn", pubF32, []int{mix, hc * h}, &l.AttnHC.Fn, nil},
			{p + "hc_attn_base", pubF32, []int{mix}, &l.AttnHC.Base, nil},
			{p + "hc_attn_scale", pubF32, []int{3}, &l.AttnHC.Scale, nil},
			{p + "hc_ffn_fn", pubF32, []int{mix, hc * h}, &l.FFNHC.Fn, nil},
			{p + "hc_ffn_base", pubF32, []int{mix}, &l.FFNHC.Base, nil},
			{p + "hc_ffn_scale", pubF32, []int{3}, &l.FFNHC.Scale, nil},
			{p + "attn.attn_sink", pubF32, []int{c.NumAttentionHeads}, &l.Sinks, nil},
			{p + "attn.wq_a.weight", pubFP8, []int{c.QLoraRank, h}, &l.QA, nil},
			{p + "attn.q_norm.weight", pubBF16, []int{c.QLoraRank}, &l.QANorm, nil},
			{p + "attn.wq_b.weight", pubFP8, []int{c.NumAttentionHeads * d, c.QLoraRank}, &l.QB, nil},
			{p + "attn.wkv.weight", pubFP8, []int{d, h}, &l.KV, nil},
			{p + "attn.kv_norm.weight", pubBF16, []int{d}, &l.KVNorm, nil},
			{p + "attn.wo_a.weight", pubFP8, []int{c.OGroups * c.OLoraRank, c.NumAttentionHeads * d / c.OGroups}, &l.OA, nil},
			{p + "attn.wo_b.weight", pubFP8, []int{h, c.OGroups * c.OLoraRank}, &l.OB, nil},
		}
		compressor := func(p string, cp *Compressor, dim int, overlap bool) []pubTensor {
			width := dim
			if overlap {
				width = 2 * dim
			}
			return []pubTensor{
				{p + "ape", pubF32, []int{ratio, width}, &cp.PositionBias, nil},
				{p + "wkv.weight", pubBF16, []int{width, h}, &cp.KV, nil},
				{p + "wgate.weight", pubBF16, []int{width, h}, &cp.Gate, nil},
				{p + "norm.weight", pubBF16, []int{dim}, &cp.Norm, nil},
			}
		}
		if ratio > 0 {
			ts = append(ts, compressor(p+"attn.compressor.", l.Compressor, d, ratio == 4)...)
		}
		if ratio == 4 {
			ix := l.Indexer
			ts = append(ts, pubTensor{p + "attn.indexer.wq_b.weight", pubFP8, []int{c.IndexNHeads * c.IndexHeadDim, c.QLoraRank}, &ix.QB, nil},
				pubTensor{p + "attn.indexer.weights_proj.weight", pubBF16, []int{c.IndexNHeads, h}, &ix.WeightsProj, nil})
			ts = append(ts, compressor(p+"attn.indexer.compressor.", &ix.Compressor, c.IndexHeadDim, true)...)
		}
		e, in := c.NRoutedExperts, c.MoEIntermediateSize
		ts = append(ts, pubTensor{p + "ffn.gate.weight", pubBF16, []int{e, h}, &l.Router, nil})
		if hash {
			ts = append(ts, pubTensor{p + "ffn.gate.tid2eid", pubI64, []int{c.VocabSize, c.NumExpertsPerTok}, nil, l.Tid2Eid})
		} else {
			ts = append(ts, pubTensor{p + "ffn.gate.bias", pubF32, []int{e}, &l.RouteBias, nil})
		}
		// Expert E's w1 (gate) and w3 (up) are GateUp[E]'s two halves, w2 is Down[E]: the
		// test splits them into sub-slices that share the packed arrays.
		for x := range e {
			gate := l.GateUp[x*2*in*h : (2*x+1)*in*h : (2*x+1)*in*h]
			up := l.GateUp[(2*x+1)*in*h : (2*x+2)*in*h : (2*x+2)*in*h]
			down := l.Down[x*h*in : (x+1)*h*in : (x+1)*h*in]
			q := fmt.Sprintf("%sffn.experts.%d.", p, x)
			ts = append(ts, pubTensor{q + "w1.weight", pubFP4, []int{in, h}, &gate, nil},
				pubTensor{q + "w2.weight", pubFP4, []int{h, in}, &down, nil},
				pubTensor{q + "w3.weight", pubFP4, []int{in, h}, &up, nil})
		}
		return append(ts,
			pubTensor{p + "ffn.shared_experts.w1.weight", pubFP8, []int{in, h}, &l.SharedGate, nil},
			pubTensor{p + "ffn.shared_experts.w2.weight", pubFP8, []int{h, in}, &l.SharedDown, nil},
			pubTensor{p + "ffn.shared_experts.w3.weight", pubFP8, []int{in, h}, &l.SharedUp, nil})
	}
	ts := []pubTensor{
		{"embed.weight", pubBF16, []int{c.VocabSize, h}, &w.Embed, nil},
		{"norm.weight", pubBF16, []int{h}, &w.Norm, nil},
		{"head.weight", pubF32, []int{c.VocabSize, h}, &w.Head, nil},
		{"hc_head_fn", pubF32, []int{hc, hc * h}, &w.HCFn, nil},
		{"hc_head_base", pubF32, []int{hc}, &w.HCBase, nil},
		{"hc_head_scale", pubF32, []int{1}, &w.HCScale, nil},
	}
	for i := range w.Layers {
		ts = append(ts, block(fmt.Sprintf("layers.%d.", i), &w.Layers[i], c.LayerRatio(i), c.MLPLayerTypes[i] == HashMoE)...)
	}
	m := w.MTP
	ts = append(ts,
		pubTensor{"mtp.0.e_proj.weight", pubFP8, []int{h, h}, &m.EProj, nil},
		pubTensor{"mtp.0.h_proj.weight", pubFP8, []int{h, h}, &m.HProj, nil},
		pubTensor{"mtp.0.enorm.weight", pubBF16, []int{h}, &m.ENorm, nil},
		pubTensor{"mtp.0.hnorm.weight", pubBF16, []int{h}, &m.HNorm, nil},
		pubTensor{"mtp.0.norm.weight", pubBF16, []int{h}, &m.Norm, nil},
		pubTensor{"mtp.0.hc_head_fn", pubF32, []int{hc, hc * h}, &m.HCFn, nil},
		pubTensor{"mtp.0.hc_head_base", pubF32, []int{hc}, &m.HCBase, nil},
		pubTensor{"mtp.0.hc_head_scale", pubF32, []int{1}, &m.HCScale, nil},
	)
	// The MTP block: compress ratio 0 (compress_ratios' last entry), learned routing.
	return append(ts, block("mtp.0.", &m.Block, 0, false)...)
}

// e4m3Positive holds the finite non-negative float8 e4m3fn values in code order (0..126),
// which is ascending.
var e4m3Positive = func() []float32 {
	var v []float32
	for code := range 127 {
		v = append(v, weights.F8E4M3ToFloat32(uint8(code)))
	}
	return v
}()

// nearestCode returns the index of the value of the ascending table nearest x (x ≥ 0).
func nearestCode(table []float32, x float32) int {
	i := sort.Search(len(table), func(i int) bool { return table[i] >= x })
	if i == len(table) {
		return i - 1
	}
	if i > 0 && x-table[i-1] <= table[i]-x {
		return i - 1
	}
	return i
}

// pow2Scale is the ue8m0 scale of a block whose largest magnitude is amax, for a format
// whose largest value is top: the power of two 2^e at or above amax/top (DeepSeek's
// ue8m0 rounding), and its E8M0 byte 127+e.
func pow2Scale(amax, top float32) (float32, byte) {
	if amax == 0 {
		return 1, 127
	}
	e := int(math.Ceil(math.Log2(float64(amax / top))))
	return float32(math.Ldexp(1, e)), byte(127 + e)
}

// quantizeFP8 stores v ([rows, cols]) as e4m3 codes with one ue8m0 scale per 128×128
// block, replacing v by the values the codes and scales encode.
func quantizeFP8(v []float32, rows, cols int) (codes, scales []byte) {
	const b = 128
	sr, sc := (rows+b-1)/b, (cols+b-1)/b
	codes, scales = make([]byte, rows*cols), make([]byte, sr*sc)
	for bi := range sr {
		for bj := range sc {
			var amax float32
			for i := bi * b; i < min((bi+1)*b, rows); i++ {
				for j := bj * b; j < min((bj+1)*b, cols); j++ {
					amax = max(amax, float32(math.Abs(float64(v[i*cols+j]))))
				}
			}
			s, sb := pow2Scale(amax, 448)
			scales[bi*sc+bj] = sb
			for i := bi * b; i < min((bi+1)*b, rows); i++ {
				for j := bj * b; j < min((bj+1)*b, cols); j++ {
					x := v[i*cols+j] / s
					code := nearestCode(e4m3Positive, float32(math.Abs(float64(x))))
					q := byte(code)
					if x < 0 {
						q |= 0x80
					}
					codes[i*cols+j] = q
					v[i*cols+j] = weights.F8E4M3ToFloat32(q) * s
				}
			}
		}
	}
	return codes, scales
}

// e2m1Positive holds the non-negative FP4 e2m1 values in code order (0..7).
var e2m1Positive = []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}

// quantizeFP4 stores v ([rows, cols], cols even) as e2m1 codes packed two per byte (low
// nibble first) with one ue8m0 scale per row per 32 columns, replacing v by the values
// they encode.
func quantizeFP4(v []float32, rows, cols int) (packed, scales []byte) {
	const g = weights.FP4Group
	sc := (cols + g - 1) / g
	packed, scales = make([]byte, rows*cols/2), make([]byte, rows*sc)
	for i := range rows {
		for gj := range sc {
			row := v[i*cols+gj*g : i*cols+min((gj+1)*g, cols)]
			var amax float32
			for _, x := range row {
				amax = max(amax, float32(math.Abs(float64(x))))
			}
			s, sb := pow2Scale(amax, 6)
			scales[i*sc+gj] = sb
			for k := range row {
				j := gj*g + k
				x := row[k] / s
				code := byte(nearestCode(e2m1Positive, float32(math.Abs(float64(x)))))
				if x < 0 {
					code |= 8
				}
				packed[(i*cols+j)/2] |= code << (4 * uint(j%2))
				row[k] = weights.E2M1ToFloat32(code) * s
			}
		}
	}
	return packed, scales
}

// publishedTensors encodes the inventory in its published storage types, replacing each
// field of w by the values its tensors encode, so that w is what the checkpoint holds.
func publishedTensors(t testing.TB, inv []pubTensor) []weights.Tensor {
	t.Helper()
	var out []weights.Tensor
	for _, p := range inv {
		scale := strings.TrimSuffix(p.name, ".weight") + ".scale"
		switch p.kind {
		case pubI64:
			raw := make([]byte, 8*len(p.ints))
			for i, v := range p.ints {
				binary.LittleEndian.PutUint64(raw[8*i:], uint64(int64(v)))
			}
			out = append(out, weights.Tensor{Name: p.name, DType: weights.I64, Shape: p.shape, Data: raw})
		case pubBF16, pubF32:
			dt := weights.BF16
			if p.kind == pubF32 {
				dt = weights.F32
			}
			x, err := weights.NewTensor(p.name, dt, p.shape, *p.dst)
			if err != nil {
				t.Fatal(err)
			}
			if err := weights.DecodeFloat32(*p.dst, x.Data, dt); err != nil {
				t.Fatal(err)
			}
			out = append(out, x)
		case pubFP8:
			codes, scales := quantizeFP8(*p.dst, p.shape[0], p.shape[1])
			out = append(out, weights.Tensor{Name: p.name, DType: weights.F8E4M3, Shape: p.shape, Data: codes},
				weights.Tensor{Name: scale, DType: weights.F8E8M0, Shape: []int{(p.shape[0] + 127) / 128, (p.shape[1] + 127) / 128}, Data: scales})
		case pubFP4:
			packed, scales := quantizeFP4(*p.dst, p.shape[0], p.shape[1])
			g := weights.FP4Group
			out = append(out, weights.Tensor{Name: p.name, DType: weights.I8, Shape: []int{p.shape[0], p.shape[1] / 2}, Data: packed},
				weights.Tensor{Name: scale, DType: weights.F8E8M0, Shape: []int{p.shape[0], (p.shape[1] + g - 1) / g}, Data: scales})
		}
	}
	return out
}

// publishedCheckpoint writes a checkpoint of c as DeepSeek publishes one (config.json as
// given, model.safetensors in the published names and storage types, with an MTP head) and
// returns its directory and the weights it holds. edit, when not nil, changes the tensors
// before they are written.
func publishedCheckpoint(t *testing.T, cfgJSON string, edit func(c *Config, w *Weights, ts []weights.Tensor) []weights.Tensor) (string, *Config, *Weights) {
	t.Helper()
	c, err := ParseConfig([]byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	w := RandomWeights(c, 11, true)
	ts := publishedTensors(t, publishedInventory(c, w))
	if edit != nil {
		ts = edit(c, w, ts)
	}
	dir := t.TempDir()
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfgJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, c, w
}

// TestPublishedCheckpoint loads a checkpoint laid out as DeepSeek publishes
// DeepSeek-V4-Flash (its inference/model.py names: attn.kv_norm, per-expert w1/w2/w3, the
// MTP block under mtp.0; fp8 e4m3 linears with ue8m0 block scales, fp4 routed experts, bf16
// norms and embedding, fp32 hc, ape, sinks, router bias and head, int64 tid2eid) through
// Load, and checks that every weight is the value the file encodes and that the logits and
// the MTP head's logits equal those of the same weights given directly.
func TestPublishedCheckpoint(t *testing.T) {
	dir, c, want := publishedCheckpoint(t, publishedConfigJSON, nil)
	r, err := Load(dir, Options{MaxContext: 512})
	if err != nil {
		t.Fatal(err)
	}
	got := r.Model
	if !reflect.DeepEqual(got.W, want) {
		t.Fatal("the loaded weights differ from the values the checkpoint encodes")
	}
	ref, err := NewModel(c, want, 512)
	if err != nil {
		t.Fatal(err)
	}
	// 140 tokens close a 128-token HCA window and cut the indexer's top 3 of 35 entries.
	toks := make([]int32, 140)
	for i := range toks {
		toks[i] = int32((i*29 + 5) % c.VocabSize)
	}
	wantLogits, streams := runChunks(t, ref, toks, []int{len(toks)})
	gotLogits, _ := runChunks(t, got, toks, []int{60, 1, 79})
	if d, at := runnertest.MaxAbsDiff(gotLogits, wantLogits); d > 1e-5 {
		t.Errorf("logits differ by %g at position %d", d, at/c.VocabSize)
	}
	row := c.HCMult * c.HiddenSize
	wantMTP, err := ref.MTPForward(ref.NewSeqState(), streams[:(len(toks)-1)*row], toks[1:])
	if err != nil {
		t.Fatal(err)
	}
	gotMTP, err := got.MTPForward(got.NewSeqState(), streams[:(len(toks)-1)*row], toks[1:])
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := runnertest.MaxAbsDiff(gotMTP, wantMTP); d != 0 {
		t.Errorf("MTP logits differ by %g", d)
	}
	if got.MinTopKMargin < 1e-5 {
		t.Errorf("indexer top-k margin %g: the fixture has near ties", got.MinTopKMargin)
	}
}

// TestPublishedKVNormNames: the KV norm loads under DeepSeek's attn.kv_norm and under
// transformers' attn.norm, in the upstream and the save_pretrained (model.) forms, and two
// names for the same norm are an error naming the second.
func TestPublishedKVNormNames(t *testing.T) {
	rename := func(from, to string) func(*Config, *Weights, []weights.Tensor) []weights.Tensor {
		return func(_ *Config, _ *Weights, ts []weights.Tensor) []weights.Tensor {
			for i := range ts {
				if strings.HasSuffix(ts[i].Name, from) {
					ts[i].Name = strings.TrimSuffix(ts[i].Name, from) + to
				}
			}
			return ts
		}
	}
	for _, tc := range []struct {
		what string
		edit func(*Config, *Weights, []weights.Tensor) []weights.Tensor
	}{
		{"transformers' attn.norm", rename("attn.kv_norm.weight", "attn.norm.weight")},
		{"save_pretrained's model.layers.N.attn.norm", func(c *Config, w *Weights, ts []weights.Tensor) []weights.Tensor {
			ts = rename("attn.kv_norm.weight", "attn.norm.weight")(c, w, ts)
			for i := range ts {
				if strings.HasPrefix(ts[i].Name, "layers.") {
					ts[i].Name = "model." + ts[i].Name
				}
			}
			return ts
		}},
		{"model.layers.N.attn.kv_norm", func(_ *Config, _ *Weights, ts []weights.Tensor) []weights.Tensor {
			for i := range ts {
				if strings.HasPrefix(ts[i].Name, "layers.") {
					ts[i].Name = "model." + ts[i].Name
				}
			}
			return ts
		}},
	} {
		dir, c, want := publishedCheckpoint(t, publishedConfigJSON, tc.edit)
		got, err := loadDir(t, c, dir)
		if err != nil {
			t.Errorf("%s: %v", tc.what, err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the loaded weights differ from the checkpoint's", tc.what)
		}
	}
	dir, c, _ := publishedCheckpoint(t, publishedConfigJSON, func(_ *Config, w *Weights, ts []weights.Tensor) []weights.Tensor {
		x, _ := weights.NewTensor("layers.2.attn.norm.weight", weights.BF16, []int{len(w.Layers[2].KVNorm)}, w.Layers[2].KVNorm)
		return append(ts, x)
	})
	if _, err := loadDir(t, c, dir); err == nil || !strings.Contains(err.Error(), "UNEXPECTED [layers.2.attn.norm.weight]") {
		t.Errorf("both attn.kv_norm and attn.norm for layer 2: err = %v, want the second unexpected", err)
	}
}

// TestPublishedSharedCopies: mtp.0.emb.tok_emb.weight and mtp.0.head.weight, the copies of
// the embedding and the head that some V4 checkpoints carry, load when they are copies
// (also the head's copy rounded to BF16), and a copy that differs is an error naming it.
func TestPublishedSharedCopies(t *testing.T) {
	copies := func(headDT weights.DType, change string) func(*Config, *Weights, []weights.Tensor) []weights.Tensor {
		return func(c *Config, w *Weights, ts []weights.Tensor) []weights.Tensor {
			emb, head := slices.Clone(w.Embed), slices.Clone(w.Head)
			switch change {
			case "mtp.0.emb.tok_emb.weight":
				emb[3*c.HiddenSize+7] += 0.5
			case "mtp.0.head.weight":
				head[c.HiddenSize] = -head[c.HiddenSize]
			}
			e, _ := weights.NewTensor("mtp.0.emb.tok_emb.weight", weights.BF16, []int{c.VocabSize, c.HiddenSize}, emb)
			h, _ := weights.NewTensor("mtp.0.head.weight", headDT, []int{c.VocabSize, c.HiddenSize}, head)
			return append(ts, e, h)
		}
	}
	for _, dt := range []weights.DType{weights.F32, weights.BF16} {
		dir, c, want := publishedCheckpoint(t, publishedConfigJSON, copies(dt, ""))
		got, err := loadDir(t, c, dir)
		if err != nil {
			t.Errorf("copies with a %s head: %v", dt, err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("copies with a %s head: the loaded weights differ from the checkpoint's", dt)
		}
	}
	for _, name := range []string{"mtp.0.emb.tok_emb.weight", "mtp.0.head.weight"} {
		dir, c, _ := publishedCheckpoint(t, publishedConfigJSON, copies(weights.F32, name))
		_, err := loadDir(t, c, dir)
		if err == nil || !strings.Contains(err.Error(), name+" is not a copy") {
			t.Errorf("%s differs from what it copies: err = %v, want an error naming it", name, err)
		}
	}
}

// unquantize replaces the FP8 tensors of ts that names match (by module, as
// notConverted does) with BF16 tensors of the values they encode, dropping their scales:
// a checkpoint that keeps those modules unquantized. The values are exact in BF16, so
// the weights the checkpoint holds do not change.
func unquantize(t *testing.T, ts []weights.Tensor, match func(module string) bool) []weights.Tensor {
	t.Helper()
	byName := map[string]weights.Tensor{}
	for _, x := range ts {
		byName[x.Name] = x
	}
	var out []weights.Tensor
	for _, x := range ts {
		module, isWeight := strings.CutSuffix(x.Name, ".weight")
		if base, ok := strings.CutSuffix(x.Name, ".scale"); ok && byName[base+".weight"].DType == weights.F8E4M3 && match(base) {
			continue
		}
		if !isWeight || x.DType != weights.F8E4M3 || !match(module) {
			out = append(out, x)
			continue
		}
		s := byName[module+".scale"]
		cols, sc := x.Shape[1], s.Shape[1]
		v := make([]float32, len(x.Data))
		for i, code := range x.Data {
			r, c := i/cols, i%cols
			v[i] = weights.F8E4M3ToFloat32(code) * float32(math.Ldexp(1, int(s.Data[(r/128)*sc+c/128])-127))
		}
		b, err := weights.NewTensor(x.Name, weights.BF16, x.Shape, v)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestPublishedNotConverted: an FP8 checkpoint whose quantization_config keeps some modules
// unquantized (ignore, modules_to_not_convert) loads them from BF16 and the rest from FP8,
// to the values the file encodes; a module the list covers but the file stores as FP8 is an
// error naming the tensor and the entry.
func TestPublishedNotConverted(t *testing.T) {
	cfg := strings.Replace(publishedConfigJSON, `"scale_fmt": "ue8m0",`,
		`"scale_fmt": "ue8m0", "ignore": ["layers.1.attn.wq_b", "re:layers\\.[0-9]+\\.ffn\\.shared_experts\\.w2"], "modules_to_not_convert": ["wo_a"],`, 1)
	kept := func(module string) bool {
		return module == "layers.1.attn.wq_b" || strings.HasSuffix(module, ".wo_a") ||
			(strings.HasPrefix(module, "layers.") && strings.HasSuffix(module, ".ffn.shared_experts.w2"))
	}
	dir, c, want := publishedCheckpoint(t, cfg, func(_ *Config, _ *Weights, ts []weights.Tensor) []weights.Tensor {
		ts = unquantize(t, ts, kept)
		n := 0
		for _, x := range ts {
			if x.DType == weights.BF16 && kept(strings.TrimSuffix(x.Name, ".weight")) {
				n++
			}
		}
		if n != 1+5+4 { // wq_b of layer 1, wo_a of 4 layers and the MTP block, w2 of 4 layers
			t.Fatalf("%d modules kept in BF16, want 10", n)
		}
		return ts
	})
	got, err := loadDir(t, c, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Error("the loaded weights differ from the checkpoint's")
	}
	dir, c, _ = publishedCheckpoint(t, cfg, func(_ *Config, _ *Weights, ts []weights.Tensor) []weights.Tensor {
		return unquantize(t, ts, func(m string) bool { return kept(m) && m != "layers.1.attn.wq_b" })
	})
	if _, err := loadDir(t, c, dir); err == nil || !strings.Contains(err.Error(), `"layers.1.attn.wq_b.weight"`) || !strings.Contains(err.Error(), `"layers.1.attn.wq_b" in modules_to_not_convert or ignore`) {
		t.Errorf("a listed module stored as FP8: err = %v, want one naming the tensor and its entry", err)
	}
}
