package ref

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkMatMulTPacked measures the FP8 (128×128 blocks) and MXFP4 products against the
// fp32, bf16 and int8 ones on a 4096×11008 weight (every form larger than this machine's 32 MiB L3), for a decode row (m=1: weight bytes streamed, reported
// as GB/s of weight read), a decode batch (8) and a prefill (128).
func BenchmarkMatMulTPacked(b *testing.B) {
	const n, k = 4096, 11008
	r := rand.New(rand.NewPCG(5, 6))
	f8 := &FP8Matrix{N: n, K: k, BlockRows: 128, BlockCols: 128, W: make([]byte, n*k), Scale: make([]float32, (n/128)*(k/128))}
	for i := range f8.W {
		f8.W[i] = byte(r.IntN(256)) &^ 0x01 // no NaN codes
	}
	f4 := &FP4Matrix{N: n, K: k, Group: 32, W: make([]byte, n*k/2), Scale: make([]float32, n*k/32)}
	for i := range f4.W {
		f4.W[i] = byte(r.IntN(256))
	}
	for i := range f8.Scale {
		f8.Scale[i] = 0.01
	}
	for i := range f4.Scale {
		f4.Scale[i] = 0.01
	}
	f32 := randSlice(r, n*k)
	b16 := make([]uint16, n*k)
	for i, v := range f32 {
		b16[i] = BF16(v)
	}
	q8, err := QuantizeInt8(f32, n, k)
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range []int{1, 8, 128} {
		x, out := randSlice(r, m*k), make([]float32, m*n)
		for _, c := range []struct {
			name  string
			bytes int64
			run   func() error
		}{
			{"fp32", 4 * n * k, func() error { return MatMulT(out, x, f32, m, k, n) }},
			{"bf16", 2 * n * k, func() error { return MatMulTBF16(out, x, b16, m, k, n) }},
			{"int8", q8.Bytes(), func() error { return MatMulTInt8(out, x, q8, m) }},
			{"fp8", f8.Bytes(), func() error { return MatMulTFP8(out, x, f8, m) }},
			{"fp4", f4.Bytes(), func() error { return MatMulTFP4(out, x, f4, m) }},
		} {
			b.Run(fmt.Sprintf("%s/m=%d", c.name, m), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if err := c.run(); err != nil {
						b.Fatal(err)
					}
				}
				s := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(float64(c.bytes)/s/1e9, "GB/s")
				b.ReportMetric(2*float64(m*n*k)/s/1e9, "GFLOP/s")
			})
		}
	}
}
