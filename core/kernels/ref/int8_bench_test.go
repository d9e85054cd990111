package ref

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkWeightDTypes runs one projection of a ~120M llama (k=1024, n=5632: gate and up)
// with its weight in float32 (MatMulT), bfloat16 (MatMulTBF16) and int8 blocks
// (MatMulTInt8), for a decode step (m=1), a decode batch (m=8) and a prefill chunk
// (m=128); the dtype is the last element of the name. At m=1 the product streams the
// weight once, so its speed is the weight's bytes over the memory bandwidth:
//
//	go test ./core/kernels/ref -run '^$' -bench WeightDTypes -benchtime 20x
func BenchmarkWeightDTypes(b *testing.B) {
	const k, n = 1024, 5632
	r := rand.New(rand.NewPCG(1, 2))
	w := randSlice(r, n*k)
	wb := make([]uint16, len(w))
	for i, v := range w {
		wb[i] = BF16(v)
	}
	q, err := QuantizeInt8(w, n, k)
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range []int{1, 8, 128} {
		x, out := randSlice(r, m*k), make([]float32, m*n)
		for _, dt := range []string{"fp32", "bf16", "int8"} {
			b.Run(fmt.Sprintf("m=%d/%s", m, dt), func(b *testing.B) {
				for b.Loop() {
					var err error
					switch dt {
					case "fp32":
						err = MatMulT(out, x, w, m, k, n)
					case "bf16":
						err = MatMulTBF16(out, x, wb, m, k, n)
					default:
						err = MatMulTInt8(out, x, q, m)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(2*m*k*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
