package ref

import (
	"math"
	"sync"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// MatMulTBF16 computes out = x·wᵀ for a weight stored in bfloat16, in half the bytes of
// weight read that float32 weights take (a decode step streams the weights: half the
// time). Where the OS grants AMX (and k is a multiple of 32) it computes as llama.cpp's
// BF16 and torch's bfloat16 products do: each value of x rounded to the nearest bfloat16
// (ties to even) and each product of two bfloat16s summed in float32. Products of two or
// more rows (a prefill, a decode batch) run on the tiles (amxBF16Gemm), each output's sum
// the same whichever rows share its tile, so they agree to the bit; a single row (a
// decode step of one sequence) runs on the GEMV kernel on the rounded x, which streams w
// faster, the same products summed in another order. Elsewhere it computes in float32: each weight is
// widened to the float32 it stands for (its 16 bits as the upper half of the float32's)
// as it is read, so the product is MatMulT's on those float32 weights.
//
//	x: [m, k]   w: [n, k] bfloat16 bits   out: [m, n]
//
// It runs on the package's own kernels wherever the CPU has them, whatever RESIN_BLAS
// says (a library takes float32 weights only): AMX tiles where granted (RESIN_AMX=off
// declines); else one row on the GEMV kernel; 2 to 8 (a decode batch) on the skinny
// kernel (skinnyBF16: on AVX-512 the rows as stored, else runs of w widened into cache,
// to the bit what skinnyGemm computes on the widened weights); more (a prefill), with
// RESIN_BF16_DOT=on where the CPU has AVX512_BF16, on its dot products, x rounded to
// bfloat16 (bf16DotGemm: off by default, because its prefill then differs from the
// decode's float32 by that rounding), else on the own GEMM with the widening in its
// packing, to the bit what MatMulT computes on the own GEMM for the widened weights.
// Without AVX2+FMA, blocks of w widened into scratch go to gonum.
func MatMulTBF16(out, x []float32, w []uint16, m, k, n int) error {
	if done, err := bf16Args(out, x, w, m, k, n); done || err != nil {
		return err
	}
	if hasAMXBF16 && k%32 == 0 && m == 1 && skinnyVector(k) {
		// A decode step of one sequence streams w once for one row; the GEMV kernel
		// streams it faster than the tiles do (on this Xeon the llama bench's bf16 decode
		// 90 -> 97-103 tokens/s; from two rows the tiles are faster), on x rounded to
		// bfloat16 as the tiles take it, so the two differ only in the order of the sums.
		xr := bf16Rounded.Get().(*[]float32)
		*xr = growFloat32s(*xr, m*k)
		r := (*xr)[:m*k]
		for i, v := range x[:m*k] {
			r[i] = math.Float32frombits(uint32(BF16(v)) << 16)
		}
		err := matMulTBF16F32(out, r, w, m, k, n)
		bf16Rounded.Put(xr)
		return err
	}
	if amxBF16Gemm(out, x, w, m, k, n) {
		return nil
	}
	return matMulTBF16F32(out, x, w, m, k, n)
}

// bf16Rounded holds MatMulTBF16's copies of x rounded to bfloat16.
var bf16Rounded = sync.Pool{New: func() any { return new([]float32) }}

// bf16Args checks MatMulTBF16's arguments and does the products with nothing to sum (m,
// n or k zero), reporting done.
func bf16Args(out, x []float32, w []uint16, m, k, n int) (done bool, err error) {
	const op = "MatMulTBF16"
	if err := checkDims(op, m, k, n); err != nil {
		return true, err
	}
	if err := checkLen(op, "out", len(out), m*n); err != nil {
		return true, err
	}
	if err := checkLen(op, "x", len(x), m*k); err != nil {
		return true, err
	}
	if err := checkLen(op, "w", len(w), n*k); err != nil {
		return true, err
	}
	if m == 0 || n == 0 {
		return true, nil
	}
	if k == 0 {
		clear(out[:m*n])
		return true, nil
	}
	return false, nil
}

// matMulTBF16F32 is MatMulTBF16 computing in float32 whatever the CPU has (its paths
// after AMX's): NewWeightAsStored's product.
func matMulTBF16F32(out, x []float32, w []uint16, m, k, n int) error {
	if done, err := bf16Args(out, x, w, m, k, n); done || err != nil {
		return err
	}
	if m == 1 && skinnyVector(k) {
		gemvBF16Split(out, x, w, k, n)
		return nil
	}
	if m <= skinnyRows && skinnyVector(k) {
		skinnyBF16(out, x, w, m, k, n)
		return nil
	}
	if m > skinnyRows && hasBF16Dot && bf16DotGemm(out, x, w, m, k, n) {
		return nil
	}
	if mr, nr := gemmMicro(); mr > 0 {
		ownGemmOn(true, true, out, x, nil, w, m, k, n, mr, nr)
		return nil
	}
	widenedGemm(out, x, w, m, k, n)
	return nil
}

// BF16RoundsActivations reports whether MatMulTBF16 rounds x to bfloat16 on this CPU for
// a k that is a multiple of 32 (AMX tiles run it), not computing in float32.
func BF16RoundsActivations() bool { return hasAMXBF16 }

// BF16 returns the bfloat16 nearest f (ties to even; NaN stays NaN), as the bits
// MatMulTBF16 reads.
func BF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it one, quiet
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// FromBF16 returns the float32 a bfloat16 stands for.
func FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// gemvBF16Task is one row against a bfloat16 weight in blocks of w's rows, a pool task.
type gemvBF16Task struct {
	loop        loop
	out, x, xp  []float32 // xp: x in evenOdd's layout, or nil; kept
	w           []uint16
	k, n, block int
}

var gemvBF16Tasks freeList[gemvBF16Task]

// gemvBF16Split computes out[j] = x·w[j] for j < n, split across the pool in two blocks
// of w's rows a participant when large; skinnyVector(k) must hold.
func gemvBF16Split(out, x []float32, w []uint16, k, n int) {
	t := gemvBF16Tasks.get()
	t.out, t.x, t.w, t.k, t.n = out, x, w, k, n
	xp := []float32(nil)
	if gemvBF16EvenOdd(k) {
		t.xp = growFloat32s(t.xp, k)
		evenOdd(t.xp, x[:k])
		xp = t.xp
	}
	if p := parts(); p == 1 || n*k < minParallelMACs {
		gemvBF16(out, x, xp, k, w, k, n)
	} else {
		t.block = roundUp((n+2*p-1)/(2*p), 8)
		parallelFor(&t.loop, t, (n+t.block-1)/t.block, 1)
	}
	t.out, t.x, t.w = nil, nil, nil
	gemvBF16Tasks.put(t)
}

func (t *gemvBF16Task) run(_, lo, hi int) {
	xp := []float32(nil)
	if gemvBF16EvenOdd(t.k) {
		xp = t.xp
	}
	for b := lo; b < hi; b++ {
		j0, j1 := b*t.block, min((b+1)*t.block, t.n)
		gemvBF16(t.out[j0:j1], t.x, xp, t.k, t.w[j0*t.k:], t.k, j1-j0)
	}
}

// evenOdd lays x (a multiple of 32 values) out as gemvBF16's even-odd kernel reads it: in
// each block of 32, the 16 values at even steps, then the 16 at odd ones.
func evenOdd(xp, x []float32) {
	for b := 0; b+32 <= len(x); b += 32 {
		for i := range 16 {
			xp[b+i], xp[b+16+i] = x[b+2*i], x[b+2*i+1]
		}
	}
}

// skinnyBF16Task is a decode batch's rows against a bfloat16 weight, a pool task: runs of
// w's rows widened into the participant's scratch, then the fp32 skinny kernel on them.
type skinnyBF16Task struct {
	loop    loop
	xp, ct  []float32 // x in 8 rows (zeros below m), the product transposed; kept
	w       []uint16
	m, k, n int
	block   int
	scratch [][]float32 // per participant: a run of widened rows; kept
}

var skinnyBF16Tasks freeList[skinnyBF16Task]

// skinnyBF16 computes out = x·wᵀ for 2 ≤ m ≤ skinnyRows, w read from memory once: on
// AVX-512 (skinnyBF16Direct) by skinnyBF16EOAVX512 on the rows as stored, x in evenOdd's
// layout (its even and odd steps summed apart, as the even-odd GEMV's); else each run of
// w's rows widened to float32 (about 64 KiB, in L2) for every row of x, to the bit what
// skinnyGemm computes on the widened weights. skinnyVector(k) must hold.
func skinnyBF16(out, x []float32, w []uint16, m, k, n int) {
	t := skinnyBF16Tasks.get()
	t.xp, t.ct = growFloat32s(t.xp, skinnyRows*k), growFloat32s(t.ct, n*skinnyRows)
	if skinnyBF16Direct(k) {
		for i := range m { // each row in evenOdd's layout
			evenOdd(t.xp[i*k:(i+1)*k], x[i*k:(i+1)*k])
		}
	} else {
		copy(t.xp, x[:m*k])
	}
	clear(t.xp[m*k:])
	t.w, t.m, t.k, t.n = w, m, k, n
	p := parts()
	for len(t.scratch) < p {
		t.scratch = append(t.scratch, nil)
	}
	if p > 1 && m*n*k >= minParallelMACs {
		t.block = roundUp((n+2*p-1)/(2*p), 8)
		parallelFor(&t.loop, t, (n+t.block-1)/t.block, 1)
	} else {
		t.block = n
		t.run(0, 0, 1)
	}
	for i := range m {
		o := out[i*n : (i+1)*n]
		for j := range o {
			o[j] = t.ct[j*skinnyRows+i]
		}
	}
	t.w = nil
	skinnyBF16Tasks.put(t)
}

// run computes the product's columns of blocks [lo, hi), in runs of w's rows as
// skinnyTask.rows does: on AVX-512 (skinnyBF16Direct) the bfloat16 rows as stored, in
// runs of 32 KiB (in cache for x's second 4 rows), else each run widened into the
// participant's scratch first.
func (t *skinnyBF16Task) run(part, lo, hi int) {
	k := t.k
	direct := skinnyBF16Direct(k)
	var run int
	var wf []float32
	if direct {
		run = max(2, (32<<10)/(2*k))
	} else {
		run = max(2, (64<<10)/(4*k))
		wf = growFloat32s(t.scratch[part], run*k)
		t.scratch[part] = wf
	}
	for b := lo; b < hi; b++ {
		j0, j1 := b*t.block, min((b+1)*t.block, t.n)
		for r0 := j0; r0 < j1; r0 += run {
			r1 := min(r0+run, j1)
			if direct {
				skinnyBF16EO(t.ct[r0*skinnyRows:], t.xp, k, t.w[r0*k:], k, r1-r0)
				if t.m > 4 {
					skinnyBF16EO(t.ct[r0*skinnyRows+4:], t.xp[4*k:], k, t.w[r0*k:], k, r1-r0)
				}
				continue
			}
			widenBF16(wf[:(r1-r0)*k], t.w[r0*k:r1*k])
			skinny(t.ct[r0*skinnyRows:], t.xp, k, wf, k, r1-r0)
			if t.m > 4 {
				skinny(t.ct[r0*skinnyRows+4:], t.xp[4*k:], k, wf, k, r1-r0)
			}
		}
	}
}

// packRowsBF16 is packRows on bfloat16 rows: dst[l*width + i] = the float32 of
// src[i*ld + l], zeros for rows ≤ i < width.
func packRowsBF16(dst []float32, src []uint16, ld, rows, width, kc int) {
	dst = dst[:kc*width]
	i := 0
	if kc8 := kc &^ 7; kc8 > 0 && rows >= 8 { // as packRows
		for i+8 <= rows && packT8BF16(dst[i:], width, src[i*ld:], ld, kc8) {
			i += 8
			if i < rows && rows < i+8 && packT8BF16(dst[rows-8:], width, src[(rows-8)*ld:], ld, kc8) {
				i = rows
			}
		}
		for r := range i {
			for l := kc8; l < kc; l++ {
				dst[l*width+r] = FromBF16(src[r*ld+l])
			}
		}
	}
	for ; i < rows; i++ {
		s := src[i*ld:][:kc]
		for l, v := range s {
			dst[l*width+i] = FromBF16(v)
		}
	}
	if rows < width {
		for l := range kc {
			clear(dst[l*width+rows : (l+1)*width])
		}
	}
}

// widenedBlock is the most rows of w widenedGemm widens at a time.
const widenedBlock = 64

var widenedScratch freeList[[]float32]

// widenedGemm is MatMulTBF16 where the CPU has no vector kernels: blocks of w's rows
// widened into scratch, each block's columns of out computed by gonum.
func widenedGemm(out, x []float32, w []uint16, m, k, n int) {
	s := widenedScratch.get()
	*s = growFloat32s(*s, widenedBlock*k)
	for j0 := 0; j0 < n; j0 += widenedBlock {
		nb := min(widenedBlock, n-j0)
		wf := (*s)[:nb*k]
		for i, v := range w[j0*k : (j0+nb)*k] {
			wf[i] = FromBF16(v)
		}
		blas32.Gemm(blas.NoTrans, blas.Trans, 1,
			blas32.General{Rows: m, Cols: k, Stride: k, Data: x},
			blas32.General{Rows: nb, Cols: k, Stride: k, Data: wf},
			0, blas32.General{Rows: m, Cols: nb, Stride: n, Data: out[j0:]})
	}
	widenedScratch.put(s)
}
