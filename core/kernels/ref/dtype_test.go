package ref

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestWeightDTypes: a Weight multiplies as its dtype's product does: fp32 to the bit as
// MatMulT on the same slice, bf16 as MatMulTBF16 on the rounded weights, int8 as
// MatMulTInt8 on QuantizeInt8's, fp8 as MatMulTFP8 on QuantizeFP8's; each within its
// tolerance of the float32 product (bf16: 2^-8 of Σ|x·w|, a weight's relative rounding;
// int8: int8Bound; fp8: Σ|x|·(|w|/16 + scale/1024), e4m3's rounding).
func TestWeightDTypes(t *testing.T) {
	r := rand.New(rand.NewPCG(91, 92))
	const m, k, n = 3, 96, 40
	x, w := randSlice(r, m*k), randSlice(r, n*k)
	ref32 := make([]float32, m*n)
	if err := MatMulT(ref32, x, w, m, k, n); err != nil {
		t.Fatal(err)
	}
	for _, dt := range DTypes {
		wt, err := NewWeight(w, n, k, dt)
		if err != nil {
			t.Fatal(err)
		}
		if wt.DType != dt || wt.N != n || wt.K != k {
			t.Fatalf("%s: weight %s %dx%d", dt, wt.DType, wt.N, wt.K)
		}
		if want := map[DType]int64{DTypeFP32: 4 * n * k, DTypeBF16: 2 * n * k, DTypeInt8: 48 * 3 * 32 * 36 / 32, DTypeFP8: n*k + 4}[dt]; wt.Bytes() != want {
			t.Fatalf("%s: %d bytes, want %d", dt, wt.Bytes(), want)
		}
		got := make([]float32, m*n)
		if err := wt.MatMulT(got, x, m); err != nil {
			t.Fatal(err)
		}
		switch dt {
		case DTypeFP32:
			for i := range got {
				if got[i] != ref32[i] {
					t.Fatalf("fp32: out[%d] = %v, MatMulT %v", i, got[i], ref32[i])
				}
			}
		case DTypeBF16:
			for i := range m {
				for j := range n {
					var mag float64
					for l := range k {
						mag += math.Abs(float64(x[i*k+l] * w[j*k+l]))
					}
					if e := math.Abs(float64(got[i*n+j] - ref32[i*n+j])); e > mag/256 {
						t.Fatalf("bf16: out[%d,%d] = %v, fp32 %v: off by %.3g, more than 2^-8 of Σ|x·w| = %.3g", i, j, got[i*n+j], ref32[i*n+j], e, mag)
					}
				}
			}
		case DTypeInt8:
			for i := range m {
				for j := range n {
					if e := math.Abs(float64(got[i*n+j] - ref32[i*n+j])); e > int8Bound(x, w, wt.q8, i, j, k)+1e-5 {
						t.Fatalf("int8: out[%d,%d] = %v, fp32 %v: off by %.3g", i, j, got[i*n+j], ref32[i*n+j], e)
					}
				}
			}
		case DTypeFP8:
			want := make([]float32, m*n)
			if err := MatMulTFP8(want, x, wt.f8, m); err != nil {
				t.Fatal(err)
			}
			s := float64(wt.f8.Scale[0])
			for i := range m {
				for j := range n {
					if got[i*n+j] != want[i*n+j] {
						t.Fatalf("fp8: out[%d,%d] = %v, MatMulTFP8 %v", i, j, got[i*n+j], want[i*n+j])
					}
					var bound float64
					for l := range k {
						bound += math.Abs(float64(x[i*k+l])) * (math.Abs(float64(w[j*k+l]))/16 + s/1024)
					}
					if e := math.Abs(float64(got[i*n+j] - ref32[i*n+j])); e > bound+1e-5 {
						t.Fatalf("fp8: out[%d,%d] = %v, fp32 %v: off by %.3g, bound %.3g", i, j, got[i*n+j], ref32[i*n+j], e, bound)
					}
				}
			}
		}
		if !strings.HasPrefix(dt.Kernel(), string(dt)) {
			t.Fatalf("%s: kernel %q does not name the dtype", dt, dt.Kernel())
		}
	}
}

// TestParseDType: the spellings of each dtype, and a clear error for others.
func TestParseDType(t *testing.T) {
	for s, want := range map[string]DType{"": DTypeFP32, "FP32": DTypeFP32, "float32": DTypeFP32, "bf16": DTypeBF16, "bfloat16": DTypeBF16, "int8": DTypeInt8, "Q8_0": DTypeInt8, "fp8": DTypeFP8, "E4M3": DTypeFP8} {
		if got, err := ParseDType(s); err != nil || got != want {
			t.Fatalf("ParseDType(%q) = %q, %v; want %q", s, got, err, want)
		}
	}
	if _, err := ParseDType("fp4"); err == nil || !strings.Contains(err.Error(), `"fp4"`) || !strings.Contains(err.Error(), "fp8") {
		t.Fatalf("fp4: %v", err)
	}
	if _, err := NewWeight(make([]float32, 4), 2, 2, "int4"); err == nil || !strings.Contains(err.Error(), "int4") {
		t.Fatalf("int4: %v", err)
	}
	var w *Weight
	if err := w.MatMulT(nil, nil, 1); err == nil {
		t.Fatal("a nil weight multiplied without an error")
	}
}
