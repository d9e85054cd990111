package cuda

import (
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"testing"

	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/weights"
)

// TestFloat32ToE4M3 checks the host encoder against weights.F8E4M3ToFloat32: every finite
// code round-trips, a value between two codes goes to the nearer (the even one on a tie),
// and values past 448 saturate.
func TestFloat32ToE4M3(t *testing.T) {
	for b := range 256 {
		v := weights.F8E4M3ToFloat32(uint8(b))
		if math.IsNaN(float64(v)) {
			if got := Float32ToE4M3(v); got != 0x7f {
				t.Errorf("NaN encodes to %#02x, want 0x7f", got)
			}
			continue
		}
		got := Float32ToE4M3(v)
		if weights.F8E4M3ToFloat32(got) != v || (v != 0 && got != byte(b)) {
			t.Errorf("code %#02x (%g) encodes to %#02x", b, v, got)
		}
	}
	for _, c := range []struct {
		v    float32
		want byte
	}{
		{1.0625, 0x38}, // halfway between 1 (0x38, even) and 1.125
		{1.1875, 0x3a}, // halfway between 1.125 and 1.25 (0x3a, even)
		{1.05, 0x38}, {1.08, 0x39},
		{0.0029296875, 0x02}, // 1.5·2^-9 ties to 2·2^-9
		{500, 0x7e}, {-1e30, 0xfe}, {float32(math.Inf(1)), 0x7e},
	} {
		if got := Float32ToE4M3(c.v); got != c.want {
			t.Errorf("%g encodes to %#02x, want %#02x", c.v, got, c.want)
		}
	}
}

// TestEmuFP8Quant runs resin_fp8_quant on float32 and bf16 rows whose width is not a
// multiple of 128 (a partial last group), with a padded scale stride, a group of zeros, a
// NaN, values in e4m3's subnormal range and both scale formats: codes and scales must
// equal QuantizeFP8Host's bit for bit.
func TestEmuFP8Quant(t *testing.T) {
	const rows, cols, ld = 3, 300, 4
	groups := (cols + FP8Group - 1) / FP8Group
	for _, bf16 := range []bool{false, true} {
		for _, pow2 := range []bool{false, true} {
			m := &emuMem{t: t}
			x := emuRnd(21, rows*cols, 3)
			for i := 128; i < 256; i++ {
				x[i] = 0 // row 0, group 1: amax 0
			}
			x[cols+5] = float32(math.NaN())
			x[2*cols+7] = 1e-6
			x[2*cols+8] = 40
			x[2*cols+9] = 0.01 * 40 / 448 // 0.01 after scaling: an e4m3 subnormal
			x[2*cols+10] = -0.0035 * 40 / 448
			var xp = m.f32(x)
			if bf16 {
				xp = m.bf16(emuRoundBF16(x))
			}
			q := FP8Quant{Q: m.alloc(rows * cols), Scale: m.alloc(4 * groups * ld), X: xp, Rows: rows, Cols: cols, ScaleLD: ld, BF16: bf16, Pow2: pow2}
			var spec launchSpec
			if err := q.pack(&spec); err != nil {
				t.Fatal(err)
			}
			name := "fp8 quant"
			emuRun(t, name, m, fromSpec(&spec))
			wantQ, wantS := make([]byte, rows*cols), make([]float32, groups*ld)
			if err := QuantizeFP8Host(wantQ, wantS, x, rows, cols, ld, pow2); err != nil {
				t.Fatal(err)
			}
			gotQ := make([]byte, rows*cols)
			copy(gotQ, m.find(q.Q))
			for i := range wantQ {
				if gotQ[i] != wantQ[i] {
					t.Fatalf("bf16 %v pow2 %v: code %d = %#02x, want %#02x (x %g)", bf16, pow2, i, gotQ[i], wantQ[i], x[i])
				}
			}
			gotS := m.getF32(q.Scale, groups*ld)
			for g := range groups {
				for r := range rows {
					if gotS[g*ld+r] != wantS[g*ld+r] {
						t.Fatalf("bf16 %v pow2 %v: scale of row %d group %d = %g, want %g", bf16, pow2, r, g, gotS[g*ld+r], wantS[g*ld+r])
					}
				}
				if v := math.Float32bits(gotS[g*ld+rows]); v != 0xffffffff {
					t.Fatalf("the padding of the scale stride was written (%#x)", v)
				}
			}
			if c := wantQ[2*cols+9]; !pow2 && (c == 0 || c >= 0x08) {
				t.Fatalf("the subnormal case quantised to %#02x", c)
			}
			if pow2 {
				for _, s := range wantS[:rows] {
					if math.Float32bits(s)&0x7fffff != 0 {
						t.Fatalf("pow2 scale %g is not a power of two", s)
					}
				}
			}
		}
	}
	if err := (&FP8Quant{Rows: 4, Cols: 128, ScaleLD: 3}).pack(new(launchSpec)); err == nil {
		t.Error("a scale stride below the rows accepted")
	}
}

