package gpurunner

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// hostPool is a pool of the dense model's cache group over host memory filled with
// seeded random bytes.
func hostPool(t *testing.T, c *DenseConfig, size int64, seed uint64) (*kvslab.Pool, *kvslab.HostArena) {
	t.Helper()
	arena, err := kvslab.NewHostArena(size)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	b := arena.Bytes(0, size)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	pool, err := kvslab.New(kvslab.Config{Groups: CacheGroups(c)}, arena)
	if err != nil {
		t.Fatal(err)
	}
	return pool, arena
}

// TestCacheCopiesMatchApplyCacheOps translates a plan's cache ops into the arena copies
// the runner queues on its stream, applies them to host memory in order, and checks the
// bytes against engine.ApplyCacheOps on an identical pool: the same pages end up with the
// same contents, chained copies (a page copied, then copied on) included.
func TestCacheCopiesMatchApplyCacheOps(t *testing.T) {
	c := tinyConfig()
	const size = 8 << 20
	want, wantMem := hostPool(t, c, size, 7)
	got, gotMem := hostPool(t, c, size, 7)
	if want.Slabs() < 2 {
		t.Fatalf("pool of %d slabs: the test wants pages in two slabs", want.Slabs())
	}
	slots := int(want.SlabBytes() / CacheGroups(c)[0].PageBytes())
	page := func(slab, slot int) kvslab.PageID { return kvslab.PageID(slab)<<kvslab.SlotBits | kvslab.PageID(slot) }
	ops := []engine.CacheOp{
		{Kind: engine.OpCopyPage, Src: page(0, 1), Dst: page(1, 3)},
		{Kind: engine.OpCopyPage, Src: page(1, 3), Dst: page(0, slots-1)}, // reads what the first wrote
		{Kind: engine.OpCopyPage, Src: page(0, 5), Dst: page(0, 5)},       // onto itself: nothing
		{Kind: engine.OpCopyPage, Src: page(want.Slabs()-1, slots-1), Dst: page(0, 0)},
	}
	if err := engine.ApplyCacheOps(want, ops); err != nil {
		t.Fatal(err)
	}
	copies, err := cacheCopies(nil, ops, got)
	if err != nil {
		t.Fatal(err)
	}
	if len(copies) != 3 {
		t.Errorf("%d copies for 3 page copies and one copy onto itself: %+v", len(copies), copies)
	}
	for _, cp := range copies {
		copy(gotMem.Bytes(cp.Dst, cp.N), gotMem.Bytes(cp.Src, cp.N))
	}
	if !bytes.Equal(gotMem.Bytes(0, size), wantMem.Bytes(0, size)) {
		t.Error("the runner's arena copies leave other bytes than engine.ApplyCacheOps")
	}
	// The copies really moved bytes: the first op's destination now holds its source.
	pb := CacheGroups(c)[0].PageBytes()
	if !bytes.Equal(gotMem.Bytes(got.PageOffset(0, page(0, slots-1)), pb), gotMem.Bytes(got.PageOffset(0, page(0, 1)), pb)) {
		t.Error("a chained copy did not carry the first page's bytes")
	}
	// Reusing the slice allocates nothing.
	if n := testing.AllocsPerRun(50, func() { copies, _ = cacheCopies(copies[:0], ops, got) }); n != 0 {
		t.Errorf("cacheCopies allocated %.0f times into a reused slice", n)
	}
}

func TestCacheCopiesRefuseBadOps(t *testing.T) {
	c := tinyConfig()
	pool, _ := hostPool(t, c, 8<<20, 3)
	slots := int(pool.SlabBytes() / CacheGroups(c)[0].PageBytes())
	ok := engine.CacheOp{Kind: engine.OpCopyPage, Src: 1, Dst: 2}
	cases := map[string]engine.CacheOp{
		"kind":        {Kind: 9, Src: 1, Dst: 2},
		"group":       {Kind: engine.OpCopyPage, Group: 1, Src: 1, Dst: 2},
		"no page":     {Kind: engine.OpCopyPage, Src: kvslab.NoPage, Dst: 2},
		"slab":        {Kind: engine.OpCopyPage, Src: 1, Dst: kvslab.PageID(pool.Slabs()) << kvslab.SlotBits},
		"slot":        {Kind: engine.OpCopyPage, Src: kvslab.PageID(slots), Dst: 2},
		"negative gr": {Kind: engine.OpCopyPage, Group: -1, Src: 1, Dst: 2},
	}
	for name, op := range cases {
		out, err := cacheCopies(nil, []engine.CacheOp{ok, op}, pool)
		if err == nil {
			t.Errorf("%s: op %+v accepted", name, op)
			continue
		}
		if !strings.Contains(err.Error(), "cache op 1") {
			t.Errorf("%s: error %q does not name the op", name, err)
		}
		if len(out) > 1 {
			t.Errorf("%s: %d copies returned with the error", name, len(out))
		}
		// engine.ApplyCacheOps refuses the same op.
		if err := engine.ApplyCacheOps(pool, []engine.CacheOp{op}); err == nil {
			t.Errorf("%s: engine.ApplyCacheOps accepts %+v, the runner refuses it", name, op)
		}
	}
}
