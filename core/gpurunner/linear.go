package gpurunner

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/weights"
)

// Linear weights as a checkpoint ships them, on the device. A model's GPU runner (the
// first users are models/deepseek-v4-flash's gpu_linear.go and models/glm-5-flash) makes
// one Linears per device and uploads each weight through it; Forward then runs
// out [n, Out] float32 = x [n, In] float32 · Wᵀ the way the weight's type asks:
//
//	LinearF32       cuBLASLt f32 GEMM                                     4 bytes a weight
//	LinearBF16      x cast to bf16 (cuda.CastBF16), cuBLASLt bf16 GEMM    2 bytes
//	LinearFP8Block  x quantised to e4m3 per row and 128 columns (cuda.FP8Quant), then
//	                cuBLASLt's block-scaled FP8 GEMM (cudart.MatMulFP8Block) where
//	                cudart.BlockScaledFP8 says the device and library have it (cuBLASLt
//	                12.9+ on sm_90), else the fallback kernel cuda.FP8Gemm; both compute
//	                the same product                                       1 byte + 4/16384
//	LinearMXFP4     W4A16 (cuda.MXFP4Gemm): x rounded to bf16, e2m1 codes and ue8m0
//	                scales decoded in registers                           0.5 + 1/32 byte
//
// No weight is dequantised on the device: an FP8 linear of the checkpoint costs what it
// weighs on disk (the scale tensor included), and so does an expert bank. Experts runs an
// MXFP4 bank (W4A16) or an FP8 bank (the rows quantised, then cuda.FP8Gemm grouped over
// the experts) over the masked expert layout of cuda.MaskedMoE (XE in, YE out), so routed
// experts stay packed and graph-safe (no host round trip).
//
// Linears.Describe names the paths that run, for a runner's startup log or `resin doctor`:
// for example "fp8-block128: cuBLASLt VEC128×BLK128x128 (cuBLASLt 120904 on sm_90)" or
// "fp8-block128: resin_fp8_block_gemm (cuBLASLt's VEC128/BLK128x128 FP8 modes need
// compute capability 9.0, the device is 8.0)".
//
// For GLM-5.3-Flash's runner (issue 23): build a Linears with NewLinears once (MaxRows
// the most tokens a forward takes, MaxIn the widest input of an FP8 or bf16 linear), read
// each FP8 weight with a PackedReader (ReadFP8, with the model's Quant) and upload it with
// UploadFP8; KDA projections, which the checkpoint keeps bf16, go through ReadBF16 and
// UploadBF16 (or UploadF32). Routed experts in MXFP4 come from ReadMXFP4 → UploadMXFP4
// and run with Experts between cuda.MoEGather and cuda.MoECombine. A runner that owns its
// device memory (an arena) passes LinearOptions.Alloc and uploads into it, describing
// each weight with LinearAt, as models/deepseek-v4-flash's gpu_linear.go does.
//
// Not yet checked on a GPU (none was lent): the scale tensor layouts handed to cuBLASLt
// (activations' outer-dimension-major, the weight's [ceil(Out/128), ceil(In/128)] as the
// checkpoint stores it) are those PyTorch's _scaled_mm checks before calling cuBLASLt,
// and the emulated cuBLASLt implements them; scripts/gpu-check.sh should compare
// MatMulFP8Block with cuda.FP8Gemm on sm_90 before the cuBLASLt path is trusted. The fallback and W4A16
// kernels are plain tiled float32 FMA loops (no tensor cores): correct first cuts.
type Linears struct {
	blas *cudart.Blas
	k    *cuda.Kernels
	opt  LinearOptions
	fp8  FP8Path // the resolved path (never FP8Auto)
	why  string

	xq, xs, xb cudart.Buffer // quantised activations, their scales, the bf16 cast
	used       map[LinearDType]bool
}

// LinearDType is the element type a Linear keeps its weight in on the device.
type LinearDType int

const (
	LinearF32      LinearDType = iota // float32
	LinearBF16                        // bf16
	LinearFP8Block                    // float8 e4m3, one float32 scale per 128×128 block
	LinearMXFP4                       // e2m1 pairs, one ue8m0 scale per 32 inputs
)

