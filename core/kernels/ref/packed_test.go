package ref

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/weights"
)

// packedKernels runs f once on each form of the packed kernels this CPU has: AVX-512,
// AVX2 and the scalar loops.
func packedKernels(t *testing.T, f func(t *testing.T)) {
	old512, old2 := hasPackedAVX512, hasPackedAVX2
	defer func() { hasPackedAVX512, hasPackedAVX2 = old512, old2 }()
	forms := []struct {
		name    string
		on, has bool
	}{{"avx512", true, old512}, {"avx2", false, old2}, {"scalar", false, false}}
	for i, fm := range forms {
		if i < 2 && !fm.has {
			continue
		}
		hasPackedAVX512, hasPackedAVX2 = fm.on && fm.has, fm.has
		t.Run(fm.name, f)
	}
}

// TestMatMulTFP8: the product over packed e4m3 bytes with 128×128 block scales (partial
// last blocks included: 300 = 2·128 + 44, 129; 208 = 128 + 80, a partial block in whole
// vectors) equals MatMulT over weights.DequantFP8's widening of the same bytes, within
// float32 reassociation (1e-5 of Σ|x·w|), for a decode row, a decode batch and a prefill
// (m = 20, above skinnyRows), on every kernel form; blocks of 64×32 columns too.
func TestMatMulTFP8(t *testing.T) { packedKernels(t, testMatMulTFP8) }

func testMatMulTFP8(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, sh := range []struct{ m, n, k, br, bc int }{
		{1, 200, 300, 128, 128}, {5, 130, 256, 128, 128}, {3, 7, 129, 128, 128},
		{1, 70, 512, 128, 128}, {1, 33, 208, 128, 128}, {20, 150, 384, 128, 128}, {2, 40, 96, 64, 32}, {1, 40, 96, 64, 32},
	} {
		w := &FP8Matrix{N: sh.n, K: sh.k, BlockRows: sh.br, BlockCols: sh.bc, W: make([]byte, sh.n*sh.k)}
		for i := range w.W {
			b := byte(rng.IntN(256))
			for b&0x7f == 0x7f { // NaN codes: a checkpoint holds none
				b = byte(rng.IntN(256))
			}
			w.W[i] = b
		}
		w.Scale = make([]float32, ((sh.n+sh.br-1)/sh.br)*((sh.k+sh.bc-1)/sh.bc))
		for i := range w.Scale {
			w.Scale[i] = float32(rng.Float64()*0.01 + 1e-3)
		}
		deq := make([]float32, sh.n*sh.k)
		if err := weights.DequantFP8(deq, w.W, w.Scale, sh.n, sh.k, sh.br, sh.bc); err != nil {
			t.Fatal(err)
		}
		checkPacked(t, "fp8", sh.m, sh.n, sh.k, deq, func(out, x []float32) error { return MatMulTFP8(out, x, w, sh.m) }, rng)
	}
	bad := &FP8Matrix{N: 2, K: 4, BlockRows: 128, BlockCols: 128, W: make([]byte, 7), Scale: []float32{1}}
	if err := MatMulTFP8(make([]float32, 2), make([]float32, 4), bad, 1); err == nil {
		t.Error("fp8: 7 bytes for [2, 4]: no error")
	}
}

// TestMatMulTFP4: the product over packed e2m1 nibbles with a scale per 32 (MXFP4; 16
// too, the table loops' case) equals MatMulT over weights.DequantFP4's widening, within
// float32 reassociation, for a decode row (odd and even numbers of groups, a partial last
// group), a decode batch and a prefill, on every kernel form.
func TestMatMulTFP4(t *testing.T) { packedKernels(t, testMatMulTFP4) }

func testMatMulTFP4(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, sh := range []struct{ m, n, k, g int }{
		{1, 64, 256, 32}, {6, 33, 96, 32}, {2, 5, 34, 32}, {1, 40, 96, 32}, {1, 17, 290, 32},
		{20, 80, 320, 32}, {1, 9, 64, 16}, {3, 9, 64, 16},
	} {
		w := &FP4Matrix{N: sh.n, K: sh.k, Group: sh.g, W: make([]byte, sh.n*sh.k/2)}
		for i := range w.W {
			w.W[i] = byte(rng.IntN(256))
		}
		w.Scale = make([]float32, sh.n*((sh.k+sh.g-1)/sh.g))
		for i := range w.Scale {
			w.Scale[i] = float32(math.Ldexp(1, rng.IntN(8)-10)) // E8M0: powers of two
		}
		deq := make([]float32, sh.n*sh.k)
		if err := weights.DequantFP4(deq, w.W, w.Scale, sh.n, sh.k, sh.g); err != nil {
			t.Fatal(err)
		}
		checkPacked(t, "fp4", sh.m, sh.n, sh.k, deq, func(out, x []float32) error { return MatMulTFP4(out, x, w, sh.m) }, rng)
	}
	bad := &FP4Matrix{N: 2, K: 3, Group: 32, W: make([]byte, 3), Scale: []float32{1, 1}}
	if err := MatMulTFP4(make([]float32, 2), make([]float32, 3), bad, 1); err == nil {
		t.Error("fp4: odd K: no error")
	}
}

