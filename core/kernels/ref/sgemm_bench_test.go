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
