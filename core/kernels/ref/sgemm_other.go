//go:build !amd64

package ref

// gemmMicro returns 0, 0 where there is no micro-kernel (only amd64 has one): gonum runs
// the GEMMs that no library does.
func gemmMicro() (mr, nr int) { return 0, 0 }

func micro(mr, kc int, a, b, c *float32, ldc, acc int) {
	panic("ref: micro without a micro-kernel")
}

func packT8(dst []float32, width int, src []float32, ld, kc8 int) bool { return false }

func packT8BF16(dst []float32, width int, src []uint16, ld, kc8 int) bool { return false }

func packT6(dst []float32, src []float32, ld, kc8 int) bool { return false }
