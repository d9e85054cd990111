package kernels

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
)

// PageRowsName is pages.cu's entry point.
const PageRowsName = "glm5flash_page_rows"

// PageRows is a launch that copies Rows rows of Dim floats between kvslab pages and a
// dense per-position buffer: Table holds [Rows] int64 element offsets of the rows from
// Paged, then [Rows] int64 row indices into Dense (Dim floats a row). ToDense copies the
// pages' rows into Dense, else Dense's rows into the pages. Rows never overlap.
type PageRows struct {
	Paged, Dense, Table cudart.DevicePtr
	Rows, Dim           int
	ToDense             bool
}

func (a PageRows) spec(sp *spec) error {
	if a.Rows <= 0 || a.Dim <= 0 || a.Rows*a.Dim > maxI32 || a.Paged == 0 || a.Dense == 0 || a.Table == 0 {
		return fmt.Errorf("kernels: page_rows: %d rows of %d (paged %#x, dense %#x, table %#x)", a.Rows, a.Dim, a.Paged, a.Dense, a.Table)
	}
	toDense := 0
	if a.ToDense {
		toDense = 1
	}
	sp.reset(PageRowsName, cudart.D1((a.Rows*a.Dim+255)/256), cudart.D1(256), 0)
	sp.ptr(a.Paged).ptr(a.Table).ptr(a.Dense).ptr(a.Table + cudart.DevicePtr(8*a.Rows)).i32(a.Rows).i32(a.Dim).i32(toDense)
	return nil
}

// PageRowsRef is PageRows on host slices: paged rows at off[r], dense rows at row[r]·dim.
func PageRowsRef(paged []float32, off []int64, dense []float32, row []int64, dim int, toDense bool) error {
	if len(off) != len(row) || dim <= 0 {
		return fmt.Errorf("kernels: page_rows: %d offsets, %d rows of %d", len(off), len(row), dim)
	}
	for r := range off {
		if off[r] < 0 || off[r]+int64(dim) > int64(len(paged)) || row[r] < 0 || (row[r]+1)*int64(dim) > int64(len(dense)) {
			return fmt.Errorf("kernels: page_rows: row %d (offset %d, dense row %d) outside the buffers", r, off[r], row[r])
		}
		p, d := paged[off[r]:off[r]+int64(dim)], dense[row[r]*int64(dim):(row[r]+1)*int64(dim)]
		if toDense {
			copy(d, p)
		} else {
			copy(p, d)
		}
	}
	return nil
}