func (d LinearDType) String() string {
	switch d {
	case LinearF32:
		return "f32"
	case LinearBF16:
		return "bf16"
	case LinearFP8Block:
		return "fp8-block128"
	case LinearMXFP4:
		return "mxfp4"
	}
	return fmt.Sprintf("lineardtype(%d)", int(d))
}

// FP8Path chooses how a LinearFP8Block GEMM runs.
type FP8Path int

const (
	FP8Auto     FP8Path = iota // cuBLASLt where cudart.BlockScaledFP8 allows, else the kernel
	FP8CuBLASLt                // cuBLASLt's block-scaled modes (an error where the library refuses them)
	FP8Kernel                  // the fallback kernel, cuda.FP8Gemm
)

func (p FP8Path) String() string {
	return [...]string{"auto", "cuBLASLt VEC128×BLK128x128", "resin_fp8_block_gemm"}[p]
}

// LinearOptions size a Linears' scratch: MaxRows the most rows (tokens) one Forward
// takes, MaxIn the widest input of its FP8 and bf16 linears. FP8 picks the FP8 path
// (FP8Auto by default); Pow2Scales quantises activations with power-of-two scales, as
// DeepSeek's act_quant with scale_fmt "ue8m0" does.
type LinearOptions struct {
	MaxRows, MaxIn int
	FP8            FP8Path
	Pow2Scales     bool
	// Alloc, when set, provides the scratch (a runner's own arena, freed with it); Close
	// then frees nothing.
	Alloc func(c *cudart.Ctx, bytes int64) (cudart.DevicePtr, error)
}

// NewLinears returns the linears of one device: blas and k are the device's cuBLASLt
// handle and shared kernels. Its scratch is MaxRows·MaxIn bytes of e4m3 activations,
// their scales (4·MaxRows·ceil(MaxIn/128) bytes) and a bf16 copy of the input
// (2·MaxRows·MaxIn bytes). It must run inside Device.Do; Close frees the scratch.
func NewLinears(c *cudart.Ctx, d *cudart.Device, blas *cudart.Blas, k *cuda.Kernels, opt LinearOptions) (*Linears, error) {
	if blas == nil || k == nil {
		return nil, fmt.Errorf("gpurunner: linears need a cuBLASLt handle and the shared kernels")
	}
	if opt.MaxRows <= 0 || opt.MaxIn <= 0 {
		return nil, fmt.Errorf("gpurunner: linears of %d rows × %d inputs: both must be positive", opt.MaxRows, opt.MaxIn)
	}
	l := &Linears{blas: blas, k: k, opt: opt, used: map[LinearDType]bool{}}
	switch opt.FP8 {
	case FP8Auto:
		ok, why := cudart.BlockScaledFP8(d)
		l.fp8, l.why = FP8Kernel, why
		if ok {
			l.fp8 = FP8CuBLASLt
		}
	case FP8CuBLASLt, FP8Kernel:
		l.fp8, l.why = opt.FP8, "chosen"
	default:
		return nil, fmt.Errorf("gpurunner: unknown FP8 path %d", opt.FP8)
	}
	n := int64(opt.MaxRows) * int64(opt.MaxIn)
	groups := int64(opt.MaxIn+cuda.FP8Group-1) / cuda.FP8Group
	var err error
	for _, b := range []struct {
		dst  *cudart.Buffer
		size int64
	}{{&l.xq, n}, {&l.xs, 4 * groups * int64(opt.MaxRows)}, {&l.xb, 2 * n}} {
		if opt.Alloc != nil {
			b.dst.Size = b.size
			b.dst.Ptr, err = opt.Alloc(c, b.size)
		} else {
			*b.dst, err = c.Alloc(b.size)
		}
		if err != nil {
			l.Close(c)
			return nil, fmt.Errorf("gpurunner: linear scratch: %w", err)
		}
	}
	return l, nil
}

// Close frees the scratch (inside Device.Do) unless LinearOptions.Alloc provided it.
func (l *Linears) Close(c *cudart.Ctx) {
	if l.opt.Alloc != nil {
		return
	}
	for _, b := range []*cudart.Buffer{&l.xq, &l.xs, &l.xb} {
		if b.Ptr != 0 {
			c.Free(*b)
			*b = cudart.Buffer{}
		}
	}
}

