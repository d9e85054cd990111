package kvslab

import (
	"slices"
	"strings"
	"testing"
)

// With DeferCopies, Truncate and Open record their copies instead of doing them: the
// destination pages stay untouched until the copies are executed with CopyPage, the
// sources are held until RetireCopies, and the result equals the pool's own copy.
func TestDeferredCopies(t *testing.T) {
	rec := GroupSpec{Name: "state", Kind: Recurrent, Layers: 1, BytesPerToken: 16, PageTokens: 4, Checkpoints: 4}
	p := newPool(t, 64, 1024, full("kv", 4), rec)
	p.DeferCopies(true)
	toks := seqTokens(7, 9)
	a, _ := open(t, p, nil)
	reserve(t, p, a, 9)
	kv1 := p.PageTable(a, 0)[1]
	ckpt := p.PageTable(a, 1)[1]
	page(t, p, 0, kv1, "kv-block-1")
	page(t, p, 1, ckpt, "state-after-8tok")
	if err := p.Commit(a, toks); err != nil {
		t.Fatal(err)
	}

	// A hit restores b's state from the checkpoint: recorded, not done.
	b, hit := open(t, p, toks[:8])
	if hit != 8 || p.PendingCopies() != 1 {
		t.Fatalf("hit %d, %d copies pending; want 8 and 1", hit, p.PendingCopies())
	}
	if got := read(t, p, 1, p.StatePage(b, 1)); strings.HasPrefix(got, "state-after-8tok") {
		t.Fatal("the state was copied at Open")
	}
	// Cutting a into its committed block 1 gives it a private copy: recorded too.
	if err := p.Truncate(a, 3); err != nil {
		t.Fatal(err)
	}
	priv := p.PageTable(a, 0)[1]
	if priv == kv1 {
		t.Fatal("truncate kept the shared page")
	}
	ops := p.TakeCopies(nil)
	want := []PageCopy{
		{Group: 1, Src: ckpt, Dst: p.StatePage(b, 1), Seq: b},
		{Group: 0, Src: kv1, Dst: priv, Seq: a},
	}
	if len(ops) != len(want) || ops[0] != want[0] || ops[1] != want[1] {
		t.Fatalf("copies %+v, want %+v", ops, want)
	}
	if err := p.Check(); err != nil {
		t.Fatalf("with copies taken: %v", err)
	}
	if more := p.TakeCopies(nil); len(more) != 0 {
		t.Fatalf("taken twice: %+v", more)
	}
	for _, c := range ops {
		if err := p.CopyPage(c.Group, c.Dst, c.Src); err != nil {
			t.Fatal(err)
		}
	}
	if got := read(t, p, 1, p.StatePage(b, 1)); !strings.HasPrefix(got, "state-after-8tok") {
		t.Fatalf("restored state %q", got)
	}
	if got := read(t, p, 0, priv); !strings.HasPrefix(got, "kv-block-1") {
		t.Fatalf("private copy %q", got)
	}
	// Until the copies are retired their sources stay held, even with every sequence
	// freed and the cache cleared.
	for _, s := range []SeqID{a, b} {
		if err := p.Free(s); err != nil {
			t.Fatal(err)
		}
	}
	p.ClearCache()
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.FreeSlabs == s.Slabs {
		t.Fatal("the copies' sources were freed before the copies were retired")
	}
	if err := p.RetireCopies(3); err == nil {
		t.Fatal("retiring more copies than were taken: no error")
	}
	if err := p.RetireCopies(2); err != nil {
		t.Fatal(err)
	}
	p.ClearCache()
	wantWhole(t, p)
}

