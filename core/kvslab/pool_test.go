package kvslab

import (
	"errors"
	"slices"
	"testing"
)

// pg names page (slab, slot) as the pool encodes it.
func pg(slab, slot int) PageID { return PageID(slab)<<SlotBits | PageID(slot) }

const no = NoPage

func full(name string, pageTokens int) GroupSpec {
	return GroupSpec{Name: name, Kind: Full, Layers: 1, BytesPerToken: 4, PageTokens: pageTokens}
}

func newPool(t testing.TB, slab, arena int64, groups ...GroupSpec) *Pool {
	t.Helper()
	a, err := NewHostArena(arena)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Groups: groups, SlabBytes: slab}, a)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func open(t testing.TB, p *Pool, prompt []int32) (SeqID, int) {
	t.Helper()
	s, hit, err := p.Open(prompt)
	if err != nil {
		t.Fatal(err)
	}
	return s, hit
}

func reserve(t testing.TB, p *Pool, s SeqID, n int) {
	t.Helper()
	if err := p.Reserve(s, n); err != nil {
		t.Fatalf("reserve %d: %v", n, err)
	}
	if err := p.Check(); err != nil {
		t.Fatalf("after reserve %d: %v", n, err)
	}
}

func wantTable(t testing.TB, p *Pool, s SeqID, g int, want ...PageID) {
	t.Helper()
	if got := p.PageTable(s, g); !slices.Equal(got, want) {
		t.Fatalf("seq %d group %q: page table %s, want %s", s, p.Groups()[g].Name, fmtTable(got), fmtTable(want))
	}
}

func fmtTable(t []PageID) string {
	s := "["
	for i, id := range t {
		if i > 0 {
			s += " "
		}
		if id == NoPage {
			s += "-"
		} else {
			s += string(rune('0'+id.Slab())) + ":" + string(rune('0'+id.Slot()))
		}
	}
	return s + "]"
}

func seqTokens(base int32, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = base + int32(i)
	}
	return out
}

func TestGrowthAcrossPageBoundaries(t *testing.T) {
	// Pages of 4 tokens × 4 bytes = 16 bytes; slabs of 4 pages; 3 slabs.
	p := newPool(t, 64, 192, full("kv", 4))
	a, _ := open(t, p, nil)
	steps := []struct {
		seq  SeqID
		n    int
		want []PageID
	}{
		{a, 3, []PageID{pg(0, 0)}},
		{a, 1, []PageID{pg(0, 0)}},           // exactly one page
		{a, 1, []PageID{pg(0, 0), pg(0, 1)}}, // crosses into a second page
		{a, 8, []PageID{pg(0, 0), pg(0, 1), pg(0, 2), pg(0, 3)}},
		{a, 4, []PageID{pg(0, 0), pg(0, 1), pg(0, 2), pg(0, 3), pg(1, 0)}}, // a second slab is lent
	}
	for i, st := range steps {
		reserve(t, p, st.seq, st.n)
		if got := p.PageTable(st.seq, 0); !slices.Equal(got, st.want) {
			t.Fatalf("step %d: table %s, want %s", i, fmtTable(got), fmtTable(st.want))
		}
	}
	if p.Len(a) != 17 {
		t.Fatalf("len %d, want 17", p.Len(a))
	}
	b, _ := open(t, p, nil)
	reserve(t, p, b, 4)
	wantTable(t, p, b, 0, pg(1, 1))
	if err := p.Free(a); err != nil {
		t.Fatal(err)
	}
	// Slab 0 emptied and went back to the pool; slab 1 keeps b's page.
	st := p.Stats()
	if st.FreeSlabs != 2 || st.Groups[0].Slabs != 1 || st.Groups[0].PagesUsed != 1 {
		t.Fatalf("after free: %+v", st)
	}
	if got := p.PageOffset(0, pg(1, 1)); got != 64+16 {
		t.Fatalf("offset of page 1:1 is %d, want 80", got)
	}
}

