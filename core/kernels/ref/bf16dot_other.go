//go:build !amd64

package ref

// canBF16Dot and hasBF16Dot are false off x86-64: MatMulTBF16's prefill widens the weights.
const canBF16Dot, hasBF16Dot = false, false

// bf16DotGemm reports false: there is no AVX-512 BF16 here.
func bf16DotGemm(out, x []float32, w []uint16, m, k, n int) bool { return false }
