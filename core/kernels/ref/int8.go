package ref

import (
	"fmt"
	"math"
	"sync"
)

// 8-bit block-quantised weights, in the way of llama.cpp's Q8_0: each row of a weight
// [n, k] is cut in blocks of 32 values (the last one padded with zeros), each block held
// as 32 integers q in [-127, 127] and one float32 scale d = max|w|/127, the block's values
// standing for q·d. That is 36 bytes per 32 weights (1.125 bytes a weight, against Q8_0's
// 34 with a float16 scale). MatMulTInt8 quantises the activations the same way, a block
// of 32 of a row at a time, and sums each block's products in int32 exactly (Q8_0×Q8_0),
// on AVX-512 VNNI where the CPU has it (int8_amd64.s), else on AVX2, else in scalar loops.
//
// Error, against the float32 product on the original weights: each weight is off by at
// most d_w/2 and each activation by at most d_x/2 (its block's scales), so an output is
// off by at most Σ_l |x_l|·d_w/2 + |w_l|·d_x/2 + d_w·d_x/4 over its k steps, plus float32
// rounding of the per-block sums: for weights and activations of similar magnitudes within
// their blocks, about 1% of Σ|x_l·w_l| in the worst case and 0.1–0.3% typically.

const (
	q8Block = 32 // values a scale covers
	q8Group = 16 // rows of w interleaved together, one AVX-512 lane each
)

// Int8Matrix is a weight [n, k] quantised by QuantizeInt8. Its rows are interleaved in
// groups of 16 for the VNNI kernel: group g, block b holds 8 steps of 4 values for each of
// its 16 rows, as bytes q+128,
//
//	q[(((g*nb + b)*8 + s)*16 + r)*4 + e] = q of row g*16+r at column b*32 + s*4 + e,
//
// and scales[(g*nb + b)*16 + r] is that row's scale of block b (rows past n are zeros).
type Int8Matrix struct {
	n, k, nb int
	q        []uint8
	scales   []float32
}

// Rows and Cols are the weight's n and k.
func (w *Int8Matrix) Rows() int { return w.n }
func (w *Int8Matrix) Cols() int { return w.k }

// Bytes is the memory the quantised weight holds (its values and scales).
func (w *Int8Matrix) Bytes() int64 { return int64(len(w.q)) + 4*int64(len(w.scales)) }

// QuantizeInt8 quantises the weight w [n, k] (row-major, float32) in blocks of 32 values
// a scale (round to nearest, ties to even). A block of zeros
// gets scale 0; values that are not finite are refused.
func QuantizeInt8(w []float32, n, k int) (*Int8Matrix, error) {
	const op = "QuantizeInt8"
	if err := checkDims(op, n, k); err != nil {
		return nil, err
	}
	if err := checkLen(op, "w", len(w), n*k); err != nil {
		return nil, err
	}
	nb := (k + q8Block - 1) / q8Block
	ng := (n + q8Group - 1) / q8Group
	m := &Int8Matrix{n: n, k: k, nb: nb, q: make([]uint8, ng*nb*q8Group*q8Block), scales: make([]float32, ng*nb*q8Group)}
	for i := range m.q {
		m.q[i] = 128 // q = 0, padding included
	}
	var mu sync.Mutex
	bad := n // the first row holding a value that is not finite
	ParallelRange(ng, max(1, minParallelElems/max(1, q8Group*k)), func(_, lo, hi int) {
		var blk [q8Block]float32
		var q [q8Block]int8
		for j := lo * q8Group; j < min(hi*q8Group, n); j++ {
			g, r := j/q8Group, j%q8Group
			row := w[j*k : (j+1)*k]
			for b := range nb {
				clear(blk[:])
				copy(blk[:], row[b*q8Block:min((b+1)*q8Block, k)])
				d, ok := quantBlock(&q, &blk)
				if !ok {
					mu.Lock()
					bad = min(bad, j)
					mu.Unlock()
					return
				}
				base := (g*nb + b) * q8Group * q8Block
				for l, v := range q {
					m.q[base+(l/4*q8Group+r)*4+l%4] = uint8(int(v) + 128)
				}
				m.scales[(g*nb+b)*q8Group+r] = d
			}
		}
	})
	if bad < n {
		return nil, fmt.Errorf("ref.%s: row %d holds a value that is not finite", op, bad)
	}
	return m, nil
}