// FP8Path is the path LinearFP8Block GEMMs take, and why.
func (l *Linears) FP8Path() (FP8Path, string) { return l.fp8, l.why }

// Describe names the weight types uploaded so far and the path each runs, one per line
// in the order of LinearDType.
func (l *Linears) Describe() string {
	var s string
	for d := LinearF32; d <= LinearMXFP4; d++ {
		if !l.used[d] {
			continue
		}
		if s != "" {
			s += "\n"
		}
		switch d {
		case LinearF32:
			s += "f32: cuBLASLt f32"
		case LinearBF16:
			s += "bf16: cuBLASLt bf16 (inputs cast to bf16)"
		case LinearFP8Block:
			s += fmt.Sprintf("fp8-block128: %v (%s)", l.fp8, l.why)
		case LinearMXFP4:
			s += "mxfp4: resin_mxfp4_gemm W4A16"
		}
	}
	if s == "" {
		return "no linears"
	}
	return s
}

// Linear is one weight [Out, In] (Experts of them for an MXFP4 or FP8 bank) on the device.
type Linear struct {
	DType    LinearDType
	Out, In  int
	Experts  int // 1 but for a bank
	w, scale cudart.Buffer
	borrowed bool // LinearAt's: the caller owns the memory
}

// Bytes is the device memory the weight takes, scales included.
func (w *Linear) Bytes() int64 { return w.w.Size + w.scale.Size }

// Free releases the weight (inside Device.Do); a LinearAt's memory is the caller's.
func (w *Linear) Free(c *cudart.Ctx) {
	if w.borrowed {
		*w = Linear{}
		return
	}
	for _, b := range []*cudart.Buffer{&w.w, &w.scale} {
		if b.Ptr != 0 {
			c.Free(*b)
			*b = cudart.Buffer{}
		}
	}
}

// Weight returns the device address of the weight's elements and of its scales (0 for
// f32 and bf16), for callers that launch a kernel over them directly.
func (w *Linear) Weight() (elems, scales cudart.DevicePtr) { return w.w.Ptr, w.scale.Ptr }

func upload[T any](c *cudart.Ctx, v []T, size int64) (cudart.Buffer, error) {
	b, err := c.Alloc(size)
	if err != nil {
		return cudart.Buffer{}, err
	}
	if err := cudart.Upload(c, b.Ptr, v); err != nil {
		c.Free(b)
		return cudart.Buffer{}, err
	}
	return b, nil
}

// LinearAt describes a weight the caller uploaded into memory of its own, laid out as the
// Upload of its type lays it out: elems [experts, out, in] in the type's encoding (bf16
// bits, e4m3 bytes, packed e2m1 pairs) and scales as PackedFP8's float32s or
// PackedMXFP4's ue8m0 bytes (0 for f32 and bf16). Free leaves the memory alone.
func (l *Linears) LinearAt(d LinearDType, out, in, experts int, elems, scales cudart.DevicePtr) (*Linear, error) {
	if out <= 0 || in <= 0 || experts <= 0 || elems == 0 {
		return nil, fmt.Errorf("gpurunner: %v weight %d × [%d, %d] at %#x", d, experts, out, in, uint64(elems))
	}
	if experts != 1 && d != LinearMXFP4 && d != LinearFP8Block {
		return nil, fmt.Errorf("gpurunner: a bank of %d %v experts (only MXFP4 and FP8 banks run as one)", experts, d)
	}
	n := int64(experts) * int64(out) * int64(in)
	var wb, sb int64
	switch d {
	case LinearF32:
		wb = 4 * n
	case LinearBF16:
		wb = 2 * n
	case LinearFP8Block:
		wb, sb = n, 4*int64(experts)*int64((out+127)/128)*int64((in+127)/128)
	case LinearMXFP4:
		if in%2 != 0 {
			return nil, fmt.Errorf("gpurunner: mxfp4 weight of %d inputs (must be even)", in)
		}
		wb, sb = n/2, int64(experts)*int64(out)*int64((in+cuda.MXFP4Group-1)/cuda.MXFP4Group)
	default:
		return nil, fmt.Errorf("gpurunner: unknown linear type %v", d)
	}
	if sb > 0 && scales == 0 {
		return nil, fmt.Errorf("gpurunner: %v weight without its scales", d)
	}
	if (d == LinearBF16 || d == LinearFP8Block) && in > l.opt.MaxIn {
		return nil, fmt.Errorf("gpurunner: %v weight of %d inputs, the linears' scratch takes %d", d, in, l.opt.MaxIn)
	}
	l.used[d] = true
	return &Linear{DType: d, Out: out, In: in, Experts: experts, w: cudart.Buffer{Ptr: elems, Size: wb},
		scale: cudart.Buffer{Ptr: scales, Size: sb}, borrowed: true}, nil
}