// fp8Case is a block-scaled FP8 weight [n, k] as a checkpoint ships it: e4m3 codes (no
// NaN) and one float32 scale per 128×128 block, ue8m0 values when pow2.
func fp8Case(seed uint64, n, k int, pow2 bool) ([]byte, []float32) {
	r := rand.New(rand.NewPCG(seed, 3))
	w := make([]byte, n*k)
	for i := range w {
		b := byte(r.IntN(256))
		if b&0x7f == 0x7f {
			b &^= 1
		}
		w[i] = b
	}
	s := make([]float32, ((n+127)/128)*((k+127)/128))
	for i := range s {
		if pow2 {
			s[i] = float32(math.Ldexp(1, r.IntN(9)-12))
		} else {
			s[i] = (r.Float32() + 0.5) / 256
		}
	}
	return w, s
}

// dequantActs widens FP8Quant's codes and scales back to float32 [rows, cols].
func dequantActs(q []byte, s []float32, rows, cols, ld int) []float32 {
	out := make([]float32, rows*cols)
	for r := range rows {
		for c := range cols {
			out[r*cols+c] = weights.F8E4M3ToFloat32(q[r*cols+c]) * s[(c/FP8Group)*ld+r]
		}
	}
	return out
}

// TestEmuFP8Gemm runs the fallback block-scaled FP8 GEMM on shapes with partial row,
// column and K blocks, float32 and bf16 outputs, against ref.MatMulT over the same
// dequantised operands (weights.DequantFP8 for the weight): relative error ≤ 2e-5·(1+|ref|)
// (the kernel sums each 128-wide group before scaling it, the reference element by element);
// and the grouped form over a masked layout with an empty expert (zeros past each count).
func TestEmuFP8Gemm(t *testing.T) {
	for _, c := range []struct {
		m, n, k int
		pow2    bool
	}{{5, 200, 300, true}, {17, 64, 128, false}} {
		m := &emuMem{t: t}
		ld := c.m + 3
		groups := (c.k + 127) / 128
		x := emuRnd(31, c.m*c.k, 2)
		xq, xs := make([]byte, c.m*c.k), make([]float32, groups*ld)
		if err := QuantizeFP8Host(xq, xs, x, c.m, c.k, ld, c.pow2); err != nil {
			t.Fatal(err)
		}
		w, ws := fp8Case(32, c.n, c.k, c.pow2)
		wd := make([]float32, c.n*c.k)
		if err := weights.DequantFP8(wd, w, ws, c.n, c.k, 128, 128); err != nil {
			t.Fatal(err)
		}
		want := make([]float32, c.m*c.n)
		if err := ref.MatMulT(want, dequantActs(xq, xs, c.m, c.k, ld), wd, c.m, c.k, c.n); err != nil {
			t.Fatal(err)
		}
		g := FP8Gemm{Out: m.alloc(4 * c.m * c.n), XQ: m.bytes(xq), XScale: m.f32(xs), WQ: m.bytes(w), WScale: m.f32(ws),
			M: c.m, N: c.n, K: c.k, XScaleLD: ld}
		var spec launchSpec
		if err := g.pack(&spec); err != nil {
			t.Fatal(err)
		}
		emuRun(t, "fp8 gemm", m, fromSpec(&spec))
		got := m.getF32(g.Out, c.m*c.n)
		emuClose(t, "fp8 gemm", got, want, 2e-5)
		g.OutBF16, g.Out = true, m.alloc(2*c.m*c.n)
		if err := g.pack(&spec); err != nil {
			t.Fatal(err)
		}
		emuRun(t, "fp8 gemm bf16", m, fromSpec(&spec))
		gotBF := m.getBF16(g.Out, c.m*c.n)
		for i := range got {
			if want := weights.BF16ToFloat32(weights.Float32ToBF16(got[i])); gotBF[i] != want {
				t.Fatalf("bf16 output %d = %g, the float32 output %g rounds to %g", i, gotBF[i], got[i], want)
			}
		}
	}
	// Grouped over a masked layout: a full, an empty and a partial expert, the rows past
	// each count holding NaN codes that must not be read.
	const experts, maxRows, n, k = 3, 6, 72, 160
	counts := []int32{6, 0, 3}
	groups := (k + 127) / 128
	x := emuRnd(33, experts*maxRows*k, 2)
	xq, xs := make([]byte, len(x)), make([]float32, groups*experts*maxRows)
	if err := QuantizeFP8Host(xq, xs, x, experts*maxRows, k, 0, true); err != nil {
		t.Fatal(err)
	}
	xd := dequantActs(xq, xs, experts*maxRows, k, experts*maxRows)
	var wq []byte
	var ws []float32
	want := make([]float32, experts*maxRows*n)
	for e := range experts {
		w, s := fp8Case(uint64(34+e), n, k, true)
		wd := make([]float32, n*k)
		if err := weights.DequantFP8(wd, w, s, n, k, 128, 128); err != nil {
			t.Fatal(err)
		}
		wq, ws = append(wq, w...), append(ws, s...)
		rows := int(counts[e])
		if err := ref.MatMulT(want[e*maxRows*n:(e*maxRows+rows)*n], xd[e*maxRows*k:(e*maxRows+rows)*k], wd, rows, k, n); err != nil {
			t.Fatal(err)
		}
		for i := (e*maxRows + rows) * k; i < (e+1)*maxRows*k; i++ {
			xq[i] = 0x7f
		}
	}
	m := &emuMem{t: t}
	g := FP8Gemm{Out: m.alloc(4 * experts * maxRows * n), XQ: m.bytes(xq), XScale: m.f32(xs), WQ: m.bytes(wq), WScale: m.f32(ws),
		Counts: m.i32(counts), M: maxRows, N: n, K: k, Experts: experts}
	var spec launchSpec
	if err := g.pack(&spec); err != nil {
		t.Fatal(err)
	}
	emuRun(t, "fp8 grouped gemm", m, fromSpec(&spec))
	emuClose(t, "fp8 grouped gemm", m.getF32(g.Out, experts*maxRows*n), want, 2e-5)
	if err := (&FP8Gemm{M: 4, N: 8, K: 128, XScaleLD: 2}).pack(new(launchSpec)); err == nil {
		t.Error("an activation scale stride below the rows accepted")
	}
}

