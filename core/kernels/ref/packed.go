package ref

import (
	"cmp"
	"fmt"
	"math"
	"sort"
	"sync"

	"github.com/resin-llm/resin/core/weights"
)

// FP8Matrix is a projection's weight [N, K] kept as a checkpoint stores it: float8 e4m3fn
// bytes, row-major, and one float32 scale per [BlockRows, BlockCols] block (row-major
// [ceil(N/BlockRows), ceil(K/BlockCols)], the weight_scale_inv of DeepSeek-V3/V4's
// 128×128 blocks): w[i, j] = e4m3(W[i·K+j]) · Scale[(i/BlockRows)·ceil(K/BlockCols) +
// j/BlockCols], as weights.DequantFP8 widens it. A byte per weight, against fp32's four.
type FP8Matrix struct {
	N, K                 int
	W                    []byte
	Scale                []float32
	BlockRows, BlockCols int
}

// FP4Matrix is a weight [N, K] of FP4 e2m1 values packed two per byte (row-major, N·K/2
// bytes; element 2k of a row is byte k's low nibble) and one float32 scale per Group
// consecutive elements of a row (an MXFP4 expert's E8M0 scales, widened): w[i, j] =
// e2m1(nibble j of row i) · Scale[i·ceil(K/Group) + j/Group], as weights.DequantFP4
// widens it. Half a byte per weight.
type FP4Matrix struct {
	N, K  int
	W     []byte
	Scale []float32
	Group int
}

var (
	// e4m3LUT is every float8 e4m3fn byte's value.
	e4m3LUT = func() (t [256]float32) {
		for i := range t {
			t[i] = weights.F8E4M3ToFloat32(uint8(i))
		}
		return t
	}()
	// e2m1Pair is both FP4 values of a packed byte: [0] the low nibble's, [1] the high's.
	e2m1Pair = func() (t [256][2]float32) {
		for i := range t {
			t[i] = [2]float32{weights.E2M1ToFloat32(uint8(i)), weights.E2M1ToFloat32(uint8(i) >> 4)}
		}
		return t
	}()
	// e2m1LUT is the 16 FP4 values in nibble order, the vector kernels' table (the AVX2
	// ones read the first 8, the magnitudes).
	e2m1LUT = func() (t [16]float32) {
		for i := range t {
			t[i] = weights.E2M1ToFloat32(uint8(i))
		}
		return t
	}()
)

// check validates w's sizes.
func (w *FP8Matrix) check() error {
	if w.N <= 0 || w.K <= 0 || w.BlockRows <= 0 || w.BlockCols <= 0 {
		return fmt.Errorf("ref.FP8Matrix: [%d, %d] in [%d, %d] blocks", w.N, w.K, w.BlockRows, w.BlockCols)
	}
	sr, sc := (w.N+w.BlockRows-1)/w.BlockRows, (w.K+w.BlockCols-1)/w.BlockCols
	if len(w.W) != w.N*w.K || len(w.Scale) != sr*sc {
		return fmt.Errorf("ref.FP8Matrix: [%d, %d] needs %d bytes and %d scales, has %d and %d", w.N, w.K, w.N*w.K, sr*sc, len(w.W), len(w.Scale))
	}
	return nil
}

// check validates w's sizes.
func (w *FP4Matrix) check() error {
	if w.N <= 0 || w.K <= 0 || w.K%2 != 0 || w.Group <= 0 || w.Group%2 != 0 {
		return fmt.Errorf("ref.FP4Matrix: [%d, %d] in groups of %d (columns and group must be even)", w.N, w.K, w.Group)
	}
	sc := (w.K + w.Group - 1) / w.Group
	if len(w.W) != w.N*w.K/2 || len(w.Scale) != w.N*sc {
		return fmt.Errorf("ref.FP4Matrix: [%d, %d] needs %d bytes and %d scales, has %d and %d", w.N, w.K, w.N*w.K/2, w.N*sc, len(w.W), len(w.Scale))
	}
	return nil
}

// PackedKernel names what runs MatMulTFP8 and MatMulTFP4 on this CPU: "AVX-512" or
// "AVX2" (dot products of a decode row with the weights widened in registers; batches
// widen runs of rows into scratch for the float32 GEMM), or "scalar" (table loops).
func PackedKernel() string {
	switch {
	case hasPackedAVX512:
		return "AVX-512"
	case hasPackedAVX2:
		return "AVX2"
	}
	return "scalar"
}

// Bytes is the memory w holds: a byte a weight and its scales.
func (w *FP8Matrix) Bytes() int64 { return int64(len(w.W)) + 4*int64(len(w.Scale)) }

// Bytes is the memory w holds: half a byte a weight and its scales (widened to float32).
func (w *FP4Matrix) Bytes() int64 { return int64(len(w.W)) + 4*int64(len(w.Scale)) }

