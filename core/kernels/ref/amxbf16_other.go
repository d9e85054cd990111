//go:build !amd64

package ref

// hasAMXBF16 is false off x86-64: AMX is an x86 extension.
const hasAMXBF16 = false

// amxBF16Gemm reports false: there is no AMX here.
func amxBF16Gemm(out, x []float32, w []uint16, m, k, n int) bool { return false }
