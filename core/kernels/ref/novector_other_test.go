//go:build !amd64

package ref

import "testing"

// withoutVector runs f: where there are no vector kernels (only amd64 has them), every
// operator already takes its scalar, BLAS or gonum path.
func withoutVector(t *testing.T, f func()) {
	t.Helper()
	f()
}

// bf16Paths runs f on the one path of MatMulTBF16 off amd64.
func bf16Paths(f func(path string)) { f("fp32") }
