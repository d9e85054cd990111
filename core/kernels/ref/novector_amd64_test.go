package ref

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// withoutVector runs f with the AVX2 kernels switched off, as on a CPU without AVX2 or
// FMA: every operator then takes its scalar, BLAS or gonum path.
func withoutVector(t *testing.T, f func()) {
	t.Helper()
	oldExp, oldAttn, oldDot, oldAMX := hasExpfAVX2, hasAttnAVX2, hasBF16Dot, hasAMXBF16
	hasExpfAVX2, hasAttnAVX2, hasBF16Dot, hasAMXBF16 = false, false, false, false
	defer func() { hasExpfAVX2, hasAttnAVX2, hasBF16Dot, hasAMXBF16 = oldExp, oldAttn, oldDot, oldAMX }()
	f()
}

// bf16Paths runs f once per path of MatMulTBF16 this CPU has, named: AMX tiles, float32
// with the opt-in AVX-512 BF16 prefill, float32 (each run with the ones before it
// switched off).
func bf16Paths(f func(path string)) {
	oldDot, oldAMX := hasBF16Dot, hasAMXBF16
	defer func() { hasBF16Dot, hasAMXBF16 = oldDot, oldAMX }()
	if hasAMXBF16 {
		f("amx")
	}
	hasAMXBF16 = false
	if canBF16Dot {
		hasBF16Dot = true
		f("bf16dot")
	}
	hasBF16Dot = false
	f("fp32")
}

// TestOperatorsWithoutVectorKernels: with the vector kernels off, SiLUMul, the softmax,
// products of a decode batch and decode attention give what they give with them on (to
// the bit for the elementwise ones, whose vector forms keep the scalar bits; within
// float32 rounding for the FMA kernels).
func TestOperatorsWithoutVectorKernels(t *testing.T) {
	if !hasExpfAVX2 && !hasAttnAVX2 {
		t.Skip("this CPU runs no vector kernel: every test here already takes the fallbacks")
	}
	r := rand.New(rand.NewPCG(41, 42))

	gateUp := randSlice(r, 37*2*300)
	on, off := make([]float32, 37*300), make([]float32, 37*300)
	if err := SiLUMul(on, gateUp, 37, 300); err != nil {
		t.Fatal(err)
	}
	withoutVector(t, func() { _ = SiLUMul(off, gateUp, 37, 300) })
	for i := range on {
		if math.Float32bits(on[i]) != math.Float32bits(off[i]) {
			t.Fatalf("SiLUMul[%d]: %v with the vector kernel, %v without", i, on[i], off[i])
		}
	}

	row := randSlice(r, 203)
	rowOn, rowOff := append([]float32(nil), row...), append([]float32(nil), row...)
	mxOn := rowMax(rowOn, 0.3)
	sumOn := softmaxExpSum(rowOn, 0.3, mxOn)
	var mxOff float32
	var sumOff float64
	withoutVector(t, func() { mxOff = rowMax(rowOff, 0.3); sumOff = softmaxExpSum(rowOff, 0.3, mxOff) })
	if mxOn != mxOff || math.Abs(sumOn-sumOff) > 1e-12*sumOff {
		t.Fatalf("softmax: max %v and sum %v with the vector kernels, %v and %v without", mxOn, sumOn, mxOff, sumOff)
	}
	for i := range rowOn {
		if rowOn[i] != rowOff[i] {
			t.Fatalf("softmax weight %d: %v with the vector kernels, %v without", i, rowOn[i], rowOff[i])
		}
	}

	m, k, n := 6, 256, 300
	x, w := randSlice(r, m*k), randSlice(r, n*k)
	pOn, pOff := make([]float32, m*n), make([]float32, m*n)
	if err := MatMulT(pOn, x, w, m, k, n); err != nil {
		t.Fatal(err)
	}
	withoutVector(t, func() { _ = MatMulT(pOff, x, w, m, k, n) })
	// the two paths sum k=256 products (|p| up to ~12) in different orders: fp32
	// rounding apart, up to a few ulps of the partial sums (1.1e-5 seen once)
	near(t, "MatMulT of 6 rows", pOn, pOff, 5e-5)

	bc := randomBatch(r, []int{40, 300, 17}, []int{1, 1, 2}, 16, 2, 8, 64)
	a := Attention{Heads: 8, Scale: 0.125}
	aOn, aOff := make([]float32, len(bc.q)), make([]float32, len(bc.q))
	if err := PagedAttentionBatch(aOn, bc.q, bc.c, &bc.b, a); err != nil {
		t.Fatal(err)
	}
	withoutVector(t, func() {
		if err := PagedAttentionBatch(aOff, bc.q, bc.c, &bc.b, a); err != nil {
			t.Fatal(err)
		}
	})
	near(t, "decode attention", aOn, aOff, 1e-5)
}

// TestRoPEWithoutVectorKernel: NeoX rotation gives the same bits with and without its AVX2
// form, for rotary dims with and without a tail of pairs, partial rotation included.
func TestRoPEWithoutVectorKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 44))
	for _, dim := range []int{8, 16, 20, 64, 128} {
		tab, err := NewRopeTable(dim, 64, 10000)
		if err != nil {
			t.Fatal(err)
		}
		rows, heads, headDim := 5, 3, max(dim, 24)
		x := randSlice(r, rows*heads*headDim)
		pos := []int32{0, 3, 17, 40, 63}
		on, off := append([]float32(nil), x...), append([]float32(nil), x...)
		if err := tab.RoPENeoX(on, pos, rows, heads, headDim); err != nil {
			t.Fatal(err)
		}
		withoutVector(t, func() { _ = tab.RoPENeoX(off, pos, rows, heads, headDim) })
		for i := range on {
			if math.Float32bits(on[i]) != math.Float32bits(off[i]) {
				t.Fatalf("dim %d: x[%d] = %v with the vector kernel, %v without", dim, i, on[i], off[i])
			}
		}
	}
}

// TestSoftmaxSinkWithoutVector: SoftmaxSink gives the same bits with the AVX2 kernels off.
func TestSoftmaxSinkWithoutVector(t *testing.T) {
	if !hasExpfAVX2 {
		t.Skip("this CPU has no AVX2: TestSoftmaxSink already runs the scalar form")
	}
	r := rand.New(rand.NewPCG(7, 9))
	const rows, n, scale = 3, 45, 0.125
	x := randSlice(r, rows*n)
	sinks := []float32{-1, 2, 0.25}
	on, off := slices.Clone(x), slices.Clone(x)
	if err := SoftmaxSink(on, rows, n, scale, sinks); err != nil {
		t.Fatal(err)
	}
	withoutVector(t, func() { _ = SoftmaxSink(off, rows, n, scale, sinks) })
	for i := range on {
		if math.Float32bits(on[i]) != math.Float32bits(off[i]) {
			t.Fatalf("[%d]: %v with the vector kernels, %v without", i, on[i], off[i])
		}
	}
}