func TestSlidingWindowRelease(t *testing.T) {
	sw := GroupSpec{Name: "swa", Kind: SlidingWindow, Layers: 1, BytesPerToken: 4, PageTokens: 4, Window: 8}
	p := newPool(t, 64, 128, sw)
	a, _ := open(t, p, nil)
	steps := []struct {
		n    int
		want []PageID
	}{
		{8, []PageID{pg(0, 0), pg(0, 1)}},
		// The next token (position 8) sees 1..8: block 0 is still needed.
		{4, []PageID{pg(0, 0), pg(0, 1), pg(0, 2)}},
		// Position 12 sees 5..12: block 0 (tokens 0..3) is released first, then reused.
		{1, []PageID{no, pg(0, 1), pg(0, 2), pg(0, 0)}},
		// Position 13 sees 6..13: blocks 1..3 still needed.
		{3, []PageID{no, pg(0, 1), pg(0, 2), pg(0, 0)}},
		// Position 16 sees 9..16: block 1 released; block 4 reuses its page.
		{1, []PageID{no, no, pg(0, 2), pg(0, 0), pg(0, 1)}},
	}
	for i, st := range steps {
		reserve(t, p, a, st.n)
		if got := p.PageTable(a, 0); !slices.Equal(got, st.want) {
			t.Fatalf("step %d: table %s, want %s", i, fmtTable(got), fmtTable(st.want))
		}
	}
	// Rolling back behind the released pages is refused and changes nothing.
	if err := p.Truncate(a, 10); err == nil {
		t.Fatal("truncate behind the window: no error")
	}
	if p.Len(a) != 17 {
		t.Fatalf("len %d after a refused truncate", p.Len(a))
	}
	if err := p.Truncate(a, 2); err != nil {
		t.Fatal(err)
	}
	wantTable(t, p, a, 0, no, no, pg(0, 2), pg(0, 0))
}

func TestCompressedGroup(t *testing.T) {
	// One entry per 2 tokens: a page of 8 tokens holds 4 entries × 2 layers × 6 bytes.
	c := GroupSpec{Name: "csa", Kind: Compressed, Layers: 2, BytesPerToken: 6, PageTokens: 8, Ratio: 2}
	if got := c.PageBytes(); got != 48 {
		t.Fatalf("page bytes %d, want 48", got)
	}
	p := newPool(t, 96, 288, full("kv", 8), c)
	a, _ := open(t, p, nil)
	reserve(t, p, a, 9)
	wantTable(t, p, a, 0, pg(0, 0), pg(0, 1))
	wantTable(t, p, a, 1, pg(1, 0), pg(1, 1))
	reserve(t, p, a, 8)
	wantTable(t, p, a, 1, pg(1, 0), pg(1, 1), pg(2, 0))
	if got := p.PageOffset(1, pg(2, 0)); got != 2*96 {
		t.Fatalf("offset %d", got)
	}
}

func TestRecurrentCheckpoints(t *testing.T) {
	r := GroupSpec{Name: "kda", Kind: Recurrent, Layers: 2, BytesPerToken: 8, PageTokens: 4, Checkpoints: 2}
	p := newPool(t, 64, 128, r) // 16-byte states, 4 per slab
	a, _ := open(t, p, nil)
	if got := p.StatePage(a, 0); got != pg(0, 0) {
		t.Fatalf("state page %v", got)
	}
	steps := []struct {
		n    int
		want []PageID
	}{
		{3, []PageID{no}},                     // no block end reached
		{1, []PageID{pg(0, 1)}},               // token 4 ends block 0
		{8, []PageID{no, pg(0, 1), pg(0, 2)}}, // ends of blocks 1 and 2: block 0's goes first
	}
	for i, st := range steps {
		if err := p.Reserve(a, st.n); err != nil {
			t.Fatal(err)
		}
		got := p.PageTable(a, 0)
		if !slices.Equal(got, st.want) {
			t.Fatalf("step %d: table %s, want %s", i, fmtTable(got), fmtTable(st.want))
		}
		if err := p.Check(); err != nil {
			t.Fatal(err)
		}
	}
	// A long chunk reaching three block ends gets checkpoints only for the last two, on
	// the pages of the two it lets go first: the state and its quota fit one slab.
	reserve(t, p, a, 12)
	wantTable(t, p, a, 0, no, no, no, no, pg(0, 1), pg(0, 2))
	if s := p.Stats(); s.Groups[0].Slabs != 1 {
		t.Fatalf("%d slabs for a state and two checkpoints", s.Groups[0].Slabs)
	}
}

