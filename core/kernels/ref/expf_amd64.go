package ref

import (
	"math"

	"golang.org/x/sys/cpu"
)

// expfConsts is how many constants the vector kernels' EXPF8 reads.
const expfConsts = 14

// expfAVX2Table holds EXPF8's constants, each in 8 lanes, in the order it reads them:
// log2e, magic, ln2Hi, ln2Lo, the polynomial's 6 coefficients, 1, minArg, maxArg, 127.
var expfAVX2Table = func() (c [expfConsts][8]uint32) {
	f := math.Float32bits
	for i, v := range [expfConsts]uint32{
		f(expfLog2e), f(expfMagic), f(expfLn2Hi), f(expfLn2Lo),
		f(expfP0), f(expfP1), f(expfP2), f(expfP3), f(expfP4), f(expfP5),
		f(1), f(expfMinArg), f(expfMaxArg), 127,
	} {
		for l := range c[i] {
			c[i][l] = v
		}
	}
	return c
}()

// hasExpfAVX2 says whether the CPU runs the AVX2 kernels of expf_amd64.s (AVX2's 256-bit
// integer adds and shifts).
var hasExpfAVX2 = cpu.X86.HasAVX2

// rowMaxAVX2, softmaxExpAVX2 and siluMulAVX2 are in expf_amd64.s.
//
//go:noescape
func rowMaxAVX2(p *float32, n int) float32

//go:noescape
func softmaxExpAVX2(row *float32, n int, scale, mx float32, c *[expfConsts][8]uint32, acc *[8]float64) int

//go:noescape
func siluMulAVX2(out, gate, up *float32, n int, c *[expfConsts][8]uint32, lim float32) int

// rowMaxVector returns the largest of row's first n values, NaNs skipped, and n: the
// values in whole blocks of 8 (AVX2), or n = 0 without AVX2 or a block.
func rowMaxVector(row []float32) (float32, int) {
	n := len(row) &^ 7
	if !hasExpfAVX2 || n == 0 {
		return 0, 0
	}
	return rowMaxAVX2(&row[0], n), n
}

// softmaxExpVector sets row[i] = expf(float32(row[i]·scale) − mx) from the start of row, 8
// at a time with AVX2, adding the results into acc's lanes (lane i%8), and returns how many
// it did: up to the first block of 8 holding an argument above expf's range (or a NaN),
// and none without AVX2.
func softmaxExpVector(row []float32, scale, mx float32, acc *[8]float64) int {
	n := len(row) &^ 7
	if !hasExpfAVX2 || n == 0 {
		return 0
	}
	return softmaxExpAVX2(&row[0], n, scale, mx, &expfAVX2Table, acc)
}

// siluMulVector sets out[i] = SiLU(min(gate[i], lim))·min(max(up[i], −lim), lim) from the
// start of gate (out and up as long), 8 at a time with AVX2, and returns how many it did:
// up to the first block of 8 holding a clamped gate below −expfMaxArg (or a NaN), and
// none without AVX2 or with a NaN lim (lim = +Inf clamps nothing).
func siluMulVector(out, gate, up []float32, lim float32) int {
	n := len(gate) &^ 7
	if !hasExpfAVX2 || n == 0 || lim != lim {
		return 0
	}
	_, _ = out[n-1], up[n-1]
	return siluMulAVX2(&out[0], &gate[0], &up[0], n, &expfAVX2Table, lim)
}

// axpyF64AVX2 is in expf_amd64.s.
//
//go:noescape
func axpyF64AVX2(acc *float64, a float64, x *float32, n int)

// axpyF64Vector adds a·float64(x[i]) to acc[i] from the start of x, 8 at a time with AVX2,
// and returns how many it did (none without AVX2).
func axpyF64Vector(acc []float64, a float64, x []float32) int {
	n := len(x) &^ 7
	if !hasExpfAVX2 || n == 0 {
		return 0
	}
	_ = acc[n-1]
	axpyF64AVX2(&acc[0], a, &x[0], n)
	return n
}

// ropeNeoXAVX2 is in expf_amd64.s.
//
//go:noescape
func ropeNeoXAVX2(x0, x1, cos, sin *float32, n int)

// ropeNeoXVector rotates the pairs (x0[i], x1[i]) by (cos[i], sin[i]) from the start, 8 at
// a time with AVX2, and returns how many it did (none without AVX2).
func ropeNeoXVector(x0, x1, cos, sin []float32) int {
	n := len(x0) &^ 7
	if !hasExpfAVX2 || n == 0 {
		return 0
	}
	_, _, _ = x1[n-1], cos[n-1], sin[n-1]
	ropeNeoXAVX2(&x0[0], &x1[0], &cos[0], &sin[0], n)
	return n
}
