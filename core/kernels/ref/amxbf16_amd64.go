package ref

import (
	"os"
	"unsafe"
)

// The AMX routines are in amxbf16_amd64.s.

//go:noescape
func amxBF16Kernel(cfg *amxTileConfig, c *float32, w *uint16, ldw int, b *uint32, kb int)

//go:noescape
func amxBF16Kernel64(cfg *amxTileConfig, c *float32, w *uint16, ldw int, b *uint32, kb int)

//go:noescape
func amxStoreT64(out *float32, ldo int, c *float32, rows int, mask0, mask1, mask2, mask3 uint16)

//go:noescape
func amxPackBF16(dst *uint32, x *float32, ldx int, rows int, kb int)

//go:noescape
func amxStoreT(out *float32, ldo int, c *float32, rows int, mask0, mask1 uint16)

// amxTileConfig is LDTILECFG's 64-byte operand: palette 1, then each tile's bytes a row
// and rows.
type amxTileConfig struct {
	palette uint8
	_       uint8 // start_row: 0, no interrupted tile load to resume
	_       [14]byte
	colsb   [16]uint16
	rows    [16]uint8
}

// amxConfig: every tile amxBF16Kernel uses (0-3 the products, 4-5 w, 6-7 the tokens) is
// 16 rows of 64 bytes.
var amxConfig = func() *amxTileConfig {
	c := &amxTileConfig{palette: 1}
	for t := range 8 {
		c.colsb[t], c.rows[t] = 64, 16
	}
	return c
}()

// hasAMXBF16 says whether MatMulTBF16's prefill runs on AMX tiles: the CPU has AMX-BF16,
// the OS granted this process the tile state (AMX()), and RESIN_AMX is not off.
var hasAMXBF16 = amxBF16Allowed()

func amxBF16Allowed() bool {
	if os.Getenv("RESIN_AMX") == "off" || !hasSkinnyAVX512 {
		return false
	}
	s := AMX()
	return s.Granted && s.BF16
}

const (
	amxNB = 32 // w's rows a kernel call takes
	amxMB = 32 // and tokens
)

// amxTask is one amxBF16Gemm call split in blocks of 32 of w's rows, a pool task.
type amxTask struct {
	loop    loop
	b       []uint32 // x packed in groups of 32 tokens; kept
	out     []float32
	w       []uint16
	m, k, n int
	scratch []amxScratch // per participant; kept
}

type amxScratch struct {
	c    [4 * 256]float32 // a call's four tiles
	wpad []uint16         // the last block's rows, padded to 32 with zeros, where n%32 ≠ 0
}

var amxTasks freeList[amxTask]

// amxBF16Gemm computes out = x·wᵀ for a bfloat16 w ([n, k]) on AMX tiles, with x rounded
// to bfloat16 (ties to even) and each pair of products summed in float32 (TDPBF16PS): x
// packed once into groups of 32 tokens, w read as stored in blocks of 32 rows (each block
// against every group, its 64 KiB at k = 1024 staying in L2; 64 rows against at most 16
// tokens, amxBF16Kernel64), the tiles written back transposed. Each output's sum runs
// over k in the same order whichever kernel and rows share its tiles. It reports false, computing nothing, without AMX-BF16 (hasAMXBF16) or where
// k is not a multiple of 32.
func amxBF16Gemm(out, x []float32, w []uint16, m, k, n int) bool {
	if !hasAMXBF16 || k%32 != 0 || m == 0 || n == 0 || k == 0 {
		return false
	}
	kb := k / 32
	t := amxTasks.get()
	groups := (m + amxMB - 1) / amxMB
	per := kb * 512 // uint32s a group packs into
	t.b = growUint32s(t.b, groups*per)
	for g := range groups {
		rows := min(amxMB, m-g*amxMB)
		b := t.b[g*per : (g+1)*per]
		if rows < amxMB {
			clear(b)
		}
		amxPackBF16(&b[0], &x[g*amxMB*k], k, rows, kb)
	}
	t.out, t.w, t.m, t.k, t.n = out, w, m, k, n
	p := parts()
	for len(t.scratch) < p {
		t.scratch = append(t.scratch, amxScratch{})
	}
	blocks := (n + t.rowsPer() - 1) / t.rowsPer()
	if p > 1 && m*n*k >= minParallelMACs {
		parallelFor(&t.loop, t, blocks, 1)
	} else {
		t.run(0, 0, blocks)
	}
	t.out, t.w = nil, nil
	amxTasks.put(t)
	return true
}

// amx64Rows is the most tokens amxBF16Kernel64 takes.
const amx64Rows = 16

// rowsPer is the rows of w a block takes: 64 against at most amx64Rows tokens
// (amxBF16Kernel64), else 32.
func (t *amxTask) rowsPer() int {
	if t.m <= amx64Rows {
		return 2 * amxNB
	}
	return amxNB
}

func (t *amxTask) run(part, lo, hi int) {
	s := &t.scratch[part]
	k, kb := t.k, t.k/32
	per := kb * 512
	nb := t.rowsPer()
	for blk := lo; blk < hi; blk++ {
		j0 := blk * nb
		cols := min(nb, t.n-j0)
		w := t.w[j0*k:]
		if cols < nb {
			if cap(s.wpad) < nb*k {
				s.wpad = make([]uint16, nb*k)
			}
			s.wpad = s.wpad[:nb*k]
			copy(s.wpad, t.w[j0*k:(j0+cols)*k])
			clear(s.wpad[cols*k:])
			w = s.wpad
		}
		if nb > amxNB { // one group of at most 16 tokens
			amxBF16Kernel64(amxConfig, &s.c[0], unsafe.SliceData(w), 2*k, &t.b[0], kb)
			amxStoreT64(&t.out[j0], t.n, &s.c[0], t.m, colMask(cols), colMask(cols-16), colMask(cols-32), colMask(cols-48))
			continue
		}
		mask0, mask1 := colMask(cols), colMask(cols-16)
		for g := 0; g*amxMB < t.m; g++ {
			amxBF16Kernel(amxConfig, &s.c[0], unsafe.SliceData(w), 2*k, &t.b[g*per], kb)
			rows := min(amxMB, t.m-g*amxMB)
			amxStoreT(&t.out[g*amxMB*t.n+j0], t.n, &s.c[0], rows, mask0, mask1)
		}
	}
}

// colMask is the mask of the first c of 16 columns.
func colMask(c int) uint16 {
	switch {
	case c <= 0:
		return 0
	case c >= 16:
		return 0xffff
	}
	return 1<<c - 1
}
