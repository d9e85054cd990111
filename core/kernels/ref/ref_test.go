package ref

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = r.Float32()*2 - 1
	}
	return s
}

func near(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: length %d, want %d", what, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i] - want[i])); d > tol || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s[%d] = %g, want %g (|diff| %g > %g)", what, i, got[i], want[i], d, tol)
		}
	}
}

func TestMatMulAgainstLoops(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	m, k, n := 5, 7, 3
	a, b := randSlice(r, m*k), randSlice(r, k*n)
	want := make([]float32, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float32
			for l := 0; l < k; l++ {
				s += a[i*k+l] * b[l*n+j]
			}
			want[i*n+j] = s
		}
	}
	got := make([]float32, m*n)
	if err := MatMul(got, a, b, m, k, n); err != nil {
		t.Fatal(err)
	}
	near(t, "MatMul", got, want, 1e-5)

	// MatMulT with w = bᵀ ([n, k]) gives the same product.
	w := make([]float32, n*k)
	for l := 0; l < k; l++ {
		for j := 0; j < n; j++ {
			w[j*k+l] = b[l*n+j]
		}
	}
	got2 := make([]float32, m*n)
	if err := MatMulT(got2, a, w, m, k, n); err != nil {
		t.Fatal(err)
	}
	near(t, "MatMulT", got2, want, 1e-5)
}

func TestMatMulKnown(t *testing.T) {
	// [1 2; 3 4] · [5 6; 7 8] = [19 22; 43 50]
	out := make([]float32, 4)
	if err := MatMul(out, []float32{1, 2, 3, 4}, []float32{5, 6, 7, 8}, 2, 2, 2); err != nil {
		t.Fatal(err)
	}
	near(t, "MatMul", out, []float32{19, 22, 43, 50}, 0)
}

func TestShapeErrors(t *testing.T) {
	cases := map[string]error{
		"MatMul short b":   MatMul(make([]float32, 4), make([]float32, 4), make([]float32, 3), 2, 2, 2),
		"MatMulT negative": MatMulT(nil, nil, nil, -1, 2, 2),
		"RMSNorm short w":  RMSNorm(make([]float32, 4), make([]float32, 4), make([]float32, 1), 2, 2, 1e-6),
		"SiLUMul short":    SiLUMul(make([]float32, 2), make([]float32, 3), 1, 2),
		"Softmax short":    Softmax(make([]float32, 3), 2, 2),
		"Embedding id":     Embedding(make([]float32, 2), make([]float32, 6), []int32{3}, 2),
		"Embedding neg":    Embedding(make([]float32, 2), make([]float32, 6), []int32{-1}, 2),
		"Add lengths":      Add(make([]float32, 2), make([]float32, 2), make([]float32, 3)),
		"ArgmaxRows short": ArgmaxRows(make([]int32, 1), make([]float32, 4), 2, 2),
	}
	for name, err := range cases {
		if err == nil {
			t.Errorf("%s: no error", name)
		} else if !strings.HasPrefix(err.Error(), "ref.") {
			t.Errorf("%s: error %q does not name the operator", name, err)
		}
	}
}

func TestRMSNorm(t *testing.T) {
	// rms([3, 4]) = sqrt(12.5)
	x := []float32{3, 4, 0, 0}
	out := make([]float32, 4)
	if err := RMSNorm(out, x, []float32{1, 2}, 2, 2, 0); err != nil {
		t.Fatal(err)
	}
	s := float32(math.Sqrt(12.5))
	near(t, "RMSNorm", out[:2], []float32{3 / s, 2 * 4 / s}, 1e-6)
	if err := RMSNorm(out, x, []float32{1, 2}, 2, 2, 1e-6); err != nil {
		t.Fatal(err)
	}
	if out[2] != 0 || out[3] != 0 {
		t.Fatalf("zero row gave %v, want zeros", out[2:])
	}
	near(t, "RMSNorm eps", out[:2], []float32{3 / s, 2 * 4 / s}, 1e-6)
	if err := RMSNorm(out, x, []float32{1, 2}, 2, 2, 0); err != nil {
		t.Fatal(err)
	}
	// in place
	if err := RMSNorm(x, x, []float32{1, 2}, 2, 2, 0); err != nil {
		t.Fatal(err)
	}
	near(t, "RMSNorm in place", x[:2], out[:2], 0)
}

func TestSiLUMul(t *testing.T) {
	gateUp := []float32{1, -2, 3, 4} // rows=1, dim=2: gate [1,-2], up [3,4]
	out := make([]float32, 2)
	if err := SiLUMul(out, gateUp, 1, 2); err != nil {
		t.Fatal(err)
	}
	silu := func(x float64) float64 { return x / (1 + math.Exp(-x)) }
	want := []float32{float32(silu(1) * 3), float32(silu(-2) * 4)}
	near(t, "SiLUMul", out, want, 1e-6)
	out2 := make([]float32, 2)
	if err := SiLUMulSplit(out2, gateUp[:2], gateUp[2:], 1, 2); err != nil {
		t.Fatal(err)
	}
	near(t, "SiLUMulSplit", out2, want, 1e-6)
}

func TestSoftmax(t *testing.T) {
	x := []float32{1, 2, 3, 1000, 1000, 1000}
	if err := Softmax(x, 2, 3); err != nil {
		t.Fatal(err)
	}
	e := []float64{math.Exp(-2), math.Exp(-1), 1}
	s := e[0] + e[1] + e[2]
	near(t, "Softmax", x, []float32{float32(e[0] / s), float32(e[1] / s), float32(e[2] / s), 1. / 3, 1. / 3, 1. / 3}, 1e-6)
}

func TestEmbeddingAndArgmax(t *testing.T) {
	table := []float32{0, 0, 1, 1, 2, 2}
	out := make([]float32, 6)
	if err := Embedding(out, table, []int32{2, 0, 1}, 2); err != nil {
		t.Fatal(err)
	}
	near(t, "Embedding", out, []float32{2, 2, 0, 0, 1, 1}, 0)

	nan := float32(math.NaN())
	if got := Argmax([]float32{nan, 1, 3, 3, -1}); got != 2 {
		t.Fatalf("Argmax = %d, want the first maximum 2", got)
	}
	if got := Argmax(nil); got != -1 {
		t.Fatalf("Argmax(nil) = %d, want -1", got)
	}
	ids := make([]int32, 3)
	if err := ArgmaxRows(ids, []float32{0, 5, 1, 7, 2, 3, nan, nan, nan}, 3, 3); err != nil {
		t.Fatal(err)
	}
	if ids[0] != 1 || ids[1] != 0 || ids[2] != 0 {
		t.Fatalf("ArgmaxRows = %v, want [1 0 0] (a row of NaN: 0)", ids)
	}
}
