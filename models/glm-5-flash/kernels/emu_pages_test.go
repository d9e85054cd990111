package kernels

import (
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/resin-llm/resin/core/cudart"
)

// TestEmuPageRows scatters a step's rows of two sequences into scattered page slots (rows
// of a 7-float stride, the row at column 2, as a kvslab page holds a layer's latents
// beside other fields) and gathers them back into a fresh dense buffer, against
// PageRowsRef: bit for bit, and the pages' other floats untouched.
func TestEmuPageRows(t *testing.T) {
	const dim, stride, inner = 5, 7, 2
	r := rand.New(rand.NewPCG(3, 4))
	dense := make([]float32, 12*dim)
	for i := range dense {
		dense[i] = float32(r.NormFloat64())
	}
	paged := make([]float32, 40*stride)
	for i := range paged {
		paged[i] = -1
	}
	// Rows 3..5 of slot 0 and 8..9 of slot 1 (6 rows a slot) to scattered page slots.
	off := []int64{11 * stride, 2 * stride, 30 * stride, 7 * stride, 19 * stride}
	row := []int64{3, 4, 5, 6 + 2, 6 + 3}
	table := append(append([]int64(nil), off...), row...)
	want := slices.Clone(paged)
	if err := PageRowsRef(want[inner:], off, dense, row, dim, false); err != nil {
		t.Fatal(err)
	}
	emuLaunch(t, PageRows{Paged: dptr(paged[inner:]), Dense: dptr(dense), Table: i64ptr(table), Rows: len(off), Dim: dim},
		paged, dense, table)
	closeTo(t, "pages", paged, want, 0)
	back := make([]float32, len(dense))
	wantBack := make([]float32, len(dense))
	if err := PageRowsRef(paged[inner:], off, wantBack, row, dim, true); err != nil {
		t.Fatal(err)
	}
	emuLaunch(t, PageRows{Paged: dptr(paged[inner:]), Dense: dptr(back), Table: i64ptr(table), Rows: len(off), Dim: dim, ToDense: true},
		paged, back, table)
	closeTo(t, "gathered", back, wantBack, 0)
	for _, rw := range row {
		closeTo(t, "round trip", back[rw*dim:(rw+1)*dim], dense[rw*dim:(rw+1)*dim], 0)
	}
	var sp spec
	for _, l := range []PageRows{{Rows: 0, Dim: 4, Paged: 1, Dense: 1, Table: 1}, {Rows: 2, Dim: 4, Dense: 1, Table: 1}} {
		if err := l.spec(&sp); err == nil {
			t.Errorf("%#v accepted", l)
		}
	}
}

func i64ptr(s []int64) cudart.DevicePtr { return cudart.DevicePtr(uintptr(unsafe.Pointer(&s[0]))) }

// TestEmuStreamMean checks hc_head's mean of 3 rows of 4 streams of 37 against
// StreamMeanRef bit for bit (the same sum order).
func TestEmuStreamMean(t *testing.T) {
	const rows, hc, dim = 3, 4, 37
	r := rand.New(rand.NewPCG(7, 8))
	streams := make([]float32, rows*hc*dim)
	for i := range streams {
		streams[i] = float32(r.NormFloat64())
	}
	out, want := make([]float32, rows*dim), make([]float32, rows*dim)
	if err := StreamMeanRef(want, streams, rows, hc, dim); err != nil {
		t.Fatal(err)
	}
	emuLaunch(t, StreamMean{Out: dptr(out), Streams: dptr(streams), Rows: rows, HC: hc, Dim: dim}, out, streams)
	closeTo(t, "mean", out, want, 0)
}
