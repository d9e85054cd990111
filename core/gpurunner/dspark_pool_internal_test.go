package gpurunner

import (
	"testing"

	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/kvslab"
)

// TestDSparkScratchSlabsShrinkAFullPool: a pool sized to the most slabs a page id
// addresses (a small model in a large cache) gives its last slabs to the DSpark block
// pages, which share the id space; 'resin generate --device cuda-emu --speculative-method
// dspark' on a 30M target was refused ("65535 slabs and 32 more ... exceed").
func TestDSparkScratchSlabsShrinkAFullPool(t *testing.T) {
	d := &dspark.Drafter{Config: &dspark.Config{BlockSize: 7}}
	g := kvslab.GroupSpec{Name: dspark.CacheGroupName, Kind: kvslab.Full, Layers: 1, BytesPerToken: 64, PageTokens: 16}
	for _, slabs := range []int{100, kvslab.MaxSlabs} {
		z := kvslab.Sizing{SlabBytes: g.PageBytes(), Slabs: slabs}
		n, err := dsparkScratchSlabs(d, []kvslab.GroupSpec{g}, &z, 16)
		if err != nil {
			t.Fatal(err)
		}
		if want := 16 * dsparkBlockPages(7, 16); n != want {
			t.Fatalf("%d scratch slabs, want %d (a page a slab, %d pages for each of 16 sequences)", n, want, want/16)
		}
		if z.Slabs+n > kvslab.MaxSlabs || (slabs == 100 && z.Slabs != 100) {
			t.Errorf("a pool of %d slabs became %d with %d scratch slabs after it (at most %d ids)", slabs, z.Slabs, n, kvslab.MaxSlabs)
		}
	}
}
