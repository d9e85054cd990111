package cudart

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/weights"
)

// fp8Operand is a random [rows, k] e4m3 matrix (no NaN codes).
func fp8Operand(r *rand.Rand, rows, k int) []byte {
	q := make([]byte, rows*k)
	for i := range q {
		b := byte(r.IntN(256))
		if b&0x7f == 0x7f {
			b &^= 1
		}
		q[i] = b
	}
	return q
}

// TestEmulatedFP8BlockGemm runs MatMulFP8Block on the emulated cuBLASLt (N and K not
// multiples of 128, so both scale tensors have partial blocks; K = 400 has 4 groups, a
// row of scales of 16 bytes, and K = 272, whose 3 do not fill one, is refused) against a float64 sum of
// the dequantised operands, x scaled per row and 128 columns (outer-major), w per 128×128
// block (row-major): error ≤ 8e-6·Σ|terms| (float32 sums of 128 terms), bf16 output the
// float32 one rounded.
// It also checks that a cached call allocates nothing, the refusals, and that the emulated
// sm_80 device is not offered the path.
func TestEmulatedFP8BlockGemm(t *testing.T) {
	d, ok := openEmulated(t)
	if !ok {
		return
	}
	if ok, why := BlockScaledFP8(d); ok || !strings.Contains(why, "9.0") {
		t.Errorf("BlockScaledFP8 on the emulated %d.%d device = %v (%s)", d.Info.Major, d.Info.Minor, ok, why)
	}
	b, err := NewBlasWith(d, BlasConfig{WorkspaceBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const m, n, k = 5, 144, 400
	groups, nb := (k+127)/128, (n+127)/128
	r := rand.New(rand.NewPCG(1, 2))
	xq, wq := fp8Operand(r, m, k), fp8Operand(r, n, k)
	xs, ws := make([]float32, groups*m), make([]float32, nb*groups)
	for i := range xs {
		xs[i] = (r.Float32() + 0.5) / 64
	}
	for i := range ws {
		ws[i] = float32(math.Ldexp(1, r.IntN(8)-10))
	}
	want, mag := make([]float64, m*n), make([]float64, m*n)
	for i := range m {
		for j := range n {
			var acc, abs float64
			for p := range k {
				a := float64(weights.F8E4M3ToFloat32(xq[i*k+p])) * float64(xs[(p/128)*m+i])
				w := float64(weights.F8E4M3ToFloat32(wq[j*k+p])) * float64(ws[(j/128)*groups+p/128])
				acc += a * w
				abs += math.Abs(a * w)
			}
			want[i*n+j], mag[i*n+j] = acc, abs
		}
	}
	var got []float32
	var gotBF []uint16
	err = d.Do(func(c *Ctx) error {
		bufs := make([]Buffer, 6)
		for i, size := range []int{m * k, 4 * len(xs), n * k, 4 * len(ws), 4 * m * n, 2 * m * n} {
			if bufs[i], err = c.Alloc(int64(size)); err != nil {
				return err
			}
			defer c.Free(bufs[i])
		}
		Upload(c, bufs[0].Ptr, xq)
		Upload(c, bufs[1].Ptr, xs)
		Upload(c, bufs[2].Ptr, wq)
		Upload(c, bufs[3].Ptr, ws)
		g := FP8BlockGemm{M: m, N: n, K: k, OutType: F32}
		for range 2 { // the second call reuses the plan
			if err := b.MatMulFP8Block(c, nil, g, bufs[4].Ptr, bufs[0].Ptr, bufs[1].Ptr, bufs[2].Ptr, bufs[3].Ptr); err != nil {
				return err
			}
		}
		if hits, misses, _ := b.PlanStats(); hits != 1 || misses != 1 {
			t.Errorf("plan stats: %d hits, %d misses, want 1 and 1", hits, misses)
		}
		if n := testing.AllocsPerRun(20, func() {
			if err := b.MatMulFP8Block(c, nil, g, bufs[4].Ptr, bufs[0].Ptr, bufs[1].Ptr, bufs[2].Ptr, bufs[3].Ptr); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("a cached block-scaled GEMM allocates %v times", n)
		}
		got = make([]float32, m*n)
		Download(c, got, bufs[4].Ptr)
		g.OutType = BF16
		if err := b.MatMulFP8Block(c, nil, g, bufs[5].Ptr, bufs[0].Ptr, bufs[1].Ptr, bufs[2].Ptr, bufs[3].Ptr); err != nil {
			return err
		}
		gotBF = make([]uint16, m*n)
		Download(c, gotBF, bufs[5].Ptr)
		for _, bad := range []FP8BlockGemm{{M: m, N: n, K: 100, OutType: F32}, {M: m, N: n, K: 272, OutType: F32}, {M: m, N: n, K: k, OutType: F16},
			{M: m, N: n, K: k, OutType: F32, XScaleLD: m + 3}} {
			if err := b.MatMulFP8Block(c, nil, bad, bufs[4].Ptr, bufs[0].Ptr, bufs[1].Ptr, bufs[2].Ptr, bufs[3].Ptr); err == nil {
				t.Errorf("%v (scale stride %d) accepted", bad, bad.XScaleLD)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if e := math.Abs(float64(got[i])-want[i]) / mag[i]; e > 8e-6 {
			t.Fatalf("out[%d] = %g, want %g (error %.3g of the sum of |terms| %g)", i, got[i], want[i], e, mag[i])
		}
		if gotBF[i] != toBF16(got[i : i+1])[0] {
			t.Fatalf("bf16 out[%d] = %#04x, the f32 result %g rounds to %#04x", i, gotBF[i], got[i], toBF16(got[i : i+1])[0])
		}
	}
}
