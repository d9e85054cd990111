package ref

import "os"

// amxInt8Kernel is in amxint8_amd64.s.
//
//go:noescape
func amxInt8Kernel(cfg *amxTileConfig, a *amxInt8Args)

// amxInt8Args is amxInt8Kernel's operands (the assembly reads them at these offsets).
type amxInt8Args struct {
	out     *float32 // 0
	ldo     int      // 8
	xq      *int8    // 16
	ldx     int      // 24
	xs      *float32 // 32
	xc      *int32   // 40
	wq      *uint8   // 48
	ws      *float32 // 56
	nb      int      // 64
	scratch *int32   // 72
	rows    int      // 80: the last group's tokens
	mask    uint64   // 88
	groups  int      // 96
}

// amxInt8Config: amxInt8Kernel's tiles, two blocks' of each: 0 and 1 the int32 products
// (16 tokens by 16 rows of w), 4 and 5 the tokens' blocks (16 rows of 32 bytes), 6 and 7
// the weights' (8 steps of 16 rows' 4 bytes).
var amxInt8Config = func() *amxTileConfig {
	c := &amxTileConfig{palette: 1}
	for _, p := range [][2]int{{0, 1}, {4, 5}, {6, 7}} { // two blocks at a time
		c.colsb[p[0]], c.rows[p[0]] = 64, 16
		c.colsb[p[1]], c.rows[p[1]] = 64, 16
	}
	c.colsb[4], c.colsb[5] = 32, 32
	c.rows[6], c.rows[7] = 8, 8
	return c
}()

// hasAMXInt8 says whether MatMulTInt8's prefill runs on AMX tiles: the CPU has AMX-INT8
// and the VNNI kernels, the OS granted the tile state (AMX()), and RESIN_AMX is not off.
var hasAMXInt8 = amxInt8Allowed()

func amxInt8Allowed() bool {
	if os.Getenv("RESIN_AMX") == "off" || !hasInt8VNNI {
		return false
	}
	s := AMX()
	return s.Granted && s.Int8
}

// amxRows computes t's output columns of w's groups [lo, hi) for every row on AMX:
// each group against the rows 16 at a time (t.xq in one row a block of 32, padded to a
// multiple of 16 rows with zeros), to the bit what q8Dot1VNNI computes.
func (t *int8Task) amxRows(part, lo, hi int) {
	w, m, n, nb := t.w, t.m, t.w.n, t.w.nb
	s := &t.scratch[part]
	gs := nb * q8Group * q8Block
	a := amxInt8Args{ldx: nb * q8Block, nb: nb, scratch: &s.tile[0]}
	for g := lo; g < hi; g++ {
		j0 := g * q8Group
		cols := min(q8Group, n-j0)
		a.wq, a.ws, a.mask = &w.q[g*gs], &w.scales[g*nb*q8Group], uint64(colMask(cols))
		a.groups, a.rows = (m+15)/16, m-(m-1)/16*16
		a.out, a.ldo = &t.out[j0], n
		a.xq, a.xs, a.xc = &t.xq[0], &t.xs[0], &t.xc[0]
		amxInt8Kernel(amxInt8Config, &a)
	}
}
