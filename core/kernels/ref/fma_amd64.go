// The AVX2/FMA kernels of decode attention (attn_amd64.s), with the checks their callers
// rely on (those of products of a few rows are in skinny_amd64.go).

package ref

import "golang.org/x/sys/cpu"

// hasAttnAVX2 says whether the CPU runs attnDotsAVX2 and attnAxpysAVX2 (AVX2 and FMA).
var hasAttnAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// attnDotsAVX2 and attnAxpysAVX2 are in attn_amd64.s.
//
//go:noescape
func attnDotsAVX2(s *float32, sstride int, q *float32, heads, dim int, k *float32, kstride, n int)

//go:noescape
func attnAxpysAVX2(o *float32, ostride int, w *float32, wstride, heads, dim int, v *float32, vstride, n int)

// attnVector says whether attnDots and attnAxpys run, for head dimension d: with AVX2
// and FMA, and d a multiple of 8.
func attnVector(d int) bool { return hasAttnAVX2 && d > 0 && d%8 == 0 }

// prefetchT1 is in attn_amd64.s.
//
//go:noescape
func prefetchT1(p *float32, n int)

// prefetch asks for s's memory into L2 (a hint: it does not wait for it).
func prefetch(s []float32) {
	if len(s) > 0 {
		prefetchT1(&s[0], 4*len(s))
	}
}

// attnDots sets s[h*sstride + i] = q[h*d:(h+1)*d]·k[i*kstride:][:d] for h < g, i < n;
// attnVector(d) must hold.
func attnDots(s []float32, sstride int, q []float32, g, d int, k []float32, kstride, n int) {
	if n == 0 || g == 0 {
		return
	}
	_, _, _ = s[(g-1)*sstride+n-1], q[g*d-1], k[(n-1)*kstride+d-1]
	attnDotsAVX2(&s[0], sstride, &q[0], g, d, &k[0], kstride, n)
}

// attnAxpys adds Σ_i w[h*wstride + i]·v[i*vstride:][:d] to o[h*ostride:][:d] for h < g,
// the tokens i < n in order; attnVector(d) must hold.
func attnAxpys(o []float32, ostride int, w []float32, wstride, g, d int, v []float32, vstride, n int) {
	if n == 0 || g == 0 {
		return
	}
	_, _, _ = o[(g-1)*ostride+d-1], w[(g-1)*wstride+n-1], v[(n-1)*vstride+d-1]
	attnAxpysAVX2(&o[0], ostride, &w[0], wstride, g, d, &v[0], vstride, n)
}

// CPUKernels names the vector forms this CPU runs: "AVX2+FMA" (every one), "AVX2" (the
// bit-exact elementwise forms, not the FMA kernels) or "scalar" (none: the loops).
func CPUKernels() string {
	switch {
	case hasAttnAVX2:
		return "AVX2+FMA"
	case hasExpfAVX2:
		return "AVX2"
	}
	return "scalar"
}