// checkPacked compares run's x·wᵀ with MatMulT over deq [n, k].
func checkPacked(t *testing.T, what string, m, n, k int, deq []float32, run func(out, x []float32) error, rng *rand.Rand) {
	t.Helper()
	x := make([]float32, m*k)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	want, got := make([]float32, m*n), make([]float32, m*n)
	if err := MatMulT(want, x, deq, m, k, n); err != nil {
		t.Fatal(err)
	}
	if err := run(got, x); err != nil {
		t.Fatal(err)
	}
	for r := range m {
		for i := range n {
			var mag float64
			for j := range k {
				mag += math.Abs(float64(x[r*k+j] * deq[i*k+j]))
			}
			if d := math.Abs(float64(got[r*n+i] - want[r*n+i])); !(d <= 1e-5*mag+1e-30) {
				t.Fatalf("%s [%d×%d·%d] out[%d, %d] = %g, dequantised reference %g (|Δ| %.3g, Σ|x·w| %.3g)", what, m, n, k, r, i, got[r*n+i], want[r*n+i], d, mag)
			}
		}
	}
}

// TestQuantizeFP8: each value becomes the e4m3 code nearest value/scale (checked against
// every code), the scale is the block's largest magnitude over 448 (that value exactly
// ±448), blocks of zeros get scale 0, and a value that is not finite is refused.
func TestQuantizeFP8(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const n, k = 130, 260
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(rng.NormFloat64() * math.Exp(rng.NormFloat64()))
	}
	for j := range 128 { // block (0, 2) all zeros: columns 256..259 of rows 0..127
		for c := 256; c < 260; c++ {
			w[j*k+c] = 0
		}
	}
	q, err := QuantizeFP8(w, n, k)
	if err != nil {
		t.Fatal(err)
	}
	if q.BlockRows != 128 || q.BlockCols != 128 || len(q.Scale) != 2*3 {
		t.Fatalf("blocks %d×%d, %d scales", q.BlockRows, q.BlockCols, len(q.Scale))
	}
	if q.Scale[2] != 0 {
		t.Fatalf("a block of zeros has scale %v", q.Scale[2])
	}
	for i := range n {
		for j := range k {
			s := q.Scale[(i/128)*3+j/128]
			if s == 0 {
				continue
			}
			v := w[i*k+j] / s
			got := e4m3LUT[q.W[i*k+j]]
			best := float32(math.Inf(1))
			for c := range 256 {
				if c&0x7f == 0x7f {
					continue
				}
				best = min(best, abs32(e4m3LUT[c]-v))
			}
			if d := abs32(got - v); d > best {
				t.Fatalf("w[%d,%d]/scale = %v: code %#x = %v, off by %v; nearest is off by %v", i, j, v, q.W[i*k+j], got, d, best)
			}
		}
	}
	if c := nearestE4M3(-1000); e4m3LUT[c] != -448 {
		t.Fatalf("-1000 saturates to %v, want -448", e4m3LUT[c])
	}
	if c := nearestE4M3(1.0625); c != 0x38 { // between 1 (0x38) and 1.125 (0x39): the even code
		t.Fatalf("tie 1.0625: code %#x, want 0x38", c)
	}
	w[5*k+7] = float32(math.NaN())
	if _, err := QuantizeFP8(w, n, k); err == nil || !strings.Contains(err.Error(), "row 5") {
		t.Fatalf("NaN at row 5: err %v", err)
	}
}

// TestWeightPacked: WeightFP8 and WeightFP4 hold a checkpoint's packed matrices without a
// copy, multiply as MatMulTFP8/MatMulTFP4 do, count their packed bytes, and refuse bad
// sizes.
func TestWeightPacked(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	const m, n, k = 2, 24, 64
	f8 := &FP8Matrix{N: n, K: k, BlockRows: 128, BlockCols: 128, W: make([]byte, n*k), Scale: []float32{0.02}}
	f4 := &FP4Matrix{N: n, K: k, Group: 32, W: make([]byte, n*k/2), Scale: make([]float32, n*2)}
	for i := range f8.W {
		f8.W[i] = byte(rng.IntN(256)) &^ 1
	}
	for i := range f4.W {
		f4.W[i] = byte(rng.IntN(256))
	}
	for i := range f4.Scale {
		f4.Scale[i] = 0.5
	}
	x := randSlice(rng, m*k)
	w8, err := WeightFP8(f8)
	if err != nil {
		t.Fatal(err)
	}
	w4, err := WeightFP4(f4)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		w     *Weight
		dt    DType
		bytes int64
		want  func(out []float32) error
	}{
		{w8, DTypeFP8, n*k + 4, func(out []float32) error { return MatMulTFP8(out, x, f8, m) }},
		{w4, DTypeFP4, n*k/2 + 4*n*2, func(out []float32) error { return MatMulTFP4(out, x, f4, m) }},
	} {
		if c.w.DType != c.dt || c.w.N != n || c.w.K != k || c.w.Bytes() != c.bytes {
			t.Fatalf("%s weight: %s [%d, %d], %d bytes; want %s [%d, %d], %d", c.dt, c.w.DType, c.w.N, c.w.K, c.w.Bytes(), c.dt, n, k, c.bytes)
		}
		got, want := make([]float32, m*n), make([]float32, m*n)
		if err := c.w.MatMulT(got, x, m); err != nil {
			t.Fatal(err)
		}
		if err := c.want(want); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s weight multiplies otherwise than its product", c.dt)
		}
	}
	if _, err := WeightFP8(&FP8Matrix{N: 2, K: 4, BlockRows: 128, BlockCols: 128, W: make([]byte, 7), Scale: []float32{1}}); err == nil {
		t.Error("WeightFP8 of 7 bytes for [2, 4]: no error")
	}
}