// UploadF32 uploads a float32 weight [out, in].
func (l *Linears) UploadF32(c *cudart.Ctx, w []float32, out, in int) (*Linear, error) {
	if out <= 0 || in <= 0 || len(w) != out*in {
		return nil, fmt.Errorf("gpurunner: f32 weight [%d, %d] from %d values", out, in, len(w))
	}
	b, err := upload(c, w, 4*int64(len(w)))
	if err != nil {
		return nil, err
	}
	l.used[LinearF32] = true
	return &Linear{DType: LinearF32, Out: out, In: in, Experts: 1, w: b}, nil
}

// UploadBF16 uploads a weight [out, in] rounded to bf16 (h holds the bf16 bits, as a
// checkpoint stores them).
func (l *Linears) UploadBF16(c *cudart.Ctx, h []uint16, out, in int) (*Linear, error) {
	if out <= 0 || in <= 0 || len(h) != out*in {
		return nil, fmt.Errorf("gpurunner: bf16 weight [%d, %d] from %d values", out, in, len(h))
	}
	if in > l.opt.MaxIn {
		return nil, fmt.Errorf("gpurunner: bf16 weight of %d inputs, the linears' scratch takes %d", in, l.opt.MaxIn)
	}
	b, err := upload(c, h, 2*int64(len(h)))
	if err != nil {
		return nil, err
	}
	l.used[LinearBF16] = true
	return &Linear{DType: LinearBF16, Out: out, In: in, Experts: 1, w: b}, nil
}

// PackedFP8 is a block-scaled FP8 weight as the checkpoint stores it: W [Out, In] e4m3
// bytes, Scale [ceil(Out/128), ceil(In/128)] float32 (weight_scale_inv, ue8m0 or float
// scales widened), row-major; a bank of Experts (> 1) is [Experts, Out, In] and [Experts,
// ceil(Out/128), ceil(In/128)] (a fused experts tensor as stored).
type PackedFP8 struct {
	Out, In int
	Experts int // 0 or 1: one linear
	W       []byte
	Scale   []float32
}

// Check validates the sizes.
func (p *PackedFP8) Check() error {
	e := max(p.Experts, 1)
	if p.Out <= 0 || p.In <= 0 || p.Experts < 0 {
		return fmt.Errorf("fp8 weight %d × [%d, %d]: dimensions must be positive", e, p.Out, p.In)
	}
	sr, sc := (p.Out+127)/128, (p.In+127)/128
	if len(p.W) != e*p.Out*p.In || len(p.Scale) != e*sr*sc {
		return fmt.Errorf("fp8 weight %d × [%d, %d] needs %d bytes and %d scales (%d × [%d, %d]), has %d and %d", e, p.Out, p.In,
			e*p.Out*p.In, e*sr*sc, e, sr, sc, len(p.W), len(p.Scale))
	}
	return nil
}

// UploadFP8 uploads an FP8 weight as it is: Out·In bytes and its scales. cuBLASLt's FP8
// GEMMs need In and Out multiples of 16 and rows of ceil(In/128) scales that fill 16 bytes
// (cudart.FP8BlockGemm): a weight without them runs the fallback kernel.
func (l *Linears) UploadFP8(c *cudart.Ctx, p PackedFP8) (*Linear, error) {
	if err := p.Check(); err != nil {
		return nil, fmt.Errorf("gpurunner: %w", err)
	}
	if p.In > l.opt.MaxIn {
		return nil, fmt.Errorf("gpurunner: fp8 weight of %d inputs, the linears' scratch takes %d", p.In, l.opt.MaxIn)
	}
	w, err := upload(c, p.W, int64(len(p.W)))
	if err != nil {
		return nil, err
	}
	s, err := upload(c, p.Scale, 4*int64(len(p.Scale)))
	if err != nil {
		c.Free(w)
		return nil, err
	}
	l.used[LinearFP8Block] = true
	return &Linear{DType: LinearFP8Block, Out: p.Out, In: p.In, Experts: max(p.Experts, 1), w: w, scale: s}, nil
}

