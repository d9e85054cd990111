package ref

import "unsafe"

// The package's own GEMM: packed and cache-blocked in the GotoBLAS/BLIS way, on a
// register-blocked micro-kernel in assembly (sgemm_amd64.s: 14×32 in AVX-512 registers,
// 6×16 in AVX2+FMA ones), split across the worker pool. It runs MatMul and MatMulT where
// no BLAS library is loaded (core/blas: RESIN_BLAS), on CPUs with a micro-kernel
// (gemmMicro); gonum runs them on others.
//
// Loops, for out [m, n] = a [m, k] · op(b), in one loop on the pool (no barrier inside a
// product: on a loaded machine a preempted participant holds up the others at each):
//
//	per block of about gemmMC rows and gemmNC columns of out (smaller blocks of rows when
//	    there are too few to keep every participant busy), claimed on the pool:
//	  per block of gemmKC steps of k, in order:
//	    pack op(b)'s columns of the block as [kc][NR] panels (zeros past n) into the
//	        participant's scratch, about 256 KiB: it stays in L2;
//	    per MR-row panel of a:
//	      pack it as [kc][MR] (zeros below m) into the participant's scratch (14 KiB at
//	          most: it stays in L1); every column block packs it again, ~1.5% of the work;
//	      per NR-column panel: the micro-kernel, storing the tile (first block of k) or
//	          adding it to out (the others); a tile past m or n goes through scratch.
//
// Every element of out is the sum of its k products in blocks of gemmKC, each block
// summed in order by FMAs in one accumulator and added to the sum of the blocks before
// it: its bits depend on its row of a, its column of op(b), k and the micro-kernel, not
// on m, n, the split or the number of workers. The kernels round once per FMA, so
// values differ from gonum's and a library's by float32 rounding (within the bound
// checkProduct states).

// gemmKC is the depth of a packed block: 256 steps keep a 14-row micro-panel of a (14
// KiB) in L1 and a block of b's panels (gemmKC×gemmNC, 256 KiB) in L2. Fixed, since it
// fixes the order of the sums.
const gemmKC = 256

// gemmNC is the most columns of out one block computes (a multiple of every NR).
const gemmNC = 256

// gemmMC is about the most rows of out one block computes: 512 rows of a (2 MiB at
// k=1024) stay in L3 while the blocks of their columns run.
const gemmMC = 512

// ownTask is one ownGemm call split in blocks of rows and columns, a pool task.
type ownTask struct {
	loop      loop
	transB    bool
	out, a, b []float32
	wb        []uint16 // b in bfloat16 (transB), when b is nil
	m, k, n   int
	mr, nr    int
	panels    int // ⌈m/MR⌉
	rowPanels int // panels a block of rows holds
	colBlocks int
	scratch   [][]float32 // per participant: b's packed block, a's panel, an edge tile; kept
}

var ownTasks freeList[ownTask]

// ownGemm computes out = a·op(b) (b is [k, n], or [n, k] when transB) on the micro-kernel
// mr×nr (gemmMicro), for k > 0, m > 0, n > 0; split as gemm's.
func ownGemm(split, transB bool, out, a, b []float32, m, k, n, mr, nr int) {
	ownGemmOn(split, transB, out, a, b, nil, m, k, n, mr, nr)
}

// ownGemmOn is ownGemm on b, or on the bfloat16 wb ([n, k], transB) when b is nil, widened
// to float32 as it is packed.
func ownGemmOn(split, transB bool, out, a, b []float32, wb []uint16, m, k, n, mr, nr int) {
	t := ownTasks.get()
	defer func() {
		t.out, t.a, t.b, t.wb = nil, nil, nil, nil
		ownTasks.put(t)
	}()
	t.transB, t.out, t.a, t.b, t.wb, t.m, t.k, t.n, t.mr, t.nr = transB, out, a, b, wb, m, k, n, mr, nr
	t.panels = (m + mr - 1) / mr
	t.colBlocks = (n + gemmNC - 1) / gemmNC
	p := 1
	if split && m*n*k >= minParallelMACs {
		p = parts()
	}
	// Rows in blocks of about gemmMC, and more when there are fewer than two blocks a
	// participant. Blocks of the same rows are claimed one after the other, so their rows
	// of a are read from L3 after the first.
	rowBlocks := max(1, (m+gemmMC/2)/gemmMC)
	if want := 2 * p; p > 1 && t.colBlocks*rowBlocks < want {
		rowBlocks = min(t.panels, (want+t.colBlocks-1)/t.colBlocks)
	}
	t.rowPanels = (t.panels + rowBlocks - 1) / rowBlocks
	rowBlocks = (t.panels + t.rowPanels - 1) / t.rowPanels
	for len(t.scratch) < p {
		t.scratch = append(t.scratch, nil)
	}
	if p > 1 {
		parallelFor(&t.loop, t, rowBlocks*t.colBlocks, 1)
		return
	}
	t.run(0, 0, rowBlocks*t.colBlocks)
}