// MatMulTFP8 computes out = x·wᵀ: x [m, K], out [m, N], reading w's bytes as they are
// stored, never widening all of w. Each output of a decode row (m = 1) is Σ over w's
// column blocks of (Σ x·e4m3 in the block, in float32) times the block's scale, on the
// AVX-512 or AVX2 kernel where the CPU has one and BlockCols is a multiple of 16 (else a
// table loop), split over w's rows on the package's pool. A batch (m ≥ 2) widens runs of
// w's rows into per-participant scratch, each value e4m3·scale rounded as
// weights.DequantFP8 rounds it, and multiplies them on the float32 GEMM (gemm, one call a
// run): to the bit what MatMulT's kernels give on those rows.
//
// Error against MatMulT over the widened weights: float32 reassociation only (the block
// sums are exact products summed in another order), within about 1e-6 of Σ|x·w|.
func MatMulTFP8(out, x []float32, w *FP8Matrix, m int) error {
	if err := w.check(); err != nil {
		return err
	}
	if err := packedArgs("MatMulTFP8", out, x, m, w.K, w.N); err != nil || m == 0 {
		return err
	}
	if m == 1 {
		ParallelRange(w.N, rowGrain(w.K), func(_, lo, hi int) {
			for i := lo; i < hi; i++ {
				out[i] = w.rowDot(x, i)
			}
		})
		return nil
	}
	return widenedProduct("MatMulTFP8", out, x, m, w.K, w.N, w.widenRows)
}

// MatMulTFP4 computes out = x·wᵀ: x [m, K], out [m, N], reading w's packed nibbles as
// they are stored: each output of a decode row is Σ over w's groups of (Σ x·e2m1 in the
// group) times the group's scale, on the AVX-512 or AVX2 kernel where the CPU has one and
// Group is 32 (MXFP4's; else a table loop), split over w's rows on the package's pool. A
// batch widens runs of w's rows into scratch (e2m1·scale, as weights.DequantFP4) for the
// float32 GEMM, as MatMulTFP8 does. Error against MatMulT on the widened weights: float32
// reassociation only.
func MatMulTFP4(out, x []float32, w *FP4Matrix, m int) error {
	if err := w.check(); err != nil {
		return err
	}
	if err := packedArgs("MatMulTFP4", out, x, m, w.K, w.N); err != nil || m == 0 {
		return err
	}
	if m > 1 {
		return widenedProduct("MatMulTFP4", out, x, m, w.K, w.N, w.widenRows)
	}
	k := w.K
	var xd []float32 // x with each group of 32's even columns first, then its odd ones
	if w.vector() {
		t := packedTasks.get()
		defer packedTasks.put(t)
		if cap(t.xd) < k {
			t.xd = make([]float32, k)
		}
		xd = t.xd[:k]
		for g := 0; g+32 <= k; g += 32 {
			for c := range 16 {
				xd[g+c], xd[g+16+c] = x[g+2*c], x[g+2*c+1]
			}
		}
	}
	ParallelRange(w.N, rowGrain(k), func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			out[i] = w.rowDot(x, xd, i)
		}
	})
	return nil
}

// packedArgs checks a packed product's m and slice lengths.
func packedArgs(op string, out, x []float32, m, k, n int) error {
	if err := checkDims(op, m); err != nil {
		return err
	}
	if err := checkLen(op, "x", len(x), m*k); err != nil {
		return err
	}
	return checkLen(op, "out", len(out), m*n)
}

// vector says whether w's blocks run on the vector kernels.
func (w *FP8Matrix) vector() bool { return hasPackedAVX2 && w.BlockCols%16 == 0 }

// vector says whether w's groups run on the vector kernels.
func (w *FP4Matrix) vector() bool { return hasPackedAVX2 && w.Group == 32 }

// fp8Dot is the fp8 dot kernel the CPU runs.
func fp8Dot(x *float32, w *uint8, s *float32, nb, bc int) float32 {
	if hasPackedAVX512 {
		return fp8DotAVX512(x, w, s, nb, bc)
	}
	return fp8DotAVX2(x, w, s, nb, bc)
}

