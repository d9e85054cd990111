package kvslab

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// llamaKV is a Llama-3-8B-like full-attention group: 32 layers of 8 KV heads × 128 × bf16
// K and V, 16-token pages (1 MiB each).
var llamaKV = GroupSpec{Name: "kv", Kind: Full, Layers: 32, BytesPerToken: 2 * 8 * 128 * 2, PageTokens: 16}

func benchPool(b *testing.B, pages int, groups ...GroupSpec) *Pool {
	b.Helper()
	// Accounting only: a small arena object would do, but host arenas are real memory, so
	// benchmark pools use a sizing-only arena of the right size.
	p, err := New(Config{Groups: groups}, sizeArena(int64(pages)*groups[0].PageBytes()))
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// sizeArena is an Arena with a size and no memory, for benchmarks that only allocate pages.
type sizeArena int64

func (a sizeArena) Size() int64                  { return int64(a) }
func (a sizeArena) Copy(dst, src, n int64) error { return nil }

// BenchmarkReserveDecode: 256 running sequences each reserve one more token per step; one
// op is one Reserve. Sequences restart at 2,048 tokens.
func BenchmarkReserveDecode(b *testing.B) {
	p := benchPool(b, 256*128+64, llamaKV)
	seqs := make([]SeqID, 256)
	for i := range seqs {
		seqs[i], _, _ = p.Open(nil)
		if err := p.Reserve(seqs[i], 1+i*7); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := seqs[i&255]
		if p.Len(s) >= 2048 {
			_ = p.Free(s)
			s, _, _ = p.Open(nil)
			seqs[i&255] = s
		}
		if err := p.Reserve(s, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPromptAllocFree: open a sequence, reserve a 512-token prompt, free it.
func BenchmarkPromptAllocFree(b *testing.B) {
	p := benchPool(b, 4096, llamaKV)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s, _, err := p.Open(nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Reserve(s, 512); err != nil {
			b.Fatal(err)
		}
		_ = p.Free(s)
	}
}

// BenchmarkPrefixLookup: the longest-prefix lookup of a 2,048-token prompt (128 blocks)
// against a 4,096-page pool whose cache holds 32 such prompts sharing a 1,024-token head.
func BenchmarkPrefixLookup(b *testing.B) {
	p := benchPool(b, 4096, llamaKV)
	rng := rand.New(rand.NewPCG(1, 2))
	head := make([]int32, 1024)
	for i := range head {
		head[i] = rng.Int32N(32000)
	}
	var last []int32
	for range 32 {
		toks := append(append([]int32(nil), head...), make([]int32, 1024)...)
		for i := 1024; i < len(toks); i++ {
			toks[i] = rng.Int32N(32000)
		}
		s, _, _ := p.Open(nil)
		if err := p.Reserve(s, len(toks)); err != nil {
			b.Fatal(err)
		}
		_ = p.Commit(s, toks)
		_ = p.Free(s)
		last = toks
	}
	if got := p.Lookup(last); got != 2048 {
		b.Fatalf("lookup served %d tokens", got)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if p.Lookup(last) != 2048 {
			b.Fatal("miss")
		}
	}
}

// hybridGroups is a hybrid model in the spirit of Jamba/Qwen3-Next/Gemma-3: full-attention
// layers, sliding-window layers and linear-attention (recurrent) layers.
var hybridGroups = []GroupSpec{
	{Name: "full", Kind: Full, Layers: 8, BytesPerToken: 2 * 8 * 128 * 2, PageTokens: 16},
	{Name: "swa", Kind: SlidingWindow, Layers: 16, BytesPerToken: 2 * 8 * 128 * 2, PageTokens: 16, Window: 1024},
	{Name: "linear", Kind: Recurrent, Layers: 24, BytesPerToken: 16 * 128 * 128 * 2, PageTokens: 16, Checkpoints: 1},
}

// BenchmarkMixedUsableFraction admits sequences of random lengths (64 to 8,192 tokens) into
// one budget until the pool refuses one, then reports the fraction of the budget that holds
// live pages: for the unified pool, and for the same budget split up front per group in
// proportion to what a 2,048-token sequence needs (each group its own pool).
func BenchmarkMixedUsableFraction(b *testing.B) {
	const budget = 8 << 30
	var unified, static float64
	for i := 0; i < b.N; i++ {
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		lengths := make([]int, 4096)
		for j := range lengths {
			lengths[j] = 64 + rng.IntN(8192-64)
		}
		unified += fillFraction(b, budget, [][]GroupSpec{hybridGroups}, []int64{budget}, lengths)
		var shares []int64
		var total int64
		for _, g := range hybridGroups {
			total += int64(pagesFor(g, 2048, reach{chunk: 1})) * g.PageBytes()
		}
		var split [][]GroupSpec
		for _, g := range hybridGroups {
			split = append(split, []GroupSpec{g})
			shares = append(shares, budget*int64(pagesFor(g, 2048, reach{chunk: 1}))*g.PageBytes()/total)
		}
		static += fillFraction(b, budget, split, shares, lengths)
	}
	b.ReportMetric(unified/float64(b.N), "unified-usable")
	b.ReportMetric(static/float64(b.N), "static-usable")
}

// fillFraction opens sequences of the given lengths in every pool (one per group set) until
// one refuses, and returns the bytes of pages held over the whole budget.
func fillFraction(b *testing.B, budget int64, sets [][]GroupSpec, shares []int64, lengths []int) float64 {
	pools := make([]*Pool, len(sets))
	for i, groups := range sets {
		p, err := New(Config{Groups: groups}, sizeArena(shares[i]))
		if err != nil {
			b.Fatal(err)
		}
		pools[i] = p
	}
	for _, n := range lengths {
		ok := true
		for _, p := range pools {
			s, _, err := p.Open(nil)
			if err == nil {
				err = p.Reserve(s, n)
			}
			if errors.Is(err, ErrNoSpace) {
				ok = false
				break
			}
		}
		if !ok {
			break
		}
	}
	var held int64
	for _, p := range pools {
		for _, g := range p.Stats().Groups {
			held += int64(g.PagesUsed) * g.PageBytes
		}
	}
	return float64(held) / float64(budget)
}

// BenchmarkBlockHash hashes one 256-token block.
func BenchmarkBlockHash(b *testing.B) {
	toks := make([]int32, 256)
	for i := range toks {
		toks[i] = int32(i * 7919)
	}
	b.SetBytes(256 * 4)
	var h uint64
	for i := 0; i < b.N; i++ {
		h = BlockHash(h, toks)
	}
	if h == 0 {
		b.Fatal("zero hash")
	}
}
