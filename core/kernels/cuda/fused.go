package cuda

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
)

// DType is the element type of a kernel's activations and KV cache.
type DType uint8

const (
	F32  DType = iota + 1 // float32: the reference variants
	BF16                  // bfloat16, computed in float32
)

// Size is the element size in bytes (0 for an unknown type).
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case BF16:
		return 2
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case F32:
		return "float32"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// AddRMSNorm launches the fused residual add and RMSNorm (add_rmsnorm.cu): residual +=
// x, then out = RMSNorm(residual) * w, all [rows, dim] of dt (w [dim]). It is ref.Add
// then ref.RMSNorm, the norm reading the stored (for bf16, rounded) residual.
func (k *Kernels) AddRMSNorm(c *cudart.Ctx, s *cudart.Stream, dt DType, out, residual, x, w cudart.DevicePtr, rows, dim int, eps float32) error {
	spec := &k.specs[kAddRMSNormF32]
	if dt == BF16 {
		spec = &k.specs[kAddRMSNormBF16]
	}
	if err := packAddRMSNorm(spec, dt, out, residual, x, w, rows, dim, eps); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

func packAddRMSNorm(spec *launchSpec, dt DType, out, residual, x, w cudart.DevicePtr, rows, dim int, eps float32) error {
	if err := positive("AddRMSNorm", rows, dim); err != nil {
		return err
	}
	switch dt {
	case F32:
		spec.kernel = kAddRMSNormF32
	case BF16:
		spec.kernel = kAddRMSNormBF16
	default:
		return fmt.Errorf("cuda.AddRMSNorm: unsupported element type %s", dt)
	}
	spec.grid, spec.block, spec.shared = cudart.D1(rows), cudart.D1(rowThreads), 0
	spec.args.reset().ptr(out).ptr(residual).ptr(x).ptr(w).i32(rows).i32(dim).f32(eps)
	return nil
}

// RMSNormBF16 launches ref.RMSNorm on bf16 rows: out, x [rows, dim], w [dim]; out may
// alias x.
func (k *Kernels) RMSNormBF16(c *cudart.Ctx, s *cudart.Stream, out, x, w cudart.DevicePtr, rows, dim int, eps float32) error {
	spec := &k.specs[kRMSNormBF16]
	if err := packRMSNormBF16(spec, out, x, w, rows, dim, eps); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

func packRMSNormBF16(spec *launchSpec, out, x, w cudart.DevicePtr, rows, dim int, eps float32) error {
	if err := positive("RMSNormBF16", rows, dim); err != nil {
		return err
	}
	spec.kernel = kRMSNormBF16
	spec.grid, spec.block, spec.shared = cudart.D1(rows), cudart.D1(rowThreads), 0
	spec.args.reset().ptr(out).ptr(x).ptr(w).i32(rows).i32(dim).f32(eps)
	return nil
}

// SiLUMulBF16 launches ref.SiLUMul on bf16: gateUp [rows, 2*dim] (gate first) → out
// [rows, dim].
func (k *Kernels) SiLUMulBF16(c *cudart.Ctx, s *cudart.Stream, out, gateUp cudart.DevicePtr, rows, dim int) error {
	spec := &k.specs[kSiLUMulBF16]
	if err := packSiLUMulBF16(spec, out, gateUp, rows, dim); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

func packSiLUMulBF16(spec *launchSpec, out, gateUp cudart.DevicePtr, rows, dim int) error {
	if err := positive("SiLUMulBF16", rows, dim); err != nil {
		return err
	}
	spec.kernel = kSiLUMulBF16
	spec.grid, spec.block = elementwise(rows * dim)
	spec.shared = 0
	spec.args.reset().ptr(out).ptr(gateUp).i32(rows).i32(dim)
	return nil
}

// EmbeddingBF16 launches ref.Embedding on a bf16 table: table [vocab, dim], ids [tokens]
// int32 → out [tokens, dim]; an id outside the vocabulary gives a zero row.
func (k *Kernels) EmbeddingBF16(c *cudart.Ctx, s *cudart.Stream, out, table, ids cudart.DevicePtr, tokens, dim, vocab int) error {
	spec := &k.specs[kEmbeddingBF16]
	if err := packEmbeddingBF16(spec, out, table, ids, tokens, dim, vocab); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

func packEmbeddingBF16(spec *launchSpec, out, table, ids cudart.DevicePtr, tokens, dim, vocab int) error {
	if err := positive("EmbeddingBF16", tokens, dim, vocab); err != nil {
		return err
	}
	spec.kernel = kEmbeddingBF16
	spec.grid, spec.block = elementwise(tokens * dim)
	spec.shared = 0
	spec.args.reset().ptr(out).ptr(table).ptr(ids).i32(tokens).i32(dim).i32(vocab)
	return nil
}

// RopeKV is one call of the rotary-and-cache-write kernel (rope_kv.cu): the step's
// queries and keys are rotated in place and its keys and values written into their
// kvslab pages by the plan's slot mapping. Pointers are device addresses; Q, K and V may
// be views of one fused QKV activation (QStride = KVStride = its row width).
type RopeKV struct {
	Q, K, V   cudart.DevicePtr // [Tokens, QStride] and [Tokens, KVStride] of DType
	Cache     cudart.DevicePtr // the kvslab arena (keys and values through one pointer), DType
	Positions cudart.DevicePtr // [Tokens] int32: BatchPlan.Positions
	Slots     cudart.DevicePtr // [Tokens] int64: the group's SlotMapping; negative stores nothing
	Rope      Rope             // float32 cos/sin table; Dim rotated dimensions per head
	GPTJ      bool             // interleaved pairs (2i, 2i+1) instead of NeoX's (i, i+Dim/2)
	Layout    KVSlabLayout     // in elements of DType (NewKVSlabLayoutOf)
	DType     DType
	Tokens    int
	Heads     int
	KVHeads   int
	HeadDim   int
	QStride   int // elements per token row of Q; 0 means Heads*HeadDim
	KVStride  int // elements per token row of K and V; 0 means KVHeads*HeadDim
	// PageTokens is the group's BlockTokens: slot s is token s%PageTokens of page id
	// s/PageTokens.
	PageTokens int
}

// RopeKV launches r.
func (k *Kernels) RopeKV(c *cudart.Ctx, s *cudart.Stream, r RopeKV) error {
	spec := &k.specs[kRopeKVBF16]
	if r.DType == F32 {
		spec = &k.specs[kRopeKVF32]
	}
	if err := r.pack(spec); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

func (r *RopeKV) pack(spec *launchSpec) error {
	if err := positive("RopeKV", r.Tokens, r.Heads, r.KVHeads, r.HeadDim, r.PageTokens, r.Rope.Dim, r.Rope.MaxPos); err != nil {
		return err
	}
	switch r.DType {
	case F32:
		spec.kernel = kRopeKVF32
	case BF16:
		spec.kernel = kRopeKVBF16
	default:
		return fmt.Errorf("cuda.RopeKV: unsupported element type %s", r.DType)
	}
	if r.Rope.Dim%2 != 0 || r.Rope.Dim > r.HeadDim {
		return fmt.Errorf("cuda.RopeKV: rotary dim %d must be even and at most head dim %d", r.Rope.Dim, r.HeadDim)
	}
	if r.Heads%r.KVHeads != 0 {
		return fmt.Errorf("cuda.RopeKV: %d heads is not a multiple of %d kv heads", r.Heads, r.KVHeads)
	}
	qs, kvs := r.QStride, r.KVStride
	if qs == 0 {
		qs = r.Heads * r.HeadDim
	}
	if kvs == 0 {
		kvs = r.KVHeads * r.HeadDim
	}
	if qs < r.Heads*r.HeadDim || kvs < r.KVHeads*r.HeadDim {
		return fmt.Errorf("cuda.RopeKV: row strides %d (q) and %d (k, v) are narrower than %d and %d",
			qs, kvs, r.Heads*r.HeadDim, r.KVHeads*r.HeadDim)
	}
	if r.Tokens > 1<<31-1 {
		return fmt.Errorf("cuda.RopeKV: %d tokens exceed the grid", r.Tokens)
	}
	if err := r.Layout.Check(r.PageTokens, r.KVHeads, r.HeadDim); err != nil {
		return fmt.Errorf("cuda.RopeKV: %w", err)
	}
	spec.grid, spec.block, spec.shared = cudart.D1(r.Tokens), cudart.D1(ropeThreads(r.Heads+r.KVHeads, r.Rope.Dim/2, r.KVHeads*r.HeadDim)), 0
	l := r.Layout
	spec.args.reset().ptr(r.Q).ptr(r.K).ptr(r.V).ptr(r.Cache).ptr(r.Positions).ptr(r.Slots).
		ptr(r.Rope.Cos).ptr(r.Rope.Sin).i32(r.Heads).i32(r.KVHeads).i32(r.HeadDim).i32(r.Rope.Dim).
		i32(r.Rope.MaxPos).flag(r.GPTJ).i64(int64(qs)).i64(int64(kvs)).i32(r.PageTokens).
		i64(l.SlabElems).i64(l.PageElems).i64(l.KOffset).i64(l.VOffset)
	return nil
}

// ropeThreads is the block size of rope_kv.cu: enough warps for the larger of the
// rotated pairs and the stored key (value) elements of one token, from 64 to 512.
func ropeThreads(heads, half, kvElems int) int {
	n := max(heads*half, kvElems)
	t := (n + 31) / 32 * 32
	return min(max(t, 64), 512)
}

// AddBiasBF16 launches the bias add of bias_headnorm.cu on bf16: x [rows, dim] += bias
// [dim] in place, as models/llama's addBias (a fused q|k|v bias over the QKV GEMM's rows,
// or the o projection's bias).
func (k *Kernels) AddBiasBF16(c *cudart.Ctx, s *cudart.Stream, x, bias cudart.DevicePtr, rows, dim int) error {
	spec := &k.specs[kAddBiasBF16]
	if err := packAddBiasBF16(spec, x, bias, rows, dim); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

func packAddBiasBF16(spec *launchSpec, x, bias cudart.DevicePtr, rows, dim int) error {
	if err := positive("AddBiasBF16", rows, dim); err != nil {
		return err
	}
	spec.kernel = kAddBiasBF16
	spec.grid, spec.block = elementwise(rows * dim)
	spec.shared = 0
	spec.args.reset().ptr(x).ptr(bias).i32(rows).i32(dim)
	return nil
}

// HeadRMSNorm is one call of the per-head q/k RMSNorm of bias_headnorm.cu (Qwen3's
// q_norm and k_norm, before rotary): in each of Tokens rows of Stride bf16 elements at X,
// the Heads query heads and then the KVHeads key heads, HeadDim elements each, are
// normalised in place, the query heads by QW and the key heads by KW (bf16 [HeadDim]).
// On the fused QKV activation X is its start and Stride its row width.
type HeadRMSNorm struct {
	X, QW, KW              cudart.DevicePtr
	Tokens, Heads, KVHeads int
	HeadDim                int
	Stride                 int // elements per token row; 0 means (Heads+KVHeads)*HeadDim
	Eps                    float32
}

// headNormWarps is the heads one block of the per-head RMSNorm normalises (a warp each).
const headNormWarps = 4

// HeadRMSNormBF16 launches n.
func (k *Kernels) HeadRMSNormBF16(c *cudart.Ctx, s *cudart.Stream, n HeadRMSNorm) error {
	spec := &k.specs[kHeadRMSNormBF16]
	if err := n.pack(spec); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

func (n *HeadRMSNorm) pack(spec *launchSpec) error {
	if err := positive("HeadRMSNormBF16", n.Tokens, n.Heads, n.KVHeads, n.HeadDim); err != nil {
		return err
	}
	if n.HeadDim > MaxHeadDim {
		return fmt.Errorf("cuda.HeadRMSNormBF16: head dim %d exceeds %d", n.HeadDim, MaxHeadDim)
	}
	width := (n.Heads + n.KVHeads) * n.HeadDim
	stride := n.Stride
	if stride == 0 {
		stride = width
	}
	if stride < width {
		return fmt.Errorf("cuda.HeadRMSNormBF16: row stride %d is narrower than the %d q and k elements of a token", stride, width)
	}
	rows := int64(n.Tokens) * int64(n.Heads+n.KVHeads)
	blocks := (rows + headNormWarps - 1) / headNormWarps
	if blocks > 1<<31-1 {
		return fmt.Errorf("cuda.HeadRMSNormBF16: %d heads exceed the grid", rows)
	}
	spec.kernel = kHeadRMSNormBF16
	spec.grid, spec.block, spec.shared = cudart.D1(int(blocks)), cudart.D1(headNormWarps*32), 0
	spec.args.reset().ptr(n.X).ptr(n.QW).ptr(n.KW).i32(n.Tokens).i32(n.Heads).i32(n.KVHeads).i32(n.HeadDim).
		i64(int64(stride)).f32(n.Eps)
	return nil
}
