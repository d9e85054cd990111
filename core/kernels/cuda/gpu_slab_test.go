//go:build gpu

package cuda

import "github.com/resin-llm/resin/core/kvslab"

// table is the sequences' page tables as a [len(seqs), maxPages] uint32 array, padded with
// kvslab.NoPage. Only TestGPUPagedAttention (tag gpu) uses it: here, so that a build
// without the tag does not see it unused.
func (s *slabKV) table(maxPages int) []uint32 {
	tab := make([]uint32, len(s.seqs)*maxPages)
	for i := range tab {
		tab[i] = uint32(kvslab.NoPage)
	}
	for b, id := range s.seqs {
		for j, p := range s.pool.PageTable(id, 0) {
			tab[b*maxPages+j] = uint32(p)
		}
	}
	return tab
}
