package cuda

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/cudart"
)

// Shapes of quant_linear.cu.
const (
	FP8Group      = 128 // RESIN_QL_GROUP: columns per activation scale, rows and columns per weight scale
	MXFP4Group    = 32  // inputs per ue8m0 scale of an MXFP4 weight row
	qlTileRows    = 16  // RESIN_QL_TM
	qlTileCols    = 64  // RESIN_QL_TN
	qlThreads     = 256 // RESIN_QL_THREADS
	fp8QuantBlock = FP8Group
)

// FP8Quant is one call of resin_fp8_quant_{f32,bf16}: each row of X [Rows, Cols] quantised
// per group of FP8Group columns to float8 e4m3 in Q [Rows, Cols] bytes, with the group's
// scale amax/448 (a power of two, rounded up, when Pow2) at Scale[g·ScaleLD + row]: the
// outer-dimension-major layout cuBLASLt's VEC128_32F operand takes, and FP8Gemm reads.
// Cols need not be a multiple of FP8Group (the last group is partial). ScaleLD is at
// least Rows (0 means Rows); Scale holds ceil(Cols/FP8Group)·ScaleLD float32s.
type FP8Quant struct {
	Q, Scale, X cudart.DevicePtr
	Rows, Cols  int
	ScaleLD     int
	BF16        bool // X is bf16 (else float32)
	Pow2        bool // ue8m0 scales, as DeepSeek's act_quant with scale_fmt "ue8m0"
}

func (q *FP8Quant) pack(spec *launchSpec) error {
	if err := positive("FP8Quant", q.Rows, q.Cols, q.Rows*q.Cols); err != nil {
		return err
	}
	ld := q.ScaleLD
	if ld == 0 {
		ld = q.Rows
	}
	if ld < q.Rows {
		return fmt.Errorf("cuda.FP8Quant: scale leading dimension %d below %d rows", ld, q.Rows)
	}
	groups := (q.Cols + FP8Group - 1) / FP8Group
	if groups > 1<<16-1 {
		return fmt.Errorf("cuda.FP8Quant: %d column groups exceed the grid's 65535", groups)
	}
	spec.kernel = kFP8QuantF32
	if q.BF16 {
		spec.kernel = kFP8QuantBF16
	}
	spec.grid, spec.block, spec.shared = cudart.Dim3{X: uint32(q.Rows), Y: uint32(groups), Z: 1}, cudart.D1(fp8QuantBlock), 0
	spec.args.reset().ptr(q.Q).ptr(q.Scale).ptr(q.X).i32(q.Rows).i32(q.Cols).i32(ld).flag(q.Pow2)
	return nil
}

