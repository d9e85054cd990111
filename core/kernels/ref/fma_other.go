//go:build !amd64

package ref

// attnVector is false where there is no vector form (only amd64 has one): attention
// units run on the GEMM and scalar paths.
func attnVector(d int) bool { return false }

// prefetch does nothing where there is no vector form.
func prefetch(s []float32) {}

func attnDots(s []float32, sstride int, q []float32, g, d int, k []float32, kstride, n int) {
	panic("ref: attnDots without a vector form")
}

func attnAxpys(o []float32, ostride int, w []float32, wstride, g, d int, v []float32, vstride, n int) {
	panic("ref: attnAxpys without a vector form")
}

// CPUKernels names the vector forms this CPU runs: "scalar" where there are none (only
// amd64 has them).
func CPUKernels() string { return "scalar" }