// mxfp4Case is an MXFP4 weight [experts, n, k] as a checkpoint ships it: packed e2m1 pairs
// and ue8m0 bytes per 32 inputs.
func mxfp4Case(seed uint64, experts, n, k int) ([]byte, []byte) {
	r := rand.New(rand.NewPCG(seed, 5))
	w := make([]byte, experts*n*k/2)
	for i := range w {
		w[i] = byte(r.IntN(256))
	}
	s := make([]byte, experts*n*((k+31)/32))
	for i := range s {
		s[i] = byte(120 + r.IntN(12))
	}
	return w, s
}

// TestEmuMXFP4Gemm runs W4A16 over a masked expert layout with a full, an empty and a
// partly filled expert (rows past each count hold NaN, which must not be read), K not a
// multiple of the 64-wide tile and N not a multiple of 64, with float32 and bf16
// activations, against ref.MatMulT over weights.DequantFP4's weights and the bf16-rounded
// activations: relative error ≤ 1e-5·(1+|ref|); rows past a count must be zeros.
func TestEmuMXFP4Gemm(t *testing.T) {
	const experts, maxRows, n, k = 3, 20, 70, 96
	counts := []int32{20, 0, 7}
	w, sb := mxfp4Case(41, experts, n, k)
	sk := (k + 31) / 32
	x := emuRnd(42, experts*maxRows*k, 2)
	for e := range experts {
		for i := int(counts[e]) * k; i < maxRows*k; i++ {
			x[e*maxRows*k+i] = float32(math.NaN())
		}
	}
	xr := append([]float32(nil), x...)
	xb := emuRoundBF16(xr)
	want := make([]float32, experts*maxRows*n)
	for e := range experts {
		wd := make([]float32, n*k)
		s := make([]float32, n*sk)
		for i := range s {
			s[i] = weights.E8M0ToFloat32(sb[e*n*sk+i])
		}
		if err := weights.DequantFP4(wd, w[e*n*k/2:(e+1)*n*k/2], s, n, k, MXFP4Group); err != nil {
			t.Fatal(err)
		}
		rows := int(counts[e])
		if rows == 0 {
			continue
		}
		if err := ref.MatMulT(want[e*maxRows*n:(e*maxRows+rows)*n], xr[e*maxRows*k:(e*maxRows+rows)*k], wd, rows, k, n); err != nil {
			t.Fatal(err)
		}
	}
	for _, bf16 := range []bool{false, true} {
		m := &emuMem{t: t}
		xp := m.f32(x)
		if bf16 {
			xp = m.bf16(xb)
		}
		g := MXFP4Gemm{Out: m.alloc(4 * experts * maxRows * n), X: xp, W: m.bytes(w), Scale: m.bytes(sb), Counts: m.i32(counts),
			Experts: experts, MaxRows: maxRows, N: n, K: k, BF16: bf16}
		var spec launchSpec
		if err := g.pack(&spec); err != nil {
			t.Fatal(err)
		}
		emuRun(t, "mxfp4 gemm", m, fromSpec(&spec))
		emuClose(t, "mxfp4 gemm", m.getF32(g.Out, experts*maxRows*n), want, 1e-5)
	}
	// One plain linear: no counts, every row.
	m := &emuMem{t: t}
	rows := 5
	g := MXFP4Gemm{Out: m.alloc(4 * rows * n), X: m.f32(x[:rows*k]), W: m.bytes(w[:n*k/2]), Scale: m.bytes(sb[:n*sk]),
		Experts: 1, MaxRows: rows, N: n, K: k}
	var spec launchSpec
	if err := g.pack(&spec); err != nil {
		t.Fatal(err)
	}
	emuRun(t, "mxfp4 linear", m, fromSpec(&spec))
	emuClose(t, "mxfp4 linear", m.getF32(g.Out, rows*n), want[:rows*n], 1e-5)
	if err := (&MXFP4Gemm{Experts: 1, MaxRows: 1, N: 8, K: 33}).pack(new(launchSpec)); err == nil {
		t.Error("an odd K accepted")
	}
}

