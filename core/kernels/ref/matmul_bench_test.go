package ref

import (
	"fmt"
	"testing"

	cblas "github.com/resin-llm/resin/core/blas"
)

// BenchmarkMatMulTLlama runs MatMulT at the shapes of a ~120M-parameter llama (hidden 1024,
// intermediate 2816, vocab 32000) for decode (m=1), a decode batch (m=8) and a prefill
// chunk (m=512), on the BLAS library this process loaded (when there is one) and on gonum.
// The backend is the first element of the name:
//
//	go test ./core/kernels/ref -run '^$' -bench MatMulTLlama -count 3
func BenchmarkMatMulTLlama(b *testing.B) {
	backends := []string{"gonum"}
	if lib := cblas.Default(); lib != nil {
		backends = append([]string{lib.Vendor}, backends...)
	}
	shapes := []struct {
		name string
		k, n int
	}{
		{"qkv", 1024, 3072}, {"gate", 1024, 2816}, {"down", 2816, 1024}, {"lmhead", 1024, 32000},
	}
	for _, backend := range backends {
		for _, m := range []int{1, 2, 8, 512} {
			for _, s := range shapes {
				name := fmt.Sprintf("%s/m=%d/%s_k=%d_n=%d", backend, m, s.name, s.k, s.n)
				b.Run(name, func(b *testing.B) {
					benchMatMulT(b, backend == "gonum", m, s.k, s.n)
				})
			}
		}
	}
}

// BenchmarkMatMulTSmall measures the products around minBLASWeight, where the call into
// the library starts to pay for itself; the library is called directly, whatever the size.
func BenchmarkMatMulTSmall(b *testing.B) {
	lib := cblas.Default()
	if lib == nil {
		b.Skipf("no BLAS library: %s", cblas.Info().Fallback)
	}
	for _, d := range []int{16, 32, 48, 64, 96} {
		for _, m := range []int{1, d} {
			b.Run(fmt.Sprintf("%s/m=%d_k=%d_n=%d", lib.Vendor, m, d, d), func(b *testing.B) {
				benchGEMM(b, func(out, x, w []float32) error { return lib.Sgemm(true, m, d, d, x, w, out) }, m, d, d)
			})
			b.Run(fmt.Sprintf("gonum/m=%d_k=%d_n=%d", m, d, d), func(b *testing.B) {
				benchMatMulT(b, true, m, d, d)
			})
		}
	}
}

func benchMatMulT(b *testing.B, gonum bool, m, k, n int) {
	benchGEMM(b, func(out, x, w []float32) error {
		if gonum {
			gonumGemm(true, out, x, w, m, k, n)
			return nil
		}
		return MatMulT(out, x, w, m, k, n)
	}, m, k, n)
}

// benchGEMM times gemm(out, x, w) on x [m, k] and w [n, k].
func benchGEMM(b *testing.B, gemm func(out, x, w []float32) error, m, k, n int) {
	x, w, out := make([]float32, m*k), make([]float32, n*k), make([]float32, m*n)
	for i := range x {
		x[i] = float32(i%7) * 0.1
	}
	for i := range w {
		w[i] = float32(i%5) * 0.01
	}
	b.SetBytes(int64(4 * (m*k + n*k + m*n)))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for b.Loop() {
		if err := gemm(out, x, w); err != nil {
			b.Fatal(err)
		}
	}
	flops := 2 * float64(m) * float64(k) * float64(n) * float64(b.N)
	b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	// Per second of CPU time the process used: on a machine shared with other work the
	// wall-clock figure follows the load, this one much less (a backend's threads that
	// wait for a core are not counted; one that spins is).
	if cpu := processCPU() - cpu0; cpu > 0 {
		b.ReportMetric(flops/cpu.Seconds()/1e9, "GFLOP/cpu-s")
	}
}
