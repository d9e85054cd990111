//go:build !amd64

package ref

// rowMaxVector, softmaxExpVector and siluMulVector do nothing where there is no vector
// form: their callers run the scalar loop over every element.
func rowMaxVector(row []float32) (float32, int)                              { return 0, 0 }
func softmaxExpVector(row []float32, scale, mx float32, acc *[8]float64) int { return 0 }
func siluMulVector(out, gate, up []float32, lim float32) int                 { return 0 }

func axpyF64Vector(acc []float64, a float64, x []float32) int { return 0 }

func ropeNeoXVector(x0, x1, cos, sin []float32) int { return 0 }