// TestQuantLinearShapesMatchSource checks the launchers' tile sizes against quant_linear.cu.
func TestQuantLinearShapesMatchSource(t *testing.T) {
	src, err := files.ReadFile("quant_linear.cu")
	if err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string]int{"RESIN_QL_GROUP": FP8Group, "RESIN_QL_TM": qlTileRows, "RESIN_QL_TN": qlTileCols, "RESIN_QL_THREADS": qlThreads} {
		m := regexp.MustCompile(`(?m)^#define ` + name + ` (\d+)\b`).FindSubmatch(src)
		if m == nil {
			t.Fatalf("quant_linear.cu defines no %s", name)
		}
		if want, _ := strconv.Atoi(string(m[1])); want != got {
			t.Errorf("%s is %d, the launcher uses %d", name, want, got)
		}
	}
}

// packQuantLinear packs quant_linear.cu's launches at DeepSeek-V4-Flash's shapes, for the
// host tests' packAll.
func packQuantLinear(t testing.TB, k *Kernels) {
	t.Helper()
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, bf16 := range []bool{false, true} {
		q := FP8Quant{Q: 1, Scale: 2, X: 3, Rows: 64, Cols: 4096, BF16: bf16, Pow2: true}
		id := kFP8QuantF32
		if bf16 {
			id = kFP8QuantBF16
		}
		check(q.pack(&k.specs[id]))
		g := FP8Gemm{Out: 1, XQ: 2, XScale: 3, WQ: 4, WScale: 5, M: 64, N: 1024, K: 4096, OutBF16: bf16}
		id = kFP8GemmF32
		if bf16 {
			id = kFP8GemmBF16
		}
		check(g.pack(&k.specs[id]))
		f := MXFP4Gemm{Out: 1, X: 2, W: 3, Scale: 4, Counts: 5, Experts: 256, MaxRows: 64, N: 4096, K: 2048, BF16: bf16}
		id = kMXFP4GemmF32
		if bf16 {
			id = kMXFP4GemmBF16
		}
		check(f.pack(&k.specs[id]))
	}
	check(packCastBF16(&k.specs[kCastBF16], 1, 2, 64*4096))
}

// TestEmuCastBF16 checks the cast against weights.Float32ToBF16, NaN and ties included.
func TestEmuCastBF16(t *testing.T) {
	x := emuRnd(51, 1000, 100)
	x[3], x[4] = float32(math.NaN()), math.Float32frombits(0x3f808000) // a tie, to even
	m := &emuMem{t: t}
	out := m.alloc(2 * len(x))
	var spec launchSpec
	if err := packCastBF16(&spec, out, m.f32(x), len(x)); err != nil {
		t.Fatal(err)
	}
	emuRun(t, "cast bf16", m, fromSpec(&spec))
	got := make([]uint16, len(x))
	m.get(out, got)
	for i, v := range x {
		want := weights.Float32ToBF16(v)
		if math.IsNaN(float64(v)) {
			if got[i]&0x7f80 != 0x7f80 || got[i]&0x7f == 0 {
				t.Fatalf("NaN cast to %#04x", got[i])
			}
			continue
		}
		if got[i] != want {
			t.Fatalf("cast of %g = %#04x, want %#04x", v, got[i], want)
		}
	}
	if err := packCastBF16(new(launchSpec), 1, 2, 0); err == nil {
		t.Error("an empty cast accepted")
	}
}