// quantBlock sets q to the block's values over their scale d = max|v|/127, rounded to
// nearest even (llama.cpp rounds ties away from zero), and returns d; false when a value
// is not finite. A block whose d is below the smallest normal float32 (max|v| < ~1.5e-36,
// 1/d would overflow) quantises to zeros, as a block of zeros does.
func quantBlock(q *[q8Block]int8, v *[q8Block]float32) (float32, bool) {
	var amax float32
	for _, x := range v {
		if x != x || x > math.MaxFloat32 || x < -math.MaxFloat32 {
			return 0, false
		}
		amax = max(amax, abs32(x))
	}
	d := amax / 127
	var id float32
	if d >= minNormal32 {
		id = 1 / d
	}
	for i, x := range v {
		q[i] = int8(math.RoundToEven(float64(x * id))) // as the vector kernel's conversion
	}
	return d, true
}

// minNormal32 is the smallest normal float32, 2^-126: 1/d is finite for d at or above it.
const minNormal32 = 0x1p-126

func abs32(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ (1 << 31)) }

// Dequantize writes the values the weight stands for, q·d, into dst [n, k].
func (w *Int8Matrix) Dequantize(dst []float32) error {
	if err := checkLen("Int8Matrix.Dequantize", "dst", len(dst), w.n*w.k); err != nil {
		return err
	}
	for j := range w.n {
		for l := range w.k {
			dst[j*w.k+l] = w.at(j, l)
		}
	}
	return nil
}

// at is the value of element (j, l).
func (w *Int8Matrix) at(j, l int) float32 {
	g, r, b, c := j/q8Group, j%q8Group, l/q8Block, l%q8Block
	base := (g*w.nb + b) * q8Group * q8Block
	q := int(w.q[base+(c/4*q8Group+r)*4+c%4]) - 128
	return float32(q) * w.scales[(g*w.nb+b)*q8Group+r]
}

// MatMulTInt8 computes out = x·wᵀ for a weight quantised by QuantizeInt8, each row of x
// quantised in blocks of 32 as the weight is (Q8_0×Q8_0: exact int32 sums per block,
// scaled and summed in float32); see the package's note on int8 for the error bound.
//
//	x: [m, k]   w: [n, k] quantised   out: [m, n]
//
// Rows of x go 4 at a time (1 at a time for the last m%4) through each group of 16 rows
// of w, so the weight is read from memory once for all of them; groups of w are split
// across the worker pool. It runs on AVX-512 VNNI where the CPU has it (Int8Kernel says),
// else on scalar loops computing the same sums.
func MatMulTInt8(out, x []float32, w *Int8Matrix, m int) error {
	const op = "MatMulTInt8"
	if w == nil {
		return fmt.Errorf("ref.%s: no weight", op)
	}
	k, n := w.k, w.n
	if err := checkDims(op, m); err != nil {
		return err
	}
	if err := checkLen(op, "out", len(out), m*n); err != nil {
		return err
	}
	if err := checkLen(op, "x", len(x), m*k); err != nil {
		return err
	}
	if m == 0 || n == 0 {
		return nil
	}
	t := int8Tasks.get()
	defer func() {
		t.out, t.w = nil, nil
		int8Tasks.put(t)
	}()
	t.out, t.w, t.m = out, w, m
	t.amx = hasAMXInt8 && m > skinnyRows
	t.quantize(x)
	ng := (n + q8Group - 1) / q8Group
	p := parts()
	for t.amx && len(t.scratch) < p {
		t.scratch = append(t.scratch, amxInt8Scratch{})
	}
	if p == 1 || m*n*k < minParallelMACs {
		t.run(0, 0, ng)
		return nil
	}
	parallelFor(&t.loop, t, ng, max(1, ng/(4*p)))
	return nil
}

