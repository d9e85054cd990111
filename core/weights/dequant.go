package weights

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
)

// FP4Group is the number of consecutive input elements of a row that share one scale in
// FP4 e2m1 expert weights: transformers' FP8Experts allocates FP4 scales with
// sf_gran_n=1, sf_gran_k=32 (transformers 5.23.0 integrations/finegrained_fp8.py:756-761,
// FP8Experts.__init__), and DeepSeek-V4-Flash checkpoints pair each I8 expert weight
// [out, in/2] with an F8_E8M0 scale [out, ceil(in/32)] (the header inventory of
// deepseek-ai/DeepSeek-V4-Flash-0731 recorded in github.com/hebo1221/nano-deepseek-v4,
// nano_deepseek_v4/_receipts/DeepSeek-V4-Flash-0731-metadata.json).
const FP4Group = 32

// e4m3Table holds every float8 e4m3fn byte widened to float32, so that dequantising is a
// table lookup and a multiply.
var e4m3Table = func() (t [256]float32) {
	for i := range t {
		t[i] = F8E4M3ToFloat32(uint8(i))
	}
	return t
}()

// e2m1Pairs holds both FP4 values of every packed byte: [b][0] from the low nibble (the
// even element), [b][1] from the high nibble (the odd element).
var e2m1Pairs = func() (t [256][2]float32) {
	for i := range t {
		t[i] = [2]float32{E2M1ToFloat32(uint8(i)), E2M1ToFloat32(uint8(i) >> 4)}
	}
	return t
}()

// parallelMin is the number of output elements below which a dequantisation runs on the
// calling goroutine: smaller tensors take less time than starting workers.
const parallelMin = 1 << 18

// forRows calls fn over [0, n) split into chunks that are multiples of grain rows, on up
// to GOMAXPROCS goroutines when work (the elements written) is large enough.
func forRows(n, grain, work int, fn func(lo, hi int)) {
	workers := runtime.GOMAXPROCS(0)
	if work < parallelMin || workers < 2 || n <= grain {
		fn(0, n)
		return
	}
	chunks := (n + grain - 1) / grain
	workers = min(workers, chunks)
	per := (chunks + workers - 1) / workers * grain
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += per {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			fn(lo, hi)
		}(lo, min(lo+per, n))
	}
	wg.Wait()
}

// DequantFP8 widens a row-major [rows, cols] matrix of float8 e4m3fn bytes w, scaled per
// [blockRows, blockCols] block, into dst:
//
//	dst[i*cols+j] = e4m3(w[i*cols+j]) * scale[(i/blockRows)*ceil(cols/blockCols) + j/blockCols]
//
// scale is row-major [ceil(rows/blockRows), ceil(cols/blockCols)] (the last block row and
// column may be partial, as FP8Linear allocates it, transformers 5.23.0
// integrations/finegrained_fp8.py:415-416). This is the weight_scale_inv convention of
// DeepSeek-V3/V4 and transformers' FineGrainedFP8: the stored scale is the one to multiply
// by (Fp8Dequantize._dequantize_one, finegrained_fp8.py:1173, returns q * s).
func DequantFP8(dst []float32, w []byte, scale []float32, rows, cols, blockRows, blockCols int) error {
	if rows < 0 || cols < 0 || blockRows <= 0 || blockCols <= 0 {
		return fmt.Errorf("%w: fp8 dequant of [%d, %d] in [%d, %d] blocks", ErrShape, rows, cols, blockRows, blockCols)
	}
	sr, sc := ceilDiv(rows, blockRows), ceilDiv(cols, blockCols)
	n := rows * cols
	if len(dst) != n || len(w) != n || len(scale) != sr*sc {
		return fmt.Errorf("%w: fp8 dequant of [%d, %d] needs %d values and %d scales, got %d bytes, %d scales, room for %d",
			ErrShape, rows, cols, n, sr*sc, len(w), len(scale), len(dst))
	}
	forRows(rows, blockRows, n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			srow := scale[(i/blockRows)*sc : (i/blockRows+1)*sc]
			wrow := w[i*cols : (i+1)*cols]
			drow := dst[i*cols : (i+1)*cols]
			for b, s := range srow {
				j0, j1 := b*blockCols, min((b+1)*blockCols, cols)
				wb, db := wrow[j0:j1], drow[j0:j1]
				db = db[:len(wb)]
				for k, v := range wb {
					db[k] = e4m3Table[v] * s
				}
			}
		}
	})
	return nil
}