// rowDot returns x (K values) times row i of w: Σ over blocks of the block's sum times its
// scale.
func (w *FP8Matrix) rowDot(x []float32, i int) float32 {
	k, bc := w.K, w.BlockCols
	sc := (k + bc - 1) / bc
	wrow := w.W[i*k : (i+1)*k]
	srow := w.Scale[(i/w.BlockRows)*sc:][:sc]
	x = x[:k]
	var acc float32
	b0 := 0
	if full := k / bc; full > 0 && w.vector() {
		acc, b0 = fp8Dot(&x[0], &wrow[0], &srow[0], full, bc), full
	}
	for b := b0; b < sc; b++ {
		j0, j1 := b*bc, min((b+1)*bc, k)
		if (j1-j0)%16 == 0 && w.vector() { // a partial last block in whole vectors
			acc += fp8Dot(&x[j0], &wrow[j0], &srow[b], 1, j1-j0)
			continue
		}
		wb, xb := wrow[j0:j1], x[j0:j1]
		var s0, s1, s2, s3 float32
		j := 0
		for ; j+4 <= len(wb); j += 4 {
			s0 += xb[j] * e4m3LUT[wb[j]]
			s1 += xb[j+1] * e4m3LUT[wb[j+1]]
			s2 += xb[j+2] * e4m3LUT[wb[j+2]]
			s3 += xb[j+3] * e4m3LUT[wb[j+3]]
		}
		for ; j < len(wb); j++ {
			s0 += xb[j] * e4m3LUT[wb[j]]
		}
		acc += (s0 + s1 + s2 + s3) * srow[b]
	}
	return acc
}

// widenRows sets dst [hi-lo, K] to rows [lo, hi) of w as float32 (e4m3·scale).
func (w *FP8Matrix) widenRows(dst []float32, lo, hi int) {
	k, bc := w.K, w.BlockCols
	sc := (k + bc - 1) / bc
	for i := lo; i < hi; i++ {
		wrow, d := w.W[i*k:(i+1)*k], dst[(i-lo)*k:][:k]
		srow := w.Scale[(i/w.BlockRows)*sc:][:sc]
		b0 := 0
		if full := k / bc; full > 0 && w.vector() {
			fp8WidenAVX2(&d[0], &wrow[0], &srow[0], full, bc)
			b0 = full
		}
		for b := b0; b < sc; b++ {
			s := srow[b]
			for j := b * bc; j < min((b+1)*bc, k); j++ {
				d[j] = e4m3LUT[wrow[j]] * s
			}
		}
	}
}

// rowDot returns x (K values) times row i of w; xd is x as fp4DotAVX512 reads it (nil
// off the vector path).
func (w *FP4Matrix) rowDot(x, xd []float32, i int) float32 {
	k, half, gb := w.K, w.K/2, w.Group/2
	sc := (k + w.Group - 1) / w.Group
	wrow := w.W[i*half : (i+1)*half]
	srow := w.Scale[i*sc : (i+1)*sc]
	var acc float32
	g0 := 0
	if full := k / 32; full > 0 && xd != nil {
		_ = xd[full*32-1]
		if hasPackedAVX512 {
			acc = fp4DotAVX512(&xd[0], &wrow[0], &srow[0], full, &e2m1LUT[0])
		} else {
			acc = fp4DotAVX2(&xd[0], &wrow[0], &srow[0], full, &e2m1LUT[0])
		}
		g0 = full
	}
	for g := g0; g < sc; g++ {
		k0, k1 := g*gb, min((g+1)*gb, half)
		wb, xb := wrow[k0:k1], x[2*k0:2*k1]
		xb = xb[:2*len(wb)]
		var s0, s1 float32
		for j, v := range wb {
			p := &e2m1Pair[v]
			s0 += xb[2*j] * p[0]
			s1 += xb[2*j+1] * p[1]
		}
		acc += (s0 + s1) * srow[g]
	}
	return acc
}

// widenRows sets dst [hi-lo, K] to rows [lo, hi) of w as float32 (e2m1·scale).
func (w *FP4Matrix) widenRows(dst []float32, lo, hi int) {
	k, half, gb := w.K, w.K/2, w.Group/2
	sc := (k + w.Group - 1) / w.Group
	for i := lo; i < hi; i++ {
		wrow, d := w.W[i*half:(i+1)*half], dst[(i-lo)*k:][:k]
		srow := w.Scale[i*sc : (i+1)*sc]
		g0 := 0
		if full := k / 32; full > 0 && w.vector() {
			fp4WidenAVX2(&d[0], &wrow[0], &srow[0], full, &e2m1LUT[0])
			g0 = full
		}
		for g := g0; g < sc; g++ {
			s := srow[g]
			for j := g * gb; j < min((g+1)*gb, half); j++ {
				p := &e2m1Pair[wrow[j]]
				d[2*j], d[2*j+1] = p[0]*s, p[1]*s
			}
		}
	}
}

// packedTask is a packed product's scratch, kept across calls: per participant of the
// pool a run of widened rows and its product; FP4's reordered decode row.
type packedTask struct {
	wide, prod [][]float32
	xd         []float32
}

var packedTasks freeList[packedTask]

