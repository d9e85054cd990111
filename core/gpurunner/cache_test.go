package gpurunner

import (
	"testing"

	"github.com/resin-llm/resin/core/kvslab"
)

// TestCacheLayoutsMatchPool checks that the kernels' addressing of each layer's keys and
// values (cuda.KVSlabLayout in bf16 elements) lands where kvslab puts the page: the
// layer's block of the page kvslab.Pool.PageOffset names, keys then values.
func TestCacheLayoutsMatchPool(t *testing.T) {
	c := tinyConfig()
	groups := CacheGroups(c)
	if groups[0].BytesPerToken != 2*c.KVDim()*2 || groups[0].PageTokens != c.PageTokens {
		t.Fatalf("group %+v", groups[0])
	}
	arena, err := kvslab.NewHostArena(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := kvslab.New(kvslab.Config{Groups: groups}, arena)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := cacheLayouts(c, pool)
	if err != nil {
		t.Fatal(err)
	}
	half := int64(c.PageTokens * c.KVDim()) // one layer's keys in a page, in elements
	pageBytes := groups[0].PageBytes()
	slots := int(pool.SlabBytes() / pageBytes)
	checked := 0
	for _, id := range []kvslab.PageID{0, 1, kvslab.PageID(slots - 1), 1<<kvslab.SlotBits | 2} {
		if int64(id>>kvslab.SlotBits)*pool.SlabBytes() >= arena.Size() {
			continue
		}
		checked++
		base := pool.PageOffset(0, id)
		for l, lay := range layers {
			k, v := 2*lay.KeyOffset(uint32(id)), 2*lay.ValueOffset(uint32(id))
			if k != base+int64(l)*2*half*2 || v != k+half*2 {
				t.Errorf("page %#x layer %d: keys at byte %d and values at %d, kvslab's page at %d", id, l, k, v, base)
			}
		}
	}
	if checked < 3 {
		t.Fatalf("only %d pages checked", checked)
	}
	// A pool of other groups is refused.
	other := CacheGroups(c)
	other[0].BytesPerToken *= 2 // float32 keys and values
	p2, err := kvslab.New(kvslab.Config{Groups: other}, arena)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cacheLayouts(c, p2); err == nil {
		t.Error("a float32 cache pool was accepted for the bf16 model")
	}
}