// FP8Quant launches the activation quantisation.
func (k *Kernels) FP8Quant(c *cudart.Ctx, s *cudart.Stream, q FP8Quant) error {
	id := kFP8QuantF32
	if q.BF16 {
		id = kFP8QuantBF16
	}
	spec := &k.specs[id]
	if err := q.pack(spec); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

// FP8Gemm is one call of resin_fp8_block_gemm_{f32,bf16}, the block-scaled FP8 GEMM for
// GPUs or cuBLASLt versions without CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F:
//
//	Out[i, j] = Σ_g (Σ_{k in group g} e4m3(XQ[i,k])·e4m3(WQ[j,k])) · XScale[g·XScaleLD + i] · WScale[(j/128)·ceil(K/128) + g]
//
// XQ [M, K] and XScale are FP8Quant's; WQ [N, K] e4m3 and WScale [ceil(N/128), ceil(K/128)]
// float32 are the checkpoint's weight and weight_scale_inv as stored (ue8m0 scales widened
// to float32). Each group's sum is float32 over k in order and the groups are added in
// order; Out is [M, N] float32, or bf16 rounded to nearest even.
//
// With Experts > 1 it is the grouped GEMM of FP8 experts over the masked layout
// (MaskedMoE): XQ [Experts·M, K] (FP8Quant over MoEGather's XE), WQ [Experts, N, K],
// WScale [Experts, ceil(N/128), ceil(K/128)], Out [Experts·M, N]; expert e's rows past
// Counts[e] (every row when Counts is 0) are zeros and read no weights.
type FP8Gemm struct {
	Out, XQ, XScale, WQ, WScale cudart.DevicePtr
	Counts                      cudart.DevicePtr // [Experts] int32, or 0
	M, N, K                     int              // M: the rows of each expert
	Experts                     int              // 0 means 1
	XScaleLD                    int              // 0 means Experts·M
	OutBF16                     bool
}

func (g *FP8Gemm) pack(spec *launchSpec) error {
	experts := max(g.Experts, 1)
	rows := experts * g.M
	if err := positive("FP8Gemm", g.M, g.N, g.K, rows, rows*g.K, g.N*g.K, rows*g.N); err != nil {
		return err
	}
	ld := g.XScaleLD
	if ld == 0 {
		ld = rows
	}
	if ld < rows {
		return fmt.Errorf("cuda.FP8Gemm: activation scale leading dimension %d below %d rows", ld, rows)
	}
	gx, gy := (g.N+qlTileCols-1)/qlTileCols, (g.M+qlTileRows-1)/qlTileRows
	if gy > 1<<16-1 || experts > 1<<16-1 {
		return fmt.Errorf("cuda.FP8Gemm: %d rows of %d experts exceed the grid", g.M, experts)
	}
	spec.kernel = kFP8GemmF32
	if g.OutBF16 {
		spec.kernel = kFP8GemmBF16
	}
	spec.grid, spec.block, spec.shared = cudart.Dim3{X: uint32(gx), Y: uint32(gy), Z: uint32(experts)}, cudart.D1(qlThreads), 0
	spec.args.reset().ptr(g.Out).ptr(g.XQ).ptr(g.XScale).ptr(g.WQ).ptr(g.WScale).ptr(g.Counts).i32(g.M).i32(g.N).i32(g.K).i32(ld)
	return nil
}

// FP8Gemm launches the fallback block-scaled FP8 GEMM.
func (k *Kernels) FP8Gemm(c *cudart.Ctx, s *cudart.Stream, g FP8Gemm) error {
	id := kFP8GemmF32
	if g.OutBF16 {
		id = kFP8GemmBF16
	}
	spec := &k.specs[id]
	if err := g.pack(spec); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

// MXFP4Gemm is one call of resin_mxfp4_gemm_{f32,bf16}, W4A16 over MXFP4 weights kept
// packed: for each expert e and row i below Counts[e] (every row when Counts is 0),
//
//	Out[e, i, j] = Σ_k bf16(X[e,i,k]) · e2m1(W[e,j,k]) · 2^(Scale[e,j,k/32] − 127)
//
// in float32 with k in order, and zeros in the rows past the count (an empty expert costs
// one pass of zero writes, no weight reads). X is [Experts, MaxRows, K] float32 (rounded
// to bf16 as it is read) or bf16, MoEGather's XE as it is; W is [Experts, N, K/2] bytes
// (element 2c of a row in the low nibble of byte c, core/weights.DequantFP4's order);
// Scale is [Experts, N, ceil(K/32)] ue8m0 bytes, the checkpoint's; Out is [Experts,
// MaxRows, N] float32, the YE MoECombine reads. One plain linear is Experts 1, MaxRows
// the rows, Counts 0.
type MXFP4Gemm struct {
	Out, X, W, Scale cudart.DevicePtr
	Counts           cudart.DevicePtr // [Experts] int32 (MaskedMoE's), or 0
	Experts, MaxRows int
	N, K             int
	BF16             bool // X is bf16 (else float32)
}

func (g *MXFP4Gemm) pack(spec *launchSpec) error {
	if err := positive("MXFP4Gemm", g.Experts, g.MaxRows, g.N, g.K, g.Experts*g.MaxRows*g.K, g.N*g.K, g.Experts*g.MaxRows*g.N); err != nil {
		return err
	}
	if g.K%2 != 0 {
		return fmt.Errorf("cuda.MXFP4Gemm: K %d must be even (two e2m1 codes per byte)", g.K)
	}
	gx, gy := (g.N+qlTileCols-1)/qlTileCols, (g.MaxRows+qlTileRows-1)/qlTileRows
	if gy > 1<<16-1 || g.Experts > 1<<16-1 {
		return fmt.Errorf("cuda.MXFP4Gemm: %d rows of %d experts exceed the grid", g.MaxRows, g.Experts)
	}
	spec.kernel = kMXFP4GemmF32
	if g.BF16 {
		spec.kernel = kMXFP4GemmBF16
	}
	spec.grid, spec.block, spec.shared = cudart.Dim3{X: uint32(gx), Y: uint32(gy), Z: uint32(g.Experts)}, cudart.D1(qlThreads), 0
	spec.args.reset().ptr(g.Out).ptr(g.X).ptr(g.W).ptr(g.Scale).ptr(g.Counts).i32(g.MaxRows).i32(g.N).i32(g.K)
	return nil
}

// MXFP4Gemm launches the W4A16 GEMM.
func (k *Kernels) MXFP4Gemm(c *cudart.Ctx, s *cudart.Stream, g MXFP4Gemm) error {
	id := kMXFP4GemmF32
	if g.BF16 {
		id = kMXFP4GemmBF16
	}
	spec := &k.specs[id]
	if err := g.pack(spec); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

func packCastBF16(spec *launchSpec, out, x cudart.DevicePtr, n int) error {
	if err := positive("CastBF16", n); err != nil {
		return err
	}
	spec.kernel = kCastBF16
	spec.grid, spec.block = elementwise(n)
	spec.shared = 0
	spec.args.reset().ptr(out).ptr(x).i64(int64(n))
	return nil
}

// CastBF16 launches out [n] bf16 = x [n] float32 rounded to nearest even (NaN stays NaN).
func (k *Kernels) CastBF16(c *cudart.Ctx, s *cudart.Stream, out, x cudart.DevicePtr, n int) error {
	spec := &k.specs[kCastBF16]
	if err := packCastBF16(spec, out, x, n); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

// Float32ToE4M3 rounds v to the nearest float8 e4m3fn byte (ties to even), saturating at
// ±448 and NaN to 0x7f: resin_f32_to_e4m3 on the host, the inverse of
// weights.F8E4M3ToFloat32 on its values.
func Float32ToE4M3(v float32) byte {
	u := math.Float32bits(v)
	sign := byte(u>>24) & 0x80
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000:
		return 0x7f
	case a >= 0x43e00000: // |v| >= 448
		return sign | 0x7e
	case a < 0x3c800000: // below 2^-6: m·2^-9
		q := math.Float32frombits(a) * 512
		m := uint32(q)
		if frac := q - float32(m); frac > 0.5 || (frac == 0.5 && m&1 == 1) {
			m++
		}
		return sign | byte(m)
	}
	r := (a>>23-120)<<3 | (a&0x7fffff)>>20
	if rem := a & 0xfffff; rem > 0x80000 || (rem == 0x80000 && r&1 == 1) {
		r++
	}
	return sign | byte(r)
}

// QuantizeFP8Host is FP8Quant on the host, its specification: x [rows, cols] float32 into
// q [rows, cols] e4m3 and scale [ceil(cols/FP8Group), scaleLD] (scaleLD 0 means rows).
func QuantizeFP8Host(q []byte, scale, x []float32, rows, cols, scaleLD int, pow2 bool) error {
	if scaleLD == 0 {
		scaleLD = rows
	}
	groups := (cols + FP8Group - 1) / FP8Group
	if rows < 0 || cols < 0 || scaleLD < rows || len(x) != rows*cols || len(q) != rows*cols || len(scale) < groups*scaleLD {
		return fmt.Errorf("cuda.QuantizeFP8Host: [%d, %d] with scale stride %d: %d inputs, %d outputs, %d scales", rows, cols, scaleLD, len(x), len(q), len(scale))
	}
	for r := range rows {
		for g := range groups {
			row := x[r*cols+g*FP8Group : r*cols+min((g+1)*FP8Group, cols)]
			amax := float32(0)
			for _, v := range row {
				if a := float32(math.Abs(float64(v))); a > amax { // NaN never compares greater
					amax = a
				}
			}
			s := float32(1)
			if amax > 0 {
				s = amax / 448
				if b := math.Float32bits(s); pow2 && b&0x7fffff != 0 {
					s = math.Float32frombits((b + 0x800000) & 0x7f800000)
				}
			}
			for i, v := range row {
				q[r*cols+g*FP8Group+i] = Float32ToE4M3(v / s)
			}
			scale[g*scaleLD+r] = s
		}
	}
	return nil
}
