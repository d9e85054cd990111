package cuda

import (
	"math"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
)

// paramNames returns the C parameter names of kernel entry in file, in order.
func paramNames(t *testing.T, file, entry string) []string {
	t.Helper()
	var names []string
	for _, p := range kernelParams(t, file, entry) {
		f := strings.Fields(strings.ReplaceAll(p, "*", " "))
		names = append(names, f[len(f)-1])
	}
	return names
}

// TestPackedArgsByName launches every new kernel with a distinct value for each
// parameter and checks, by the C parameter's name, that each value lands where the
// kernel reads it. TestPackingMatchesSignatures checks the kinds only, which cannot see
// two parameters of one kind swapped (heads and kv_heads, k_offset and v_offset, the
// decode workspace's two pointers): such a swap reads garbage on the GPU with no error.
func TestPackedArgsByName(t *testing.T) {
	l := KVSlabLayout{SlabElems: 1 << 30, PageElems: 1 << 20, KOffset: 3 << 16, VOffset: 5 << 16}
	pb := PagedBatch{Out: 0x1100, Q: 0x1200, KCache: 0x1300, VCache: 0x1400, QueryStart: 0x1500, SeqLens: 0x1600,
		PageTableStart: 0x1700, PageTable: 0x1800, Layout: l, Batch: 3, Tokens: 40, Heads: 24, KVHeads: 6,
		HeadDim: 96, QStride: 4000, PageTokens: 16, Scale: 0.125, Window: 700}
	rk := RopeKV{Q: 0x2100, K: 0x2200, V: 0x2300, Cache: 0x2400, Positions: 0x2500, Slots: 0x2600,
		Rope: Rope{Cos: 0x2700, Sin: 0x2800, Dim: 64, MaxPos: 8192}, GPTJ: true, Layout: l, DType: BF16,
		Tokens: 9, Heads: 24, KVHeads: 6, HeadDim: 96, QStride: 5000, KVStride: 6000, PageTokens: 32}
	sm := Sample{Tokens: 0x3100, Logprobs: 0x3200, TopIDs: 0x3300, TopLogprobs: 0x3400, Logits: 0x3500, Params: 0x3600,
		Rows: 7, Vocab: 1000, LogitsStride: 1024, MaxTop: 20, TokenMask: 0x3700, MaskStart: 0x3800, MaskWords: 32}
	split := DecodeSplit{Parts: 4, PartLen: 288}
	const work = 0x9000
	lse := uint64(work + 4*3*24*4*96)
	layout := map[string]uint64{"slab_elems": 1 << 30, "page_elems": 1 << 20, "k_offset": 3 << 16, "v_offset": 5 << 16}
	attn := map[string]uint64{"out": 0x1100, "q": 0x1200, "k_cache": 0x1300, "v_cache": 0x1400, "query_start": 0x1500,
		"seq_lens": 0x1600, "page_table_start": 0x1700, "page_table": 0x1800, "heads": 24, "kv_heads": 6,
		"head_dim": 96, "q_stride": 4000, "page_tokens": 16, "scale": uint64(math.Float32bits(0.125)), "window": 700}
	with := func(m map[string]uint64, more map[string]uint64) map[string]uint64 {
		out := map[string]uint64{}
		for _, src := range []map[string]uint64{m, more} {
			for k, v := range src {
				out[k] = v
			}
		}
		return out
	}
	var k Kernels
	check := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	check(pb.packPrefill(&k.specs[kPrefillAttention], true))
	check(pb.packDecode(&k.specs[kDecodeAttention], &k.specs[kDecodeReduce], split, work))
	check(rk.pack(&k.specs[kRopeKVBF16]))
	check(sm.pack(&k.specs[kSample]))
	vd := VerifyDrafts{Accepted: 0x3900, Sampled: 0x3a00, Drafts: 0x3b00, LogitsStart: 0x3c00, Seqs: 7}
	check(vd.pack(&k.specs[kVerifyDrafts]))
	check(packAddRMSNorm(&k.specs[kAddRMSNormBF16], BF16, 0x4100, 0x4200, 0x4300, 0x4400, 11, 4096, 1e-5))
	check(packRMSNormBF16(&k.specs[kRMSNormBF16], 0x4500, 0x4600, 0x4700, 13, 2048, 1e-6))
	check(packSiLUMulBF16(&k.specs[kSiLUMulBF16], 0x4800, 0x4900, 17, 11008))
	check(packEmbeddingBF16(&k.specs[kEmbeddingBF16], 0x4a00, 0x4b00, 0x4c00, 19, 2048, 32000))
	check(packAddBiasBF16(&k.specs[kAddBiasBF16], 0x5100, 0x5200, 23, 6144))
	hn := HeadRMSNorm{X: 0x5300, QW: 0x5400, KW: 0x5500, Tokens: 29, Heads: 32, KVHeads: 8, HeadDim: 128, Stride: 6144, Eps: 1e-6}
	check(hn.pack(&k.specs[kHeadRMSNormBF16]))
	want := map[kernelID]map[string]uint64{
		kPrefillAttention: with(with(attn, layout), map[string]uint64{"batch": 3, "skip_decode": 1}),
		kDecodeAttention: with(with(attn, layout), map[string]uint64{"part_out": work, "part_lse": lse,
			"parts": 4, "part_len": 288}),
		kDecodeReduce: {"out": 0x1100, "part_out": work, "part_lse": lse, "query_start": 0x1500, "heads": 24,
			"head_dim": 96, "parts": 4},
		kRopeKVBF16: with(layout, map[string]uint64{"q": 0x2100, "k": 0x2200, "v": 0x2300, "cache": 0x2400,
			"pos": 0x2500, "slots": 0x2600, "cos_t": 0x2700, "sin_t": 0x2800, "heads": 24, "kv_heads": 6,
			"head_dim": 96, "rot_dim": 64, "max_pos": 8192, "interleaved": 1, "q_stride": 5000,
			"kv_stride": 6000, "page_tokens": 32}),
		kSample: {"tokens": 0x3100, "logprobs": 0x3200, "top_ids": 0x3300, "top_logprobs": 0x3400,
			"logits": 0x3500, "params": 0x3600, "vocab": 1000, "logits_stride": 1024, "max_top": 20,
			"token_mask": 0x3700, "mask_start": 0x3800, "mask_words": 32},
		kVerifyDrafts: {"accepted": 0x3900, "sampled": 0x3a00, "drafts": 0x3b00, "logits_start": 0x3c00, "seqs": 7},
		kAddRMSNormBF16: {"out": 0x4100, "residual": 0x4200, "x": 0x4300, "w": 0x4400, "rows": 11, "dim": 4096,
			"eps": uint64(math.Float32bits(1e-5))},
		kRMSNormBF16: {"out": 0x4500, "x": 0x4600, "w": 0x4700, "rows": 13, "dim": 2048,
			"eps": uint64(math.Float32bits(1e-6))},
		kSiLUMulBF16:   {"out": 0x4800, "gate_up": 0x4900, "rows": 17, "dim": 11008},
		kEmbeddingBF16: {"out": 0x4a00, "table": 0x4b00, "ids": 0x4c00, "tokens": 19, "dim": 2048, "vocab": 32000},
		kAddBiasBF16:   {"x": 0x5100, "bias": 0x5200, "rows": 23, "dim": 6144},
		kHeadRMSNormBF16: {"x": 0x5300, "q_w": 0x5400, "k_w": 0x5500, "tokens": 29, "heads": 32, "kv_heads": 8,
			"head_dim": 128, "stride": 6144, "eps": uint64(math.Float32bits(1e-6))},
	}
	for id, vals := range want {
		n := kernelNames[id]
		names := paramNames(t, n.file, n.entry)
		spec := &k.specs[id]
		if spec.args.n != len(names) {
			t.Errorf("%s: %d arguments packed for %d parameters", n.entry, spec.args.n, len(names))
			continue
		}
		seen := 0
		for i, name := range names {
			v, ok := vals[name]
			if !ok {
				t.Errorf("%s: parameter %q has no expected value in the test", n.entry, name)
				continue
			}
			seen++
			if got := spec.args.vals[i]; got != v {
				t.Errorf("%s: parameter %d (%s) packed as %#x, want %#x", n.entry, i, name, got, v)
			}
		}
		if seen != len(vals) {
			t.Errorf("%s: the test expects %d parameters, the kernel names %d of them", n.entry, len(vals), seen)
		}
	}
	// The grids that go with them.
	if g := k.specs[kDecodeAttention].grid; g != (cudart.Dim3{X: 6, Y: 3, Z: 4}) {
		t.Errorf("decode grid %+v: want kv heads × sequences × partitions", g)
	}
	// One warp per head: 29 tokens × 40 heads over blocks of 4 warps.
	if g, b := k.specs[kHeadRMSNormBF16].grid, k.specs[kHeadRMSNormBF16].block; g != cudart.D1(29*40/4) || b != cudart.D1(4*32) {
		t.Errorf("head rmsnorm grid %+v, block %+v: want a warp per head, 4 per block", g, b)
	}
	if g := k.specs[kPrefillAttention].grid; g != (cudart.Dim3{X: 40/16 + 3, Y: 24, Z: 1}) {
		t.Errorf("prefill grid %+v: want tiles × heads", g)
	}
}
