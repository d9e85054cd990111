package ref

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkWeightDTypes runs one projection of a ~120M llama (k=1024, n=5632: gate and up)
// with its weight in float32 (MatMulT), bfloat16 (MatMulTBF16) and int8 blocks
// (MatMulTInt8), for a decode step (m=1), a decode batch (m=8) and prefill chunks (m=128,
// 512); the dtype is the last element of the name. At m=1 the product streams the
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
	for _, m := range []int{1, 8, 128, 512} {
		x, out := randSlice(r, m*k), make([]float32, m*n)
		for _, dt := range []string{"fp32", "bf16", "int8"} {
			b.Run(fmt.Sprintf("m=%d/%s", m, dt), func(b *testing.B) {
				cpu0 := processCPU()
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
				flops := float64(2*m*k*n) * float64(b.N)
				b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				if cpu := processCPU() - cpu0; cpu > 0 {
					b.ReportMetric(flops/cpu.Seconds()/1e9, "GFLOP/cpu-s")
				}
			})
		}
	}
}

// BenchmarkDecodeWeights runs the products of one batch-1 decode step of the ~120M llama
// (8 layers of qkv, o, gate-up and down, and the 32000-row head) with its weights in each
// dtype, one op a projection: 0.5 GB of float32 weights, 139 MB in int8, far past L3, so
// every op streams its weight from memory as a decode step does. Reports the weights'
// bytes read per second of wall time and per second of the process's CPU time (on a
// shared machine the first follows the load, the second much less):
//
//	go test ./core/kernels/ref -run '^$' -bench DecodeWeights -count 3
func BenchmarkDecodeWeights(b *testing.B) {
	const hd, inter, qkv, vocab, layers = 1024, 2816, 1536, 32000, 8
	shapes := [][2]int{}
	for range layers {
		shapes = append(shapes, [2]int{qkv, hd}, [2]int{hd, hd}, [2]int{2 * inter, hd}, [2]int{hd, inter})
	}
	shapes = append(shapes, [2]int{vocab, hd})
	r := rand.New(rand.NewPCG(3, 4))
	for _, dt := range []DType{DTypeFP32, DTypeBF16, DTypeInt8} {
		ws := make([]*Weight, len(shapes))
		var bytes int64
		for i, s := range shapes {
			w, err := NewWeight(randSlice(r, s[0]*s[1]), s[0], s[1], dt)
			if err != nil {
				b.Fatal(err)
			}
			ws[i], bytes = w, bytes+w.Bytes()
		}
		x, out := randSlice(r, inter), make([]float32, vocab)
		b.Run(string(dt), func(b *testing.B) {
			cpu0 := processCPU()
			for b.Loop() {
				for _, w := range ws {
					if err := w.MatMulT(out[:w.N], x[:w.K], 1); err != nil {
						b.Fatal(err)
					}
				}
			}
			total := float64(bytes) * float64(b.N)
			b.ReportMetric(total/b.Elapsed().Seconds()/1e9, "GB/s")
			if cpu := processCPU() - cpu0; cpu > 0 {
				b.ReportMetric(total/cpu.Seconds()/1e9, "GB/cpu-s")
			}
		})
	}
}