// A copy that was taken and not retired (its step failed or never ran) is handed out
// again, before later ones; a copy not yet taken is forgotten when its sequence is freed,
// and the pool is whole again.
func TestReissueAndDropCopies(t *testing.T) {
	p := newPool(t, 64, 512, full("kv", 4))
	p.DeferCopies(true)
	toks := seqTokens(3, 8)
	a, _ := open(t, p, nil)
	reserve(t, p, a, 8)
	if err := p.Commit(a, toks); err != nil {
		t.Fatal(err)
	}
	b, _ := open(t, p, toks)
	if err := p.Truncate(a, 2); err != nil { // a copies block 1
		t.Fatal(err)
	}
	first := p.TakeCopies(nil)
	if err := p.Truncate(b, 3); err != nil { // b copies block 1 too
		t.Fatal(err)
	}
	p.ReissueCopies()
	again := p.TakeCopies(nil)
	if len(first) != 1 || len(again) != 2 || again[0] != first[0] || again[1].Seq != b {
		t.Fatalf("first %+v, reissued %+v", first, again)
	}
	p.ReissueCopies()
	if err := p.Free(b); err != nil { // b's copy was not taken since the reissue: dropped
		t.Fatal(err)
	}
	if p.PendingCopies() != 1 {
		t.Fatalf("%d copies pending after freeing b, want a's", p.PendingCopies())
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	if err := p.Free(a); err != nil {
		t.Fatal(err)
	}
	p.ClearCache()
	wantWhole(t, p)
}

func TestCopyPageBadInput(t *testing.T) {
	p := newPool(t, 64, 256, full("kv", 4))
	for _, c := range []struct {
		g        int
		dst, src PageID
	}{{1, pg(0, 0), pg(0, 1)}, {0, NoPage, pg(0, 1)}, {0, pg(0, 0), pg(9, 0)}, {0, pg(0, 99), pg(0, 0)}} {
		if err := p.CopyPage(c.g, c.dst, c.src); err == nil {
			t.Errorf("CopyPage(%d, %#x, %#x): no error", c.g, uint32(c.dst), uint32(c.src))
		}
	}
}

func page(t *testing.T, p *Pool, g int, id PageID, s string) {
	t.Helper()
	b, err := p.PageBytes(g, id)
	if err != nil {
		t.Fatal(err)
	}
	copy(b, s)
}

func read(t *testing.T, p *Pool, g int, id PageID) string {
	t.Helper()
	b, err := p.PageBytes(g, id)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func wantWhole(t *testing.T, p *Pool) {
	t.Helper()
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.FreeSlabs != s.Slabs || p.PendingCopies() != 0 {
		t.Fatalf("pool not whole: %+v, %d copies pending", s, p.PendingCopies())
	}
}

// A block committed after every group released its page (sliding windows only, the next
// step reserved before this one's commit) leaves no empty entry in the prefix cache.
func TestCommitAfterWindowReleaseCachesNothing(t *testing.T) {
	win := GroupSpec{Name: "swa", Kind: SlidingWindow, Layers: 1, BytesPerToken: 4, PageTokens: 4, Window: 4}
	p := newPool(t, 64, 512, win)
	toks := seqTokens(2, 16)
	a, _ := open(t, p, nil)
	reserve(t, p, a, 12)
	reserve(t, p, a, 4) // releases blocks 0 and 1 (the next token, 12, sees 9..12)
	if err := p.Commit(a, toks[:12]); err != nil {
		t.Fatal(err)
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.CachedBlocks != 1 {
		t.Fatalf("%d blocks cached, want block 2 only", s.CachedBlocks)
	}
}

// ReserveInFlight keeps the sliding-window blocks of the tokens still in flight until a
// later Reserve, after they were committed, releases them into the prefix cache.
func TestReserveInFlightKeepsUncommittedWindowBlocks(t *testing.T) {
	win := GroupSpec{Name: "swa", Kind: SlidingWindow, Layers: 1, BytesPerToken: 4, PageTokens: 4, Window: 4}
	p := newPool(t, 64, 512, win)
	toks := seqTokens(2, 20)
	a, _ := open(t, p, nil)
	reserve(t, p, a, 4)
	if err := p.Commit(a, toks[:4]); err != nil {
		t.Fatal(err)
	}
	reserve(t, p, a, 8)                                // tokens 4..11: a step in flight
	if err := p.ReserveInFlight(a, 4, 8); err != nil { // the next step, built while it runs
		t.Fatal(err)
	}
	// Reserve would release blocks 0 and 1 (behind token 12's window, 9..12); token 4,
	// the first in flight, still sees block 0, and blocks 1 and 2 are not committed.
	if tb := p.PageTable(a, 0); len(tb) != 4 || slices.Contains(tb, NoPage) {
		t.Fatalf("page table %s, want four pages", fmtTable(tb))
	}
	if err := p.Commit(a, toks[:12]); err != nil { // the step in flight finished
		t.Fatal(err)
	}
	if err := p.Reserve(a, 4); err != nil {
		t.Fatal(err)
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.CachedBlocks != 3 {
		t.Fatalf("%d blocks cached, want 0..2", s.CachedBlocks)
	}
	if err := p.ReserveInFlight(a, 1, 99); err == nil {
		t.Fatal("more tokens in flight than the sequence holds: no error")
	}
}

// DropCopies lets go of every pending copy's source, so that ClearCache empties the cache.
func TestDropCopies(t *testing.T) {
	rec := GroupSpec{Name: "state", Kind: Recurrent, Layers: 1, BytesPerToken: 16, PageTokens: 4, Checkpoints: 2}
	p := newPool(t, 64, 1024, full("kv", 4), rec)
	p.DeferCopies(true)
	toks := seqTokens(1, 9)
	a, _ := open(t, p, nil)
	reserve(t, p, a, 9)
	if err := p.Commit(a, toks); err != nil {
		t.Fatal(err)
	}
	b, _ := open(t, p, toks[:8])
	p.TakeCopies(nil) // b's restore is taken (its step runs), c's below is not
	c, _ := open(t, p, toks[:8])
	for _, s := range []SeqID{a, b} {
		if err := p.Free(s); err != nil {
			t.Fatal(err)
		}
	}
	if p.PendingCopies() != 2 {
		t.Fatalf("%d copies pending, want b's and c's", p.PendingCopies())
	}
	p.DropCopies()
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	if err := p.Free(c); err != nil {
		t.Fatal(err)
	}
	p.ClearCache()
	wantWhole(t, p)
}

// A taken copy whose sequence is freed before its step runs is not handed out again when
// that step fails (ReissueCopies): its destination went back to the pool with the
// sequence, and the next sequence opened there may hold the very same page. Retiring it
// instead (the step ran) lets go of its source as for any copy.
func TestReissueDropsCopiesOfFreedSequences(t *testing.T) {
	rec := GroupSpec{Name: "state", Kind: Recurrent, Layers: 1, BytesPerToken: 16, PageTokens: 4, Checkpoints: 2}
	for _, ran := range []bool{false, true} {
		p := newPool(t, 64, 1024, full("kv", 4), rec)
		p.DeferCopies(true)
		toks := seqTokens(1, 9)
		a, _ := open(t, p, nil)
		reserve(t, p, a, 9)
		if err := p.Commit(a, toks); err != nil {
			t.Fatal(err)
		}
		if err := p.Free(a); err != nil {
			t.Fatal(err)
		}
		b, _ := open(t, p, toks[:8])
		taken := p.TakeCopies(nil)
		if len(taken) != 1 || taken[0].Seq != b {
			t.Fatalf("copies %+v, want b's restore", taken)
		}
		if err := p.Free(b); err != nil { // aborted while its step is out
			t.Fatal(err)
		}
		c, _ := open(t, p, nil) // reuses b's slot and its state page
		if c != b || p.StatePage(c, 1) != taken[0].Dst {
			t.Fatalf("sequence %d has state %#x; the case needs b's slot %d and page %#x", c, uint32(p.StatePage(c, 1)), b, uint32(taken[0].Dst))
		}
		if err := p.Check(); err != nil {
			t.Fatal(err)
		}
		if ran {
			if err := p.RetireCopies(1); err != nil {
				t.Fatal(err)
			}
		} else {
			p.ReissueCopies()
			if again := p.TakeCopies(nil); len(again) != 0 {
				t.Fatalf("reissued %+v for a freed sequence", again)
			}
		}
		if err := p.Check(); err != nil {
			t.Fatal(err)
		}
		if err := p.Free(c); err != nil {
			t.Fatal(err)
		}
		p.ClearCache()
		wantWhole(t, p)
	}
}