func (t *ownTask) run(part, lo, hi int) {
	for i := lo; i < hi; i++ {
		t.block(part, i/t.colBlocks, i%t.colBlocks)
	}
}

// packRows packs rows < width rows of src, ld apart, kc values each, as dst[l*width + i]
// = src[i*ld + l], zeros for rows ≤ i < width.
func packRows(dst, src []float32, ld, rows, width, kc int) {
	dst = dst[:kc*width]
	if kc8 := kc &^ 7; kc8 > 0 && rows == 6 && width == 6 && packT6(dst, src, ld, kc8) {
		// The AVX2 micro-kernel's full panel of a, packed again for every block of columns:
		// in loops, about a tenth of a prefill GEMM's time (BenchmarkSGEMM's profile).
		for r := range 6 {
			for l := kc8; l < kc; l++ {
				dst[l*6+r] = src[r*ld+l]
			}
		}
		return
	}
	i := 0
	if kc8 := kc &^ 7; kc8 > 0 && rows >= 8 { // 8 rows at a time on the transposing kernel
		for i+8 <= rows && packT8(dst[i:], width, src[i*ld:], ld, kc8) {
			i += 8
			if i < rows && rows < i+8 && packT8(dst[rows-8:], width, src[(rows-8)*ld:], ld, kc8) {
				i = rows // the last rows' 8, overlapping rows done (MR = 14: rows 6 to 13)
			}
		}
		for r := range i {
			for l := kc8; l < kc; l++ {
				dst[l*width+r] = src[r*ld+l]
			}
		}
	}
	for ; i < rows; i++ {
		s := src[i*ld:][:kc]
		for l, v := range s {
			dst[l*width+i] = v
		}
	}
	if rows < width {
		for l := range kc {
			clear(dst[l*width+rows : (l+1)*width])
		}
	}
}

// packCols packs cols < width columns of the row-major src, ld apart, for kc rows, as
// dst[l*width + j] = src[l*ld + j], zeros for cols ≤ j < width.
func packCols(dst, src []float32, ld, cols, width, kc int) {
	dst = dst[:kc*width]
	for l := range kc {
		d := dst[l*width : (l+1)*width]
		copy(d, src[l*ld:][:cols])
		clear(d[cols:])
	}
}

// block computes out's rows of the row block rb and columns of the column block cb.
func (t *ownTask) block(part, rb, cb int) {
	mr, nr, k, n := t.mr, t.nr, t.k, t.n
	c0 := cb * gemmNC
	c1 := min(c0+gemmNC, n)
	colPanels := (c1 - c0 + nr - 1) / nr
	p0, p1 := rb*t.rowPanels, min((rb+1)*t.rowPanels, t.panels)
	// The participant's scratch: b's block, 64-byte aligned, a's panel, an edge tile.
	scratch := growFloat32s(t.scratch[part], gemmKC*gemmNC+gemmKC*mr+mr*nr+16)
	t.scratch[part] = scratch
	off := int((64 - uintptr(unsafe.Pointer(&scratch[0]))%64) % 64 / 4)
	pb := scratch[off : off+gemmKC*gemmNC]
	pa := scratch[off+gemmKC*gemmNC:][:gemmKC*mr]
	tile := scratch[off+gemmKC*gemmNC+gemmKC*mr:][:mr*nr]
	for pc := 0; pc < k; pc += gemmKC {
		kc := min(gemmKC, k-pc)
		acc := 0
		if pc > 0 {
			acc = 1
		}
		for jp := range colPanels {
			j0 := c0 + jp*nr
			cols := min(nr, c1-j0)
			if t.b == nil {
				packRowsBF16(pb[jp*kc*nr:], t.wb[j0*k+pc:], k, cols, nr, kc)
			} else if t.transB {
				packRows(pb[jp*kc*nr:], t.b[j0*k+pc:], k, cols, nr, kc)
			} else {
				packCols(pb[jp*kc*nr:], t.b[pc*n+j0:], n, cols, nr, kc)
			}
		}
		for p := p0; p < p1; p++ {
			i0 := p * mr
			rows := min(mr, t.m-i0)
			ap := pa[:mr*kc]
			packRows(ap, t.a[i0*k+pc:], k, rows, mr, kc)
			for jp := range colPanels {
				j0 := c0 + jp*nr
				cols := min(nr, c1-j0)
				bp := pb[jp*kc*nr:][:kc*nr]
				if rows == mr && cols == nr {
					_ = t.out[(i0+mr-1)*n+j0+nr-1]
					micro(mr, kc, &ap[0], &bp[0], &t.out[i0*n+j0], n, acc)
					continue
				}
				if acc != 0 {
					for i := range rows {
						copy(tile[i*nr:i*nr+cols], t.out[(i0+i)*n+j0:])
					}
				}
				micro(mr, kc, &ap[0], &bp[0], &tile[0], nr, acc)
				for i := range rows {
					copy(t.out[(i0+i)*n+j0:][:cols], tile[i*nr:])
				}
			}
		}
	}
}
