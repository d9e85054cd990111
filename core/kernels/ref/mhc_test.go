package ref

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

func TestRMSNormUnweightedIsRMSNormWithOnes(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	x := randSlice(r, 3*8)
	ones := make([]float32, 8)
	for i := range ones {
		ones[i] = 1
	}
	want := make([]float32, len(x))
	if err := RMSNorm(want, x, ones, 3, 8, 1e-6); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, len(x))
	if err := RMSNormUnweighted(got, x, 3, 8, 1e-6); err != nil {
		t.Fatal(err)
	}
	near(t, "RMSNormUnweighted", got, want, 0)
	if err := RMSNormUnweighted(got[:5], x, 3, 8, 1e-6); err == nil {
		t.Error("a short out slice was accepted")
	}
}

// TestHyperConnWeights checks pre and post against their formulas and that many Sinkhorn
// iterations make comb doubly stochastic.
func TestHyperConnWeights(t *testing.T) {
	const hc = 3
	r := rand.New(rand.NewPCG(5, 6))
	mix, base := randSlice(r, (2+hc)*hc), randSlice(r, (2+hc)*hc)
	scale := []float32{1.5, 0.5, 2}
	pre, post, comb := make([]float32, hc), make([]float32, hc), make([]float32, hc*hc)
	if err := HyperConnWeights(pre, post, comb, mix, base, scale, hc, 50, 1e-6); err != nil {
		t.Fatal(err)
	}
	sig := func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
	for i := range hc {
		if want := sig(float64(mix[i]*scale[0]+base[i])) + 1e-6; math.Abs(float64(pre[i])-want) > 1e-6 {
			t.Errorf("pre[%d] = %g, want %g", i, pre[i], want)
		}
		if want := 2 * sig(float64(mix[hc+i]*scale[1]+base[hc+i])); math.Abs(float64(post[i])-want) > 1e-6 {
			t.Errorf("post[%d] = %g, want %g", i, post[i], want)
		}
	}
	for i := range hc {
		var row, col float64
		for j := range hc {
			row += float64(comb[i*hc+j])
			col += float64(comb[j*hc+i])
		}
		if math.Abs(row-1) > 1e-4 || math.Abs(col-1) > 1e-4 {
			t.Errorf("comb row %d sums to %g, column %d to %g, want 1", i, row, i, col)
		}
	}
	// One iteration is softmax rows (+eps), then one column normalisation.
	if err := HyperConnWeights(pre, post, comb, mix, base, scale, hc, 1, 0); err != nil {
		t.Fatal(err)
	}
	want := make([]float64, hc*hc)
	for i := range hc {
		var s float64
		for j := range hc {
			want[i*hc+j] = math.Exp(float64(mix[2*hc+i*hc+j]*scale[2] + base[2*hc+i*hc+j]))
			s += want[i*hc+j]
		}
		for j := range hc {
			want[i*hc+j] /= s
		}
	}
	for j := range hc {
		var s float64
		for i := range hc {
			s += want[i*hc+j]
		}
		for i := range hc {
			if w := want[i*hc+j] / s; math.Abs(float64(comb[i*hc+j])-w) > 1e-6 {
				t.Errorf("comb[%d][%d] = %g after one iteration, want %g", i, j, comb[i*hc+j], w)
			}
		}
	}
	if err := HyperConnWeights(pre, post, comb, mix[:4], base, scale, hc, 1, 0); err == nil {
		t.Error("a short mix was accepted")
	}
}

// TestHyperCollapseExpand checks the collapse and the expansion, whose mixing reads comb
// transposed (out stream k gathers comb[j][k]·stream j).
func TestHyperCollapseExpand(t *testing.T) {
	streams := []float32{1, 2, 10, 20} // [2 streams, 2]
	out := make([]float32, 2)
	if err := HyperCollapse(out, streams, []float32{0.5, 2}, 2, 2); err != nil {
		t.Fatal(err)
	}
	near(t, "HyperCollapse", out, []float32{20.5, 41}, 0)
	comb := []float32{0.9, 0.1, 0.3, 0.7} // not symmetric
	next := make([]float32, 4)
	if err := HyperExpand(next, streams, []float32{1, -1}, []float32{2, 3}, comb, 2, 2); err != nil {
		t.Fatal(err)
	}
	// k=0: 2·[1,−1] + 0.9·[1,2] + 0.3·[10,20];  k=1: 3·[1,−1] + 0.1·[1,2] + 0.7·[10,20]
	near(t, "HyperExpand", next, []float32{2 + 0.9 + 3, -2 + 1.8 + 6, 3 + 0.1 + 7, -3 + 0.2 + 14}, 1e-5)
}

// TestHyperCollapseExpandMatchScalar: the vector forms give the scalar loops' bits, on
// a dim that is not a multiple of the vector width, and a 0 weight against an infinite
// stream still makes NaN, as 0·Inf does in the loop (and in torch).
func TestHyperCollapseExpandMatchScalar(t *testing.T) {
	const hc, dim = 4, 37
	rng := rand.New(rand.NewPCG(5, 6))
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	streams, block, pre, post, comb := fill(hc*dim), fill(dim), fill(hc), fill(hc), fill(hc*hc)
	pre[1], comb[2*hc+3] = 0, 0
	streams[2*dim+5] = float32(math.Inf(1))
	wantC := make([]float32, dim)
	for i := range hc {
		for d := range dim {
			wantC[d] += float32(pre[i] * streams[i*dim+d]) // rounded, not fused: as SSE computes it
		}
	}
	wantE := make([]float32, hc*dim)
	for k := range hc {
		for d := range dim {
			wantE[k*dim+d] = post[k] * block[d]
		}
		for j := range hc {
			for d := range dim {
				wantE[k*dim+d] += float32(comb[j*hc+k] * streams[j*dim+d])
			}
		}
	}
	gotC, gotE := make([]float32, dim), make([]float32, hc*dim)
	if err := HyperCollapse(gotC, streams, pre, hc, dim); err != nil {
		t.Fatal(err)
	}
	if err := HyperExpand(gotE, streams, block, post, comb, hc, dim); err != nil {
		t.Fatal(err)
	}
	// Bit for bit on amd64, where gonum's axpy is assembly that rounds as the loops do;
	// elsewhere its Go loop may be fused into FMAs.
	tol := 0.0
	if runtime.GOARCH != "amd64" {
		tol = 1e-6
	}
	same := func(name string, got, want []float32) {
		for i := range want {
			if got[i] != got[i] && want[i] != want[i] {
				continue // both NaN
			}
			if d := math.Abs(float64(got[i]) - float64(want[i])); math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(d <= tol*(1+math.Abs(float64(want[i])))) {
				t.Fatalf("%s[%d] = %v, the scalar loop gives %v", name, i, got[i], want[i])
			}
		}
	}
	same("HyperCollapse", gotC, wantC)
	same("HyperExpand", gotE, wantE)
	if v := gotE[3*dim+5]; v == v {
		t.Fatalf("HyperExpand: stream 3 mixes the infinite stream 2 with weight 0 and gives %v, want NaN", v)
	}
}