// int8Task is one MatMulTInt8 call: its quantised activations (kept across calls) and its
// split over groups of w, a pool task.
type int8Task struct {
	loop loop
	out  []float32
	w    *Int8Matrix
	m    int
	xq   []int8    // rows in groups of 4 (then 1): block b of the group's row r at (b*R + r)*32
	xs   []float32 // the blocks' scales, as xq's blocks
	xc   []int32   // 128·Σ xq of each block, the offset of the weights' q+128
	// amx: the rows run on AMX tiles (hasAMXInt8, a prefill): xq holds one row a block
	// of 32 (b at (i*nb + b)*32), padded with zero rows to a multiple of 16; scratch is
	// each participant's tile.
	amx     bool
	scratch []amxInt8Scratch
}

// amxInt8Scratch is a pool participant's tile of int32 products (amxRows).
type amxInt8Scratch struct{ tile [2 * 256]int32 }

var int8Tasks freeList[int8Task]

// quantize quantises x's m rows into t.xq, t.xs, t.xc.
func (t *int8Task) quantize(x []float32) {
	k, nb, m := t.w.k, t.w.nb, t.m
	rows := m
	if t.amx {
		rows = roundUp(m, 16)
	}
	if cap(t.xq) < rows*nb*q8Block {
		t.xq = make([]int8, rows*nb*q8Block)
	}
	if cap(t.xs) < rows*nb {
		t.xs, t.xc = make([]float32, rows*nb), make([]int32, rows*nb)
	}
	t.xq, t.xs, t.xc = t.xq[:rows*nb*q8Block], t.xs[:rows*nb], t.xc[:rows*nb]
	clear(t.xq[m*nb*q8Block:]) // the AMX tiles' padding rows
	clear(t.xs[m*nb:])
	clear(t.xc[m*nb:])
	if m >= 16 && m*k >= minParallelElems {
		ParallelRange(m, max(4, minParallelElems/k)&^3, func(_, lo, hi int) { t.quantizeRows(x, lo, hi) })
		return
	}
	t.quantizeRows(x, 0, m)
}

// quantizeRows quantises rows [lo, hi) of x into t's buffers, sized by quantize.
func (t *int8Task) quantizeRows(x []float32, lo, hi int) {
	k, nb, m := t.w.k, t.w.nb, t.m
	var blk [q8Block]float32
	var q [q8Block]int8
	m4 := m &^ 3
	for i := lo; i < hi; i++ {
		rs, r := 4, i%4
		if i >= m4 || t.amx {
			rs, r = 1, 0
		}
		g0 := i - r
		row := x[i*k : (i+1)*k]
		b0 := 0
		if full := k / q8Block; (hasInt8VNNI || hasInt8AVX2) && full > 0 && finite(row) {
			at := g0*nb + r
			_, _, _ = t.xq[(at+(full-1)*rs)*q8Block+q8Block-1], t.xs[at+(full-1)*rs], t.xc[at+(full-1)*rs]
			if hasInt8VNNI {
				q8QuantAVX512(&t.xq[at*q8Block], &t.xs[at], &t.xc[at], &row[0], full, rs)
			} else {
				q8QuantAVX2(&t.xq[at*q8Block], &t.xs[at], &t.xc[at], &row[0], full, rs)
			}
			b0 = full
		}
		for b := b0; b < nb; b++ {
			clear(blk[:])
			copy(blk[:], row[b*q8Block:min((b+1)*q8Block, k)])
			d, ok := quantBlock(&q, &blk)
			if !ok { // a value that is not finite: the outputs go NaN, as a float32 product's would
				clear(q[:])
				d = float32(math.NaN())
			}
			at := g0*nb + b*rs + r
			var s int32
			for l, v := range q {
				t.xq[at*q8Block+l] = v
				s += int32(v)
			}
			t.xs[at], t.xc[at] = d, 128*s
		}
	}
}

// finite says whether every value of x is finite (the vector quantiser's precondition).
func finite(x []float32) bool {
	for _, v := range x {
		if math.Float32bits(v)&0x7f800000 == 0x7f800000 {
			return false
		}
	}
	return true
}

