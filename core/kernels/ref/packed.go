package ref

import (
	"fmt"

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

// MatMulTFP8 computes out = x·wᵀ: x [m, K], out [m, N], reading w's bytes as they are
// stored. Each output is Σ over w's column blocks of (Σ x·e4m3 in the block, in float32)
// times the block's scale. Scalar Go over a 256-entry table, split over output rows on the
// package's pool; no SIMD form yet.
func MatMulTFP8(out, x []float32, w *FP8Matrix, m int) error {
	if err := w.check(); err != nil {
		return err
	}
	if err := checkLen("MatMulTFP8", "x", len(x), m*w.K); err != nil {
		return err
	}
	if err := checkLen("MatMulTFP8", "out", len(out), m*w.N); err != nil {
		return err
	}
	n, k, bc := w.N, w.K, w.BlockCols
	sc := (k + bc - 1) / bc
	ParallelRange(n, max(1, minParallelElems/max(1, m*k)), func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			wrow := w.W[i*k : (i+1)*k]
			srow := w.Scale[(i/w.BlockRows)*sc : (i/w.BlockRows+1)*sc]
			for r := range m {
				xr := x[r*k : (r+1)*k]
				var acc float32
				for b, s := range srow {
					j0, j1 := b*bc, min((b+1)*bc, k)
					wb, xb := wrow[j0:j1], xr[j0:j1]
					xb = xb[:len(wb)]
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
					acc += (s0 + s1 + s2 + s3) * s
				}
				out[r*n+i] = acc
			}
		}
	})
	return nil
}

// MatMulTFP4 computes out = x·wᵀ: x [m, K], out [m, N], reading w's packed nibbles as
// they are stored: each output is Σ over w's groups of (Σ x·e2m1 in the group) times the
// group's scale. Scalar Go over a 256-entry pair table, split over output rows on the
// package's pool; no SIMD form yet.
func MatMulTFP4(out, x []float32, w *FP4Matrix, m int) error {
	if err := w.check(); err != nil {
		return err
	}
	if err := checkLen("MatMulTFP4", "x", len(x), m*w.K); err != nil {
		return err
	}
	if err := checkLen("MatMulTFP4", "out", len(out), m*w.N); err != nil {
		return err
	}
	n, k, half, gb := w.N, w.K, w.K/2, w.Group/2
	sc := (k + w.Group - 1) / w.Group
	ParallelRange(n, max(1, minParallelElems/max(1, m*k)), func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			wrow := w.W[i*half : (i+1)*half]
			srow := w.Scale[i*sc : (i+1)*sc]
			for r := range m {
				xr := x[r*k : (r+1)*k]
				var acc float32
				for g, s := range srow {
					k0, k1 := g*gb, min((g+1)*gb, half)
					wb, xb := wrow[k0:k1], xr[2*k0:2*k1]
					xb = xb[:2*len(wb)]
					var s0, s1 float32
					for j, v := range wb {
						p := &e2m1Pair[v]
						s0 += xb[2*j] * p[0]
						s1 += xb[2*j+1] * p[1]
					}
					acc += (s0 + s1) * s
				}
				out[r*n+i] = acc
			}
		}
	})
	return nil
}
