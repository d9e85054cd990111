package ref

import (
	"fmt"
	"testing"

	cblas "github.com/resin-llm/resin/core/blas"
)

// BenchmarkSGEMM runs MatMulT's product at the shapes of a ~120M-parameter llama (hidden
// 1024, intermediate 2816, vocab 32000) for prefill chunks (m=512, 128) on each backend
// side by side: the package's own GEMM (ownGemm, split on the pool), the BLAS library this
// process loaded (RESIN_BLAS_LIB; blasGemm, split the same way) and gonum. The backend is
// the last element of the name, so benchstat or a sort lines them up:
//
//	go test ./core/kernels/ref -run '^$' -bench SGEMM -count 3
//
// scripts/cpu-gemm-bench.sh runs it with the OpenBLAS of .ci/setup.d/20-openblas.sh.
func BenchmarkSGEMM(b *testing.B) {
	shapes := []struct {
		name string
		k, n int
	}{
		{"qkv", 1024, 3072}, {"o", 1024, 1024}, {"gateup", 1024, 5632}, {"down", 2816, 1024}, {"lmhead", 1024, 32000},
	}
	lib := cblas.Default()
	for _, m := range []int{512, 128} {
		for _, s := range shapes {
			for _, backend := range []string{"own", "blas", "gonum"} {
				name := fmt.Sprintf("m=%d/%s_k=%d_n=%d/%s", m, s.name, s.k, s.n, backend)
				b.Run(name, func(b *testing.B) {
					mr, nr := gemmMicro()
					switch {
					case backend == "own" && mr == 0:
						b.Skip("no micro-kernel on this CPU")
					case backend == "blas" && lib == nil:
						b.Skipf("no BLAS library: %s", cblas.Info().Fallback)
					case backend == "gonum" && testing.Short():
						b.Skip("gonum is slow; -short skips it")
					}
					benchGEMM(b, func(out, x, w []float32) error {
						switch backend {
						case "own":
							ownGemm(true, true, out, x, w, m, s.k, s.n, mr, nr)
						case "blas":
							return blasGemm(lib, true, out, x, w, m, s.k, s.n)
						default:
							gonumGemm(true, out, x, w, m, s.k, s.n)
						}
						return nil
					}, m, s.k, s.n)
				})
			}
		}
	}
}

// BenchmarkMicroKernel runs the own GEMM's micro-kernel alone on one kc=256 panel of a
// and, in turn, the 16 panels of b of a packed block (256 KiB, in L2), as ownTask.block
// calls it: the ceiling of the own GEMM on this CPU, with no packing and no split
// (BenchmarkSGEMM's own, against it, shows what those cost).
func BenchmarkMicroKernel(b *testing.B) {
	mr, nr := gemmMicro()
	if mr == 0 {
		b.Skip("no micro-kernel on this CPU")
	}
	const kc = gemmKC
	a, bp, c := make([]float32, kc*mr), make([]float32, kc*gemmNC), make([]float32, mr*nr)
	for i := range a {
		a[i] = float32(i%7) * 0.1
	}
	for i := range bp {
		bp[i] = float32(i%5) * 0.01
	}
	cpu0 := processCPU()
	calls := 0
	for b.Loop() {
		for p := range gemmNC / nr {
			micro(mr, kc, &a[0], &bp[p*kc*nr], &c[0], nr, 1)
			calls++
		}
	}
	flops := 2 * float64(mr*nr*kc) * float64(calls)
	b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	if cpu := processCPU() - cpu0; cpu > 0 {
		b.ReportMetric(flops/cpu.Seconds()/1e9, "GFLOP/cpu-s")
	}
}