// run computes the output columns of w's groups [lo, hi) for every row.
func (t *int8Task) run(part, lo, hi int) {
	if t.amx {
		t.amxRows(part, lo, hi)
		return
	}
	w, m, n, nb := t.w, t.m, t.w.n, t.w.nb
	var tile [4 * q8Group]float32
	gs := nb * q8Group * q8Block // bytes of a group
	m4 := m &^ 3
	for g := lo; g < hi; g++ {
		wq, ws := w.q[g*gs:(g+1)*gs], w.scales[g*nb*q8Group:(g+1)*nb*q8Group]
		j0 := g * q8Group
		cols := min(q8Group, n-j0)
		for i := 0; i < m; {
			rs := 4
			if i >= m4 {
				rs = 1
			}
			xq, xs, xc := t.xq[i*nb*q8Block:(i+rs)*nb*q8Block], t.xs[i*nb:(i+rs)*nb], t.xc[i*nb:(i+rs)*nb]
			if cols == q8Group {
				q8Dot(t.out[i*n+j0:], n, rs, xq, xs, xc, wq, ws, nb)
			} else {
				q8Dot(tile[:], q8Group, rs, xq, xs, xc, wq, ws, nb)
				for r := range rs {
					copy(t.out[(i+r)*n+j0:][:cols], tile[r*q8Group:])
				}
			}
			i += rs
		}
	}
}

// q8Dot sets out[r*ldo + c] (r < rs, c < 16) to the dot products of rs quantised rows of
// activations (rs = 4: interleaved by block; 1) with one group of 16 rows of w, on the
// VNNI kernels where the CPU has them, else on the AVX2 one (a row at a time).
func q8Dot(out []float32, ldo, rs int, xq []int8, xs []float32, xc []int32, wq []uint8, ws []float32, nb int) {
	_, _ = out[(rs-1)*ldo+q8Group-1], xq[rs*nb*q8Block-1]
	_, _, _, _ = xs[rs*nb-1], xc[rs*nb-1], wq[nb*q8Group*q8Block-1], ws[nb*q8Group-1]
	if hasInt8VNNI {
		if rs == 4 {
			q8Dot4VNNI(&out[0], ldo, &xq[0], &xs[0], &xc[0], &wq[0], &ws[0], nb)
		} else {
			q8Dot1VNNI(&out[0], &xq[0], &xs[0], &xc[0], &wq[0], &ws[0], nb)
		}
		return
	}
	if hasInt8AVX2 {
		if rs == 4 {
			q8Dot4AVX2(&out[0], ldo, &xq[0], &xs[0], &wq[0], &ws[0], nb)
			return
		}
		for r := range rs {
			q8DotAVX2(&out[r*ldo], &xq[r*q8Block], &xs[r], rs*q8Block, &wq[0], &ws[0], nb)
		}
		return
	}
	q8DotScalar(out, ldo, rs, xq, xs, xc, wq, ws, nb)
}

// q8DotScalar is q8Dot in loops, the kernels' sums in their order: each block's integer
// dot (the weights' q+128 times xq, less xc) exact in int32, then the row's float32 sum
// plus it times ws·xs, fused as the kernels' FMA is (to within a double rounding).
func q8DotScalar(out []float32, ldo, rs int, xq []int8, xs []float32, xc []int32, wq []uint8, ws []float32, nb int) {
	for r := range rs {
		var sum [q8Group]float32
		for b := range nb {
			at := b*rs + r
			xb := xq[at*q8Block:][:q8Block]
			wb := wq[b*q8Group*q8Block:][:q8Group*q8Block]
			for c := range q8Group {
				var dot int32
				for l, v := range xb {
					dot += int32(wb[(l/4*q8Group+c)*4+l%4]) * int32(v)
				}
				dot -= xc[at]
				d := ws[b*q8Group+c] * xs[at]
				sum[c] = float32(math.FMA(float64(dot), float64(d), float64(sum[c])))
			}
		}
		copy(out[r*ldo:][:q8Group], sum[:])
	}
}

// Int8Kernel names the kernel MatMulTInt8 runs on this CPU: "AVX-512 VNNI", "AVX2" or
// "scalar" (loops).
func Int8Kernel() string {
	switch {
	case hasInt8VNNI:
		return "AVX-512 VNNI"
	case hasInt8AVX2:
		return "AVX2"
	}
	return "scalar"
}