// A prefix that full attention could serve is cut short when a sliding window or a recurrent
// group lacks what it needs at the hit point.
func TestPrefixHitCutShort(t *testing.T) {
	sw := GroupSpec{Name: "swa", Kind: SlidingWindow, Layers: 1, BytesPerToken: 4, PageTokens: 4, Window: 8}
	rec := GroupSpec{Name: "state", Kind: Recurrent, Layers: 1, BytesPerToken: 16, PageTokens: 4, Checkpoints: 1}
	cases := []struct {
		name   string
		groups []GroupSpec
		query  int // tokens offered to Lookup
		want   int
	}{
		{"full alone serves every block", []GroupSpec{full("kv", 4)}, 19, 16},
		{"full alone, short query", []GroupSpec{full("kv", 4)}, 10, 8},
		{"window released blocks 0-1 before commit", []GroupSpec{full("kv", 4), sw}, 10, 0},
		{"window blocks 3-4 present at 20", []GroupSpec{full("kv", 4), sw}, 20, 20},
		{"window: 16 needs blocks 2-3", []GroupSpec{full("kv", 4), sw}, 19, 16},
		{"recurrent has a checkpoint only at 20", []GroupSpec{full("kv", 4), rec}, 19, 0},
		{"recurrent checkpoint at 20", []GroupSpec{full("kv", 4), rec}, 20, 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPool(t, 256, 4096, tc.groups...)
			toks := seqTokens(100, 20)
			a, _ := open(t, p, nil)
			// Prefill in chunks of 8, 8, 4 and commit only at the end: the window releases
			// blocks 0 and 1 when the third chunk is reserved; checkpoints are trimmed to one.
			for _, n := range []int{8, 8, 4} {
				reserve(t, p, a, n)
			}
			if err := p.Commit(a, toks); err != nil {
				t.Fatal(err)
			}
			if err := p.Free(a); err != nil {
				t.Fatal(err)
			}
			if got := p.Lookup(toks[:tc.query]); got != tc.want {
				t.Fatalf("lookup of %d tokens served %d, want %d", tc.query, got, tc.want)
			}
			b, hit := open(t, p, toks[:tc.query])
			if hit != tc.want || p.Len(b) != hit {
				t.Fatalf("open: hit %d len %d, want %d", hit, p.Len(b), tc.want)
			}
			if err := p.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestPrefixHitSharesPagesAndRestoresState(t *testing.T) {
	rec := GroupSpec{Name: "state", Kind: Recurrent, Layers: 1, BytesPerToken: 16, PageTokens: 4, Checkpoints: 4}
	p := newPool(t, 64, 1024, full("kv", 4), rec)
	toks := seqTokens(7, 9)
	a, _ := open(t, p, nil)
	reserve(t, p, a, 9)
	// The runner writes the state at the end of block 1 into its checkpoint page.
	ckpt := p.PageTable(a, 1)[1]
	b1, _ := p.PageBytes(1, ckpt)
	copy(b1, "state-after-8tok")
	if err := p.Commit(a, toks); err != nil {
		t.Fatal(err)
	}
	b, hit := open(t, p, toks[:8])
	if hit != 8 {
		t.Fatalf("hit %d, want 8", hit)
	}
	wantTable(t, p, b, 0, p.PageTable(a, 0)[:2]...) // shared pages
	wantTable(t, p, b, 1, no, no)
	st, _ := p.PageBytes(1, p.StatePage(b, 1))
	if string(st) != "state-after-8tok" {
		t.Fatalf("restored state %q", st)
	}
	s := p.Stats()
	if s.PrefixQueries != 2 || s.PrefixHitTokens != 8 || s.CachedBlocks != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestTruncate(t *testing.T) {
	p := newPool(t, 64, 256, full("kv", 4))
	toks := seqTokens(1, 12)
	a, _ := open(t, p, nil)
	reserve(t, p, a, 10)
	wantTable(t, p, a, 0, pg(0, 0), pg(0, 1), pg(0, 2))
	if err := p.Truncate(a, 3); err != nil { // 7 tokens: block 2 released
		t.Fatal(err)
	}
	wantTable(t, p, a, 0, pg(0, 0), pg(0, 1))
	reserve(t, p, a, 5) // 12 tokens: block 2 reallocated
	wantTable(t, p, a, 0, pg(0, 0), pg(0, 1), pg(0, 2))
	data, _ := p.PageBytes(0, pg(0, 1))
	copy(data, "blk1")
	if err := p.Commit(a, toks); err != nil {
		t.Fatal(err)
	}
	// Cutting into committed block 1 gives the sequence a private copy; the cache keeps 0:1.
	if err := p.Truncate(a, 6); err != nil {
		t.Fatal(err)
	}
	wantTable(t, p, a, 0, pg(0, 0), pg(0, 3))
	cp, _ := p.PageBytes(0, pg(0, 3))
	if string(cp[:4]) != "blk1" {
		t.Fatalf("private copy holds %q", cp[:4])
	}
	if got := p.Lookup(toks); got != 12 {
		t.Fatalf("cache after truncate serves %d tokens, want 12", got)
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	if err := p.Truncate(a, 7); err == nil {
		t.Fatal("truncating more tokens than the sequence holds: no error")
	}
}

func TestEvictionOrder(t *testing.T) {
	// Two slabs of four pages. Two finished prompts of three blocks leave six cached pages.
	p := newPool(t, 64, 128, full("kv", 4))
	ta, tb := seqTokens(1000, 12), seqTokens(2000, 12)
	for _, toks := range [][]int32{ta, tb} {
		s, _ := open(t, p, nil)
		reserve(t, p, s, 12)
		if err := p.Commit(s, toks); err != nil {
			t.Fatal(err)
		}
		if err := p.Free(s); err != nil {
			t.Fatal(err)
		}
	}
	// a held 0:0 0:1 0:2, b held 0:3 1:0 1:1. LRU, oldest first: a2 a1 a0 b2 b1 b0.
	c, _ := open(t, p, nil)
	reserve(t, p, c, 16)
	// Two free pages (1:2 1:3), then a's tail block and its middle block are evicted.
	wantTable(t, p, c, 0, pg(1, 2), pg(1, 3), pg(0, 2), pg(0, 1))
	if got := p.Lookup(ta); got != 4 {
		t.Fatalf("a's prefix serves %d tokens, want 4 (its head block survives)", got)
	}
	if got := p.Lookup(tb); got != 12 {
		t.Fatalf("b's prefix serves %d tokens, want 12", got)
	}
	// Touching b (a hit) makes it recently used: the next eviction takes a's head block.
	d, hit := open(t, p, tb[:11])
	if hit != 8 {
		t.Fatalf("hit %d", hit)
	}
	_ = p.Free(d)
	e, _ := open(t, p, nil)
	reserve(t, p, e, 4)
	wantTable(t, p, e, 0, pg(0, 0))
	if got := p.Lookup(ta); got != 0 {
		t.Fatalf("a still serves %d tokens", got)
	}
	if st := p.Stats(); st.Evictions != 3 {
		t.Fatalf("evictions %d, want 3", st.Evictions)
	}
}

func TestReclaimPrefersSlabsThatEmpty(t *testing.T) {
	// kv pages are 16 bytes (8 per slab); recurrent states 64 bytes (2 per slab); 4 slabs.
	rec := GroupSpec{Name: "state", Kind: Recurrent, Layers: 1, BytesPerToken: 64, PageTokens: 4}
	p := newPool(t, 128, 512, full("kv", 4), rec)
	s1, _ := open(t, p, nil) // state 0:0
	reserve(t, p, s1, 32)    // kv fills slab 1
	_ = p.Commit(s1, seqTokens(1, 32))
	s2, _ := open(t, p, nil) // state 0:1
	reserve(t, p, s2, 16)    // kv 2:0..2:3
	_ = p.Commit(s2, seqTokens(500, 16))
	run, _ := open(t, p, nil) // state 3:0
	reserve(t, p, run, 4)     // kv 2:4, beside s2's blocks
	// s2 finishes first, so its cached blocks are the least recently used; then s1.
	_ = p.Free(s2)
	_ = p.Free(s1) // slab 0 (states) empties and returns to the pool
	for _, want := range []PageID{pg(3, 1), pg(0, 0), pg(0, 1)} {
		s, _ := open(t, p, nil)
		if got := p.StatePage(s, 1); got != want {
			t.Fatalf("state page %v, want %v", got, want)
		}
	}
	// No free slab is left and the state group has nothing cached: the pool reclaims slab 1,
	// whose pages are all evictable, rather than slab 2's older blocks, which could not
	// empty their slab beside the running sequence's page.
	w, _ := open(t, p, nil)
	if got := p.StatePage(w, 1); got != pg(1, 0) {
		t.Fatalf("state page %v, want 1:0", got)
	}
	// (A recurrent group without checkpoints serves no prefix, so count cached blocks.)
	st := p.Stats()
	if st.CachedBlocks != 4 || st.Groups[0].PagesCached != 4 || st.Evictions != 8 {
		t.Fatalf("after reclaim: %d cached blocks, %d cached kv pages, %d evictions; want 4, 4, 8",
			st.CachedBlocks, st.Groups[0].PagesCached, st.Evictions)
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestFreeAllLeavesPoolWhole(t *testing.T) {
	p := newPool(t, 64, 256, full("kv", 4))
	var seqs []SeqID
	for i := range 4 {
		s, _ := open(t, p, seqTokens(0, 8))
		reserve(t, p, s, 6+i)
		_ = p.Commit(s, seqTokens(0, 16))
		seqs = append(seqs, s)
	}
	for _, s := range seqs {
		if err := p.Free(s); err != nil {
			t.Fatal(err)
		}
	}
	if p.Whole() {
		t.Fatal("cached blocks should still hold slabs")
	}
	p.ClearCache()
	if !p.Whole() {
		t.Fatalf("pool not whole after clearing: %+v", p.Stats())
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestBadInput(t *testing.T) {
	kv := full("kv", 16)
	specs := []struct {
		name string
		cfg  Config
	}{
		{"no groups", Config{}},
		{"zero layers", Config{Groups: []GroupSpec{{Name: "kv", Kind: Full, BytesPerToken: 2, PageTokens: 16}}}},
		{"zero bytes", Config{Groups: []GroupSpec{{Name: "kv", Kind: Full, Layers: 1, PageTokens: 16}}}},
		{"zero page", Config{Groups: []GroupSpec{{Name: "kv", Kind: Full, Layers: 1, BytesPerToken: 2}}}},
		{"window below a page", Config{Groups: []GroupSpec{{Name: "swa", Kind: SlidingWindow, Layers: 1, BytesPerToken: 2, PageTokens: 16, Window: 8}}}},
		{"ratio not dividing", Config{Groups: []GroupSpec{{Name: "c", Kind: Compressed, Layers: 1, BytesPerToken: 2, PageTokens: 16, Ratio: 5}}}},
		{"mixed block sizes", Config{Groups: []GroupSpec{kv, full("kv2", 32)}}},
		{"duplicate names", Config{Groups: []GroupSpec{kv, kv}}},
		{"slab below a page", Config{Groups: []GroupSpec{kv}, SlabBytes: 32}},
		{"unnamed", Config{Groups: []GroupSpec{{Kind: Full, Layers: 1, BytesPerToken: 2, PageTokens: 16}}}},
	}
	arena, _ := NewHostArena(1 << 16)
	for _, tc := range specs {
		if _, err := New(tc.cfg, arena); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: error %v, want ErrInvalidSpec", tc.name, err)
		}
	}
	small, _ := NewHostArena(100)
	if _, err := New(Config{Groups: []GroupSpec{kv}, SlabBytes: 1024}, small); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("arena below a slab: %v", err)
	}
	if _, err := Size(Config{Groups: []GroupSpec{kv}, SlabBytes: 1024}, 512, 1); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("budget below a slab: %v", err)
	}

	p := newPool(t, 64, 128, full("kv", 4))
	if err := p.Reserve(7, 1); !errors.Is(err, ErrUnknownSeq) {
		t.Errorf("reserve on an unknown sequence: %v", err)
	}
	s, _ := open(t, p, nil)
	if err := p.Reserve(s, -1); err == nil {
		t.Error("negative reserve: no error")
	}
	if err := p.Free(s); err != nil {
		t.Fatal(err)
	}
	if err := p.Free(s); !errors.Is(err, ErrUnknownSeq) {
		t.Errorf("double free: %v", err)
	}
	if err := p.Truncate(s, 1); !errors.Is(err, ErrUnknownSeq) {
		t.Errorf("truncate after free: %v", err)
	}
	// Running out of pages is typed and atomic: a reservation that does not fit changes nothing.
	a, _ := open(t, p, nil)
	reserve(t, p, a, 20)
	b, _ := open(t, p, nil)
	if err := p.Reserve(b, 16); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("over-reserve: %v", err)
	}
	if p.Len(b) != 0 || len(p.PageTable(b, 0)) != 0 {
		t.Fatalf("failed reserve left len %d table %v", p.Len(b), p.PageTable(b, 0))
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	reserve(t, p, b, 12)
	if _, err := p.PageBytes(0, NoPage); err == nil {
		t.Error("bytes of NoPage: no error")
	}
}

func TestSize(t *testing.T) {
	kv := GroupSpec{Name: "kv", Kind: Full, Layers: 32, BytesPerToken: 2 * 8 * 128 * 2, PageTokens: 16} // 2 MiB pages
	sw := GroupSpec{Name: "swa", Kind: SlidingWindow, Layers: 8, BytesPerToken: 2 * 8 * 128 * 2, PageTokens: 16, Window: 4096}
	rec := GroupSpec{Name: "ssm", Kind: Recurrent, Layers: 24, BytesPerToken: 1 << 16, PageTokens: 16, Checkpoints: 2}
	cfg := Config{Groups: []GroupSpec{kv, sw, rec}}
	z, err := Size(cfg, 8<<30, 16)
	if err != nil {
		t.Fatal(err)
	}
	if z.ContextTokens <= 0 || slabsFor(cfg.Groups, z.Groups, z.ContextTokens, reach{chunk: 1}, 16) > z.Slabs ||
		slabsFor(cfg.Groups, z.Groups, z.ContextTokens+1, reach{chunk: 1}, 16) <= z.Slabs {
		t.Fatalf("context %d is not the largest that fits:\n%s", z.ContextTokens, z)
	}
	one, _ := Size(cfg, 8<<30, 1)
	if one.ContextTokens <= z.ContextTokens {
		t.Fatalf("one sequence reaches %d tokens, sixteen reach %d", one.ContextTokens, z.ContextTokens)
	}
	if _, err := Size(cfg, 2*z.SlabBytes, 1); !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("two slabs for three groups: %v", err)
	}
}

// With PackPages, a group out of free slots reuses the slot of an idle cached page on a
// slab where it has live pages before it takes a free slab: that slab cannot go to another
// group while the live page is there, so taking the free slab would leave the next group
// with nothing. Without it (the default) the free slab is taken and the cached page stays
// for a later hit.
func TestPackPagesReusesCachedSlotsBeforeAFreeSlab(t *testing.T) {
	for _, pack := range []bool{true, false} {
		st := GroupSpec{Name: "state", Kind: Recurrent, Layers: 1, BytesPerToken: 32, PageTokens: 4}
		p := newPool(t, 32, 96, GroupSpec{Name: "kv", Kind: Full, Layers: 1, BytesPerToken: 4, PageTokens: 4}, st) // kv: 2 pages a slab
		p.PackPages(pack)
		toks := seqTokens(1, 4)
		a, _ := open(t, p, nil) // state on slab 0
		reserve(t, p, a, 4)     // kv block 0 on slab 1
		if err := p.Commit(a, toks); err != nil {
			t.Fatal(err)
		}
		b, _ := open(t, p, seqTokens(50, 3)) // state on slab 2
		reserve(t, p, b, 4)                  // kv block 0 next to a's, on slab 1
		if err := p.Free(a); err != nil {    // slab 0 is free; a's kv block stays cached on slab 1
			t.Fatal(err)
		}
		reserve(t, p, b, 4) // kv block 1
		onSlab1 := p.PageTable(b, 0)[1].Slab() == 1
		cached := p.Stats().CachedBlocks
		_, _, err := p.Open(nil) // another sequence's state
		if pack && (!onSlab1 || err != nil || cached != 0) {
			t.Fatalf("packing: kv pages %s, open: %v, %d blocks cached; want block 1 on a's slot and room for the state", fmtTable(p.PageTable(b, 0)), err, cached)
		}
		if !pack && (onSlab1 || !errors.Is(err, ErrNoSpace) || cached != 1) {
			t.Fatalf("not packing: kv pages %s, open: %v, %d blocks cached; want block 1 on the free slab, a's block still cached and no room left", fmtTable(p.PageTable(b, 0)), err, cached)
		}
		if err := p.Check(); err != nil {
			t.Fatal(err)
		}
	}
}

// Size counts what a sequence really holds: a sliding window's pages for the window and
// the chunk it reserves (and the chunk in flight), a recurrent state's checkpoints beyond
// the quota while tokens are in flight, and the checkpoint a prefix hit restores from.
func TestSizeCountsChunksAndCheckpointsInFlight(t *testing.T) {
	sw := GroupSpec{Name: "swa", Kind: SlidingWindow, Layers: 1, BytesPerToken: 4, PageTokens: 4, Window: 8}
	rec := GroupSpec{Name: "state", Kind: Recurrent, Layers: 1, BytesPerToken: 16, PageTokens: 4, Checkpoints: 2}
	none := GroupSpec{Name: "bare", Kind: Recurrent, Layers: 1, BytesPerToken: 16, PageTokens: 4}
	for _, c := range []struct {
		chunk, inFlight int
		want            [3]int // pages per sequence: swa, state, bare
	}{
		{0, 0, [3]int{3, 4, 1}}, // window 7 back + the token; state, 2 checkpoints, the restore source
		{9, 0, [3]int{5, 4, 1}}, // 8+9-1 tokens from anywhere in a block
		{9, 4, [3]int{6, 5, 1}}, // and 4 in flight: one more block, one more checkpoint
		{9, 16, [3]int{9, 6, 1}},
	} {
		z, err := Size(Config{Groups: []GroupSpec{sw, rec, none}, ChunkTokens: c.chunk, InFlightTokens: c.inFlight}, 1<<20, 1)
		if err != nil {
			t.Fatal(err)
		}
		got := [3]int{z.Groups[0].PagesPerSeq, z.Groups[1].PagesPerSeq, z.Groups[2].PagesPerSeq}
		if got != c.want {
			t.Errorf("chunk %d, %d in flight: pages per sequence %v, want %v", c.chunk, c.inFlight, got, c.want)
		}
	}
	if _, err := Size(Config{Groups: []GroupSpec{sw}, ChunkTokens: -1}, 1<<20, 1); err == nil {
		t.Error("a negative chunk: no error")
	}
}