// PackedMXFP4 is an MXFP4 weight bank as the checkpoint stores it: W [Experts, Out, In/2]
// bytes (element 2c of a row in the low nibble of byte c), Scale [Experts, Out,
// ceil(In/32)] ue8m0 bytes. One linear is Experts 1.
type PackedMXFP4 struct {
	Experts, Out, In int
	W, Scale         []byte
}

// Check validates the sizes.
func (p *PackedMXFP4) Check() error {
	if p.Experts <= 0 || p.Out <= 0 || p.In <= 0 || p.In%2 != 0 {
		return fmt.Errorf("mxfp4 weight %d × [%d, %d]: dimensions must be positive, inputs even", p.Experts, p.Out, p.In)
	}
	sk := (p.In + cuda.MXFP4Group - 1) / cuda.MXFP4Group
	if len(p.W) != p.Experts*p.Out*p.In/2 || len(p.Scale) != p.Experts*p.Out*sk {
		return fmt.Errorf("mxfp4 weight %d × [%d, %d] needs %d bytes and %d scales, has %d and %d", p.Experts, p.Out, p.In,
			p.Experts*p.Out*p.In/2, p.Experts*p.Out*sk, len(p.W), len(p.Scale))
	}
	return nil
}

// UploadMXFP4 uploads an MXFP4 weight (bank) as it is: Out·In/2 bytes and Out·In/32 scale
// bytes per expert.
func (l *Linears) UploadMXFP4(c *cudart.Ctx, p PackedMXFP4) (*Linear, error) {
	if err := p.Check(); err != nil {
		return nil, fmt.Errorf("gpurunner: %w", err)
	}
	w, err := upload(c, p.W, int64(len(p.W)))
	if err != nil {
		return nil, err
	}
	s, err := upload(c, p.Scale, int64(len(p.Scale)))
	if err != nil {
		c.Free(w)
		return nil, err
	}
	l.used[LinearMXFP4] = true
	return &Linear{DType: LinearMXFP4, Out: p.Out, In: p.In, Experts: p.Experts, w: w, scale: s}, nil
}

// Forward computes out [n, w.Out] float32 = x [n, w.In] float32 · wᵀ on s (an MXFP4 bank
// of one expert counts as a linear). It allocates nothing and may be captured into a
// CUDA graph; it must run inside Device.Do.
func (l *Linears) Forward(c *cudart.Ctx, s *cudart.Stream, w *Linear, out, x cudart.DevicePtr, n int) error {
	if w == nil || w.w.Ptr == 0 {
		return fmt.Errorf("gpurunner: forward of a freed or missing linear")
	}
	if n <= 0 {
		return fmt.Errorf("gpurunner: %v linear [%d, %d] over %d rows", w.DType, w.Out, w.In, n)
	}
	if w.DType != LinearF32 && w.DType != LinearMXFP4 && n > l.opt.MaxRows {
		return fmt.Errorf("gpurunner: %v linear over %d rows, the linears' scratch takes %d", w.DType, n, l.opt.MaxRows)
	}
	switch w.DType {
	case LinearF32:
		return l.blas.MatMulT(c, s, cudart.F32, out, x, w.w.Ptr, n, w.In, w.Out)
	case LinearBF16:
		if err := l.k.CastBF16(c, s, l.xb.Ptr, x, n*w.In); err != nil {
			return err
		}
		g := cudart.GemmSpec{M: n, N: w.Out, K: w.In, TransB: true, AType: cudart.BF16, BType: cudart.BF16, OutType: cudart.F32, Alpha: 1}
		return l.blas.Gemm(c, s, g, l.xb.Ptr, w.w.Ptr, 0, out)
	case LinearFP8Block:
		if w.Experts != 1 {
			return fmt.Errorf("gpurunner: forward of an FP8 bank of %d experts (use Experts)", w.Experts)
		}
		q := cuda.FP8Quant{Q: l.xq.Ptr, Scale: l.xs.Ptr, X: x, Rows: n, Cols: w.In, Pow2: l.opt.Pow2Scales}
		if err := l.k.FP8Quant(c, s, q); err != nil {
			return err
		}
		if l.fp8 == FP8CuBLASLt && w.In%16 == 0 && w.Out%16 == 0 && (w.In+127)/128%4 == 0 {
			g := cudart.FP8BlockGemm{M: n, N: w.Out, K: w.In, OutType: cudart.F32}
			return l.blas.MatMulFP8Block(c, s, g, out, l.xq.Ptr, l.xs.Ptr, w.w.Ptr, w.scale.Ptr)
		}
		return l.k.FP8Gemm(c, s, cuda.FP8Gemm{Out: out, XQ: l.xq.Ptr, XScale: l.xs.Ptr, WQ: w.w.Ptr, WScale: w.scale.Ptr, M: n, N: w.Out, K: w.In})
	case LinearMXFP4:
		if w.Experts != 1 {
			return fmt.Errorf("gpurunner: forward of an MXFP4 bank of %d experts (use Experts)", w.Experts)
		}
		return l.k.MXFP4Gemm(c, s, cuda.MXFP4Gemm{Out: out, X: x, W: w.w.Ptr, Scale: w.scale.Ptr, Experts: 1, MaxRows: n, N: w.Out, K: w.In})
	}
	return fmt.Errorf("gpurunner: unknown linear type %v", w.DType)
}