// DequantFP4 widens a row-major [rows, cols] matrix of FP4 e2m1 values packed two per byte
// (w holds rows × cols/2 bytes; element 2k of a row is the low nibble of byte k, element
// 2k+1 the high nibble), scaled per group of consecutive elements of a row, into dst:
//
//	dst[i*cols+j] = e2m1(nibble j of row i) * scale[i*ceil(cols/group) + j/group]
//
// The nibble order and values are transformers' Fp8Dequantize (5.23.0 integrations/
// finegrained_fp8.py:1119 _FP4_E2M1_LUT, and :1121-1128 _unpack_fp4: low = u8 & 0xF,
// high = u8 >> 4, stacked low then high along the last dimension). cols and group must be
// even, so that no byte straddles two groups.
func DequantFP4(dst []float32, w []byte, scale []float32, rows, cols, group int) error {
	if rows < 0 || cols < 0 || cols%2 != 0 || group <= 0 || group%2 != 0 {
		return fmt.Errorf("%w: fp4 dequant of [%d, %d] in groups of %d (columns and group must be even)", ErrShape, rows, cols, group)
	}
	sc := ceilDiv(cols, group)
	n := rows * cols
	if len(dst) != n || len(w) != n/2 || len(scale) != rows*sc {
		return fmt.Errorf("%w: fp4 dequant of [%d, %d] needs %d packed bytes and %d scales, got %d bytes, %d scales, room for %d",
			ErrShape, rows, cols, n/2, rows*sc, len(w), len(scale), len(dst))
	}
	half, gb := cols/2, group/2
	forRows(rows, 1, n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			srow := scale[i*sc : (i+1)*sc]
			wrow := w[i*half : (i+1)*half]
			drow := dst[i*cols : (i+1)*cols]
			for g, s := range srow {
				k0, k1 := g*gb, min((g+1)*gb, half)
				wb, db := wrow[k0:k1], drow[2*k0:2*k1]
				db = db[:2*len(wb)]
				for k, v := range wb {
					p := &e2m1Pairs[v]
					db[2*k] = p[0] * s
					db[2*k+1] = p[1] * s
				}
			}
		}
	})
	return nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// ScaleName returns the name of the scale tensor stored for the quantized weight name, and
// whether the checkpoint has one. For "X.weight" it looks for "X.weight_scale_inv"
// (transformers and DeepSeek-V3) and then "X.scale" (DeepSeek-V4 upstream checkpoints,
// which transformers renames with `^(.+)\.scale` -> `\1.weight_scale_inv`, 5.23.0
// quantizers/quantizer_finegrained_fp8.py:188); for any other name (merged experts such as
// "...experts.gate_up_proj") it looks for name+"_scale_inv" (finegrained_fp8.py:1077).
func (c *Checkpoint) ScaleName(name string) (string, bool) {
	for _, s := range scaleNames(name) {
		if c.Has(s) {
			return s, true
		}
	}
	return "", false
}

func scaleNames(name string) []string {
	if base, ok := strings.CutSuffix(name, ".weight"); ok {
		return []string{name + "_scale_inv", base + ".scale"}
	}
	return []string{name + "_scale_inv"}
}

// Dequantize reads the weight name, whose logical shape is shape ([..., out, in]), and
// returns it widened to float32. How it is read follows its stored dtype:
//
//   - F8_E4M3: float8 e4m3fn with one scale per q.BlockSize block (DequantFP8); the scale
//     tensor (see ScaleName) is [..., ceil(out/rows), ceil(in/cols)].
//   - I8 or U8 with q.ExpertDType "fp4": FP4 e2m1 packed two per byte, stored as
//     [..., out, in/2], with one scale per row per FP4Group elements (DequantFP4); the scale
//     tensor is [..., out, ceil(in/32)].
//   - BF16, F16, F32: read as Checkpoint.Float32 does, and refused if a scale tensor
//     stands beside it (some DeepSeek-V4 linears ship unquantized, without scales).
//
// Scales are F32 or BF16, F8_E8M0, or U8 read as E8M0 when q.ScaleFormat is "ue8m0". A
// missing scale matches ErrNotFound, a wrong shape ErrShape, both naming the weight and its
// scale. A module q's not-converted list covers (NotConvertedBy) must be stored as BF16,
// F16 or F32 without a scale. A ModelOpt q (Method "modelopt") reads as
// dequantizeModelOpt says. q may be nil for a checkpoint without quantization_config.
func (c *Checkpoint) Dequantize(name string, q *Quant, shape ...int) ([]float32, error) {
	info, ok := c.Info(name)
	if !ok {
		return nil, fmt.Errorf("%w: %q in %s", ErrNotFound, name, c.Dir)
	}
	if q != nil && q.Method == "modelopt" {
		return c.dequantizeModelOpt(info, q, shape)
	}
	scaleName, scaled := c.ScaleName(name)
	if pat, ok := q.NotConvertedBy(name); ok && (!unquantized(info.DType) || scaled) {
		return nil, fmt.Errorf("tensor %q: %w: stored as %s (scaled: %v), but quantization_config keeps it unquantized (%q in modules_to_not_convert or ignore)", name, ErrDType, info.DType, scaled, pat)
	}
	switch {
	case info.DType == F8E4M3:
		if q == nil {
			return nil, fmt.Errorf("tensor %q is %s but config.json has no quantization_config", name, info.DType)
		}
		return c.dequantize(info, scaleName, scaled, shape, shape, q, q.BlockSize[0], q.BlockSize[1])
	case info.DType == I8 || info.DType == U8:
		if q == nil || q.ExpertDType != ExpertFP4 {
			return nil, fmt.Errorf("tensor %q: %w: %s weights are FP4 experts, which need quantization_config.expert_dtype \"fp4\"", name, ErrDType, info.DType)
		}
		stored := slices.Clone(shape)
		if len(stored) < 2 || stored[len(stored)-1]%2 != 0 {
			return nil, fmt.Errorf("tensor %q: %w: FP4 weights need a shape [..., out, in] with even in, model expects %v", name, ErrShape, shape)
		}
		stored[len(stored)-1] /= 2
		return c.dequantize(info, scaleName, scaled, shape, stored, q, 1, FP4Group)
	case info.DType.Float():
		if scaled {
			return nil, fmt.Errorf("tensor %q: %w: %s weight has a scale tensor %q; only F8_E4M3 and FP4 (I8) weights are scaled", name, ErrDType, info.DType, scaleName)
		}
		return c.Float32(name, shape...)
	}
	return nil, fmt.Errorf("tensor %q: %w: cannot dequantize %s", name, ErrDType, info.DType)
}