// widenedProduct computes out = x·wᵀ (x [m, k], out [m, n]) for m ≥ 2 over runs of w's
// rows that widen writes as float32 (widen(dst, lo, hi): rows [lo, hi) into dst): each
// run, on one participant of the pool, widened into its scratch and multiplied by the
// float32 GEMM into a [m, run] product copied into out's columns. Runs are 16 rows for a
// decode batch (m ≤ skinnyRows: the widened run stays in L1/L2 for the skinny kernel), 64
// for a prefill.
func widenedProduct(op string, out, x []float32, m, k, n int, widen func(dst []float32, lo, hi int)) error {
	run := 16
	if m > skinnyRows {
		run = 64
	}
	t := packedTasks.get()
	defer packedTasks.put(t)
	for len(t.wide) < parts() {
		t.wide, t.prod = append(t.wide, nil), append(t.prod, nil)
	}
	var mu sync.Mutex
	var first error
	ParallelRange((n+run-1)/run, 1, func(part, lo, hi int) {
		if cap(t.wide[part]) < run*k {
			t.wide[part] = make([]float32, run*k)
		}
		if cap(t.prod[part]) < m*run {
			t.prod[part] = make([]float32, m*run)
		}
		for r := lo; r < hi; r++ {
			j0, j1 := r*run, min((r+1)*run, n)
			c := j1 - j0
			wide, prod := t.wide[part][:c*k], t.prod[part][:m*c]
			widen(wide, j0, j1)
			if err := gemm(op, true, false, prod, x, wide, m, k, c); err != nil {
				mu.Lock()
				first = cmp.Or(first, err)
				mu.Unlock()
				return
			}
			for i := range m {
				copy(out[i*n+j0:i*n+j1], prod[i*c:(i+1)*c])
			}
		}
	})
	return first
}

// fp8Max is e4m3fn's largest finite value.
const fp8Max = 448

// QuantizeFP8 quantises the weight w [n, k] (row-major, float32) to e4m3 in blocks of
// 128×128 (partial at the edges), each block's scale its largest magnitude over 448 and
// each value rounded to the nearest e4m3 of value/scale (ties to the even code), as
// DeepSeek's and vLLM's block-wise FP8 is made. Error: a value is off by at most 2^-4 of
// itself (e4m3's 3 mantissa bits) or, below e4m3's normals, 2^-10 of the scale. A block of
// zeros gets scale 0; values that are not finite are refused.
func QuantizeFP8(w []float32, n, k int) (*FP8Matrix, error) {
	const op, blk = "QuantizeFP8", 128
	if err := checkDims(op, n, k); err != nil {
		return nil, err
	}
	if n == 0 || k == 0 {
		return nil, fmt.Errorf("ref.%s: empty weight [%d, %d]", op, n, k)
	}
	if err := checkLen(op, "w", len(w), n*k); err != nil {
		return nil, err
	}
	sr, sc := (n+blk-1)/blk, (k+blk-1)/blk
	q := &FP8Matrix{N: n, K: k, BlockRows: blk, BlockCols: blk, W: make([]byte, n*k), Scale: make([]float32, sr*sc)}
	var mu sync.Mutex
	bad := n
	ParallelRange(sr, 1, func(_, lo, hi int) {
		for br := lo; br < hi; br++ {
			r0, r1 := br*blk, min((br+1)*blk, n)
			for bc := range sc {
				c0, c1 := bc*blk, min((bc+1)*blk, k)
				var amax float32
				for i := r0; i < r1; i++ {
					for _, v := range w[i*k+c0 : i*k+c1] {
						if math.Float32bits(v)&0x7f800000 == 0x7f800000 {
							mu.Lock()
							bad = min(bad, i)
							mu.Unlock()
							return
						}
						amax = max(amax, abs32(v))
					}
				}
				s := amax / fp8Max
				q.Scale[br*sc+bc] = s
				if s == 0 {
					continue // codes 0
				}
				for i := r0; i < r1; i++ {
					for j := c0; j < c1; j++ {
						q.W[i*k+j] = nearestE4M3(w[i*k+j] / s)
					}
				}
			}
		}
	})
	if bad < n {
		return nil, fmt.Errorf("ref.%s: row %d holds a value that is not finite", op, bad)
	}
	return q, nil
}

// nearestE4M3 is the e4m3fn code nearest v (|v| ≤ 448 up to rounding; larger magnitudes
// saturate to ±448), ties to the even code.
func nearestE4M3(v float32) byte {
	var sign byte
	if math.Float32bits(v)>>31 != 0 {
		sign, v = 0x80, -v
	}
	// e4m3LUT[0:127] is increasing: the finite non-negative codes.
	c := sort.Search(127, func(i int) bool { return e4m3LUT[i] >= v })
	switch {
	case c == 127:
		c = 126
	case c > 0:
		lo, hi := v-e4m3LUT[c-1], e4m3LUT[c]-v
		if lo < hi || (lo == hi && (c-1)%2 == 0) {
			c--
		}
	}
	return sign | byte(c)
}