// Experts runs a bank over the masked expert layout: ye [Experts, maxRows, Out] float32
// from xe [Experts, maxRows, In] float32 (cuda.MoEGather's), each expert's first
// counts[e] rows (cuda.MaskedMoE.Counts, on the device), zeros past them. An MXFP4 bank
// runs W4A16 (one launch); an FP8 bank quantises all Experts·maxRows rows of xe (the
// linears' MaxRows must cover them) and runs cuda.FP8Gemm grouped over the experts (one
// launch; cuBLASLt has no masked grouped form).
func (l *Linears) Experts(c *cudart.Ctx, s *cudart.Stream, w *Linear, ye, xe, counts cudart.DevicePtr, maxRows int) error {
	if w == nil || w.w.Ptr == 0 || (w.DType != LinearMXFP4 && w.DType != LinearFP8Block) {
		return fmt.Errorf("gpurunner: masked experts need an uploaded MXFP4 or FP8 bank")
	}
	if maxRows <= 0 {
		return fmt.Errorf("gpurunner: masked experts of %d rows each", maxRows)
	}
	if w.DType == LinearMXFP4 {
		return l.k.MXFP4Gemm(c, s, cuda.MXFP4Gemm{Out: ye, X: xe, W: w.w.Ptr, Scale: w.scale.Ptr, Counts: counts,
			Experts: w.Experts, MaxRows: maxRows, N: w.Out, K: w.In})
	}
	rows := w.Experts * maxRows
	if rows > l.opt.MaxRows {
		return fmt.Errorf("gpurunner: an FP8 bank over %d×%d rows, the linears' scratch takes %d", w.Experts, maxRows, l.opt.MaxRows)
	}
	q := cuda.FP8Quant{Q: l.xq.Ptr, Scale: l.xs.Ptr, X: xe, Rows: rows, Cols: w.In, Pow2: l.opt.Pow2Scales}
	if err := l.k.FP8Quant(c, s, q); err != nil {
		return err
	}
	return l.k.FP8Gemm(c, s, cuda.FP8Gemm{Out: ye, XQ: l.xq.Ptr, XScale: l.xs.Ptr, WQ: w.w.Ptr, WScale: w.scale.Ptr, Counts: counts,
		M: maxRows, N: w.Out, K: w.In, Experts: w.Experts})
}

// BF16Bits rounds float32 weights to bf16 bits, for UploadBF16.
func BF16Bits(v []float32) []uint16 {
	h := make([]uint16, len(v))
	for i, f := range v {
		h[i] = weights.Float32ToBF16(f)
	}
	return h
}