// dequantize reads a block-scaled weight: logical is the shape the model expects, stored
// the shape its bytes have, [br, bc] the block one scale covers.
func (c *Checkpoint) dequantize(info TensorInfo, scaleName string, scaled bool, logical, stored []int, q *Quant, br, bc int) ([]float32, error) {
	name := info.Name
	if len(logical) < 2 {
		return nil, fmt.Errorf("tensor %q: %w: quantized weights are matrices [..., out, in], model expects %v", name, ErrShape, logical)
	}
	if !slices.Equal(info.Shape, stored) {
		return nil, fmt.Errorf("tensor %q: %w: checkpoint has %v of %s, model expects %v (stored as %v)", name, ErrShape, info.Shape, info.DType, logical, stored)
	}
	if !scaled {
		return nil, fmt.Errorf("tensor %q: %w: its scale tensor (%s) is missing", name, ErrNotFound, strings.Join(scaleNames(name), " or "))
	}
	rows, cols := logical[len(logical)-2], logical[len(logical)-1]
	wantScale := append(slices.Clone(logical[:len(logical)-2]), ceilDiv(rows, br), ceilDiv(cols, bc))
	sinfo, _ := c.Info(scaleName)
	if !slices.Equal(sinfo.Shape, wantScale) {
		return nil, fmt.Errorf("tensor %q: %w: scale %q is %v, want %v (one per %d×%d block of %v)", name, ErrShape, scaleName, sinfo.Shape, wantScale, br, bc, logical)
	}
	scale, err := c.readScale(sinfo, q)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", name, err)
	}
	_, raw, err := c.where[name].ReadRaw(name)
	if err != nil {
		return nil, err
	}
	mats := 1 // matrices in the leading dimensions (experts)
	for _, d := range logical[:len(logical)-2] {
		mats *= d
	}
	per := rows * cols
	out := make([]float32, mats*per)
	sper, rper := len(scale)/max(mats, 1), len(raw)/max(mats, 1)
	for m := 0; m < mats; m++ {
		d, w, s := out[m*per:(m+1)*per], raw[m*rper:(m+1)*rper], scale[m*sper:(m+1)*sper]
		if info.DType == F8E4M3 {
			err = DequantFP8(d, w, s, rows, cols, br, bc)
		} else {
			err = DequantFP4(d, w, s, rows, cols, bc)
		}
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
	}
	c.progress.add(c, name, scaleName)
	return out, nil
}

// readScale reads a scale tensor as float32: F32, BF16 and F16 as they are, F8_E8M0 as
// powers of two, and U8 as E8M0 bytes when scale_fmt is ue8m0 (transformers views such
// uint8 scales as float8_e8m0fnu, 5.23.0 quantizers/quantizer_finegrained_fp8.py:143-147).
func (c *Checkpoint) readScale(info TensorInfo, q *Quant) ([]float32, error) {
	dt := info.DType
	if dt == U8 && q.ScaleFormat == ScaleUE8M0 {
		dt = F8E8M0
	}
	if !dt.Float() {
		return nil, fmt.Errorf("scale %q: %w: %s scales (want F32, BF16 or F8_E8M0)", info.Name, ErrDType, info.DType)
	}
	_, raw, err := c.where[info.Name].ReadRaw(info.Name)
	if err != nil {
		return nil, err
	}
	out := make([]float32, info.Elements())
	if err := DecodeFloat32(out, raw, dt); err != nil {
		return nil, fmt.Errorf("scale %q: %w", info.Name, err)
	}
	return out, nil
}
