package deepseekv4flash

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// pagedSeq is one sequence driven through a runner's pool by hand.
type pagedSeq struct {
	id       kvslab.SeqID
	toks     []int32
	computed int
}

// pagedPlan reserves and builds the plan feeding n[i] more tokens of seqs[i], with logits
// for every row (the fields the runner's forward reads: tokens, positions, page tables and
// state pages).
func pagedPlan(t testing.TB, pool *kvslab.Pool, seqs []*pagedSeq, n []int) *engine.BatchPlan {
	t.Helper()
	specs := pool.Groups()
	p := &engine.BatchPlan{QueryStart: []int32{0}, Groups: make([]engine.GroupPlan, len(specs))}
	for g := range specs {
		p.Groups[g].PageTableStart = []int32{0}
	}
	for i, s := range seqs {
		if err := pool.Reserve(s.id, n[i]); err != nil {
			t.Fatal(err)
		}
		p.ReqIDs = append(p.ReqIDs, uint64(i+1))
		p.Computed = append(p.Computed, int32(s.computed))
		for j := range n[i] {
			p.Tokens = append(p.Tokens, s.toks[s.computed+j])
			p.Positions = append(p.Positions, int32(s.computed+j))
			p.LogitsIndices = append(p.LogitsIndices, int32(len(p.Tokens)-1))
		}
		for g, spec := range specs {
			gp := &p.Groups[g]
			gp.PageTable = append(gp.PageTable, pool.PageTable(s.id, g)...)
			gp.PageTableStart = append(gp.PageTableStart, int32(len(gp.PageTable)))
			if spec.Kind == kvslab.Recurrent {
				gp.StatePage = append(gp.StatePage, pool.StatePage(s.id, g))
			}
		}
		p.QueryStart = append(p.QueryStart, int32(len(p.Tokens)))
		s.computed += n[i]
	}
	return p
}

// TestPagedStateParity runs a golden checkpoint through the runner's kvslab-backed state
// (8-token pages, so sliding-window pages are released and compressed entries span
// pages): in chunks and decode steps, two sequences at once, and a third sequence that
// resumes from the prefix cache (the recurrent checkpoint restores the compressors'
// buffers) — all within parityTol of transformers.
func TestPagedStateParity(t *testing.T) {
	dir := filepath.Join("testdata", "parity", "module")
	golden := filepath.Join(dir, "logits.safetensors")
	if _, err := os.Stat(golden); err != nil {
		t.Skipf("no golden %s: make it with `%s`", golden, parityCommand)
	}
	m := loadParityModel(t, dir)
	toks, want, _ := readParityGolden(t, golden, m.Config.VocabSize)
	v := m.Config.VocabSize
	m.MinTopKMargin = math.Inf(1)
	r := NewRunner(m, 8)
	pool, err := r.NewPool(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("block of %d tokens; groups %+v", pool.BlockTokens(), pool.Groups())
	check := func(what string, got, want []float32) {
		t.Helper()
		diff, at := runnertest.MaxAbsDiff(got, want)
		t.Logf("%-40s max |Δ| = %.3g", what, diff)
		if !(diff <= parityTol) {
			t.Errorf("%s: logits differ from transformers' by %.3g at row %d", what, diff, at/v)
		}
	}
	open := func(prefix []int32) *pagedSeq {
		id, hit, err := pool.Open(prefix)
		if err != nil {
			t.Fatal(err)
		}
		return &pagedSeq{id: id, toks: toks, computed: hit}
	}
	run := func(seqs []*pagedSeq, n []int) [][]float32 {
		p := pagedPlan(t, pool, seqs, n)
		logits := make([]float32, len(p.LogitsIndices)*v)
		if err := r.forward(p, logits); err != nil {
			t.Fatal(err)
		}
		var out [][]float32
		at := 0
		for _, k := range n {
			out = append(out, logits[at*v:(at+k)*v])
			at += k
		}
		return out
	}
	a, b := open(nil), open(nil)
	var gotA, gotB []float32
	for _, step := range [][2]int{{13, 5}, {30, 1}, {1, 1}, {1, 17}, {60, 40}, {95, 0}} {
		seqs, n := []*pagedSeq{a}, []int{step[0]}
		if step[1] > 0 {
			seqs, n = append(seqs, b), append(n, step[1])
		}
		out := run(seqs, n)
		gotA = append(gotA, out[0]...)
		if step[1] > 0 {
			gotB = append(gotB, out[1]...)
		}
	}
	check("first sequence, chunks and decode", gotA, want)
	check("second sequence, batched with it", gotB, want[:len(gotB)])
	if err := pool.Commit(a.id, toks); err != nil {
		t.Fatal(err)
	}
	c := open(toks[:150])
	if c.computed == 0 {
		t.Fatal("no prefix-cache hit for a sequence sharing 150 tokens with a committed one")
	}
	var gotC []float32
	for c.computed < len(toks) {
		gotC = append(gotC, run([]*pagedSeq{c}, []int{min(7, len(toks)-c.computed)})[0]...)
	}
	check("third sequence after a prefix hit", gotC, want[(len(toks)-len(gotC)/v)*v:])
	t.Logf("prefix hit of %d tokens", len(toks)-len(gotC)/v)
	// As in TestTransformersParity: a tie at an indexer cut leaves the pick to the order
	// of the tie-break, which could hide or fake a difference.
	t.Logf("smallest indexer top-k margin: %.3g", m.MinTopKMargin)
	if math.IsInf(m.MinTopKMargin, 1) || m.MinTopKMargin < 1e-5 {
		t.Errorf("indexer top-k margin %.3g: no cut seen, or a near tie at one", m.MinTopKMargin)
	}
	for _, s := range []*pagedSeq{a, b, c} {
		if err := pool.Free(s.id); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkDecodeStep measures the runner's forward on one decode step of 8 sequences with
// 64 tokens of context or more in the kvslab-backed state (conformance_test.go's
// BenchmarkExecute builds its plans with runnertest.Plan, which does not handle compressed
// and recurrent groups yet). The sequences start again from a 64-token prefill, untimed,
// before they would outgrow the model's context.
func BenchmarkDecodeStep(b *testing.B) {
	m := tinyModel(b)
	r := NewRunner(m, 8)
	pool, err := r.NewPool(64 << 20)
	if err != nil {
		b.Fatal(err)
	}
	toks := make([]int32, 4096)
	for i := range toks {
		toks[i] = int32((i*7 + 3) % m.Config.VocabSize)
	}
	v := m.Config.VocabSize
	pre, one := make([]int, 8), make([]int, 8)
	for j := range 8 {
		pre[j], one[j] = 64, 1
	}
	var seqs []*pagedSeq
	start := func() {
		for _, s := range seqs {
			if err := pool.Free(s.id); err != nil {
				b.Fatal(err)
			}
		}
		seqs = seqs[:0]
		for j := range 8 {
			id, _, err := pool.Open(nil)
			if err != nil {
				b.Fatal(err)
			}
			seqs = append(seqs, &pagedSeq{id: id, toks: toks[j*64:]})
		}
		p := pagedPlan(b, pool, seqs, pre)
		if err := r.forward(p, make([]float32, len(p.LogitsIndices)*v)); err != nil {
			b.Fatal(err)
		}
	}
	start()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if seqs[0].computed >= m.MaxContext() {
			start()
		}
		p := pagedPlan(b, pool, seqs, one)
		logits := make([]float32, len(p.LogitsIndices)*v)
		b.StartTimer()
		if err := r.forward(p, logits); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRealSizePool checks that the pool of DeepSeek-V4-Flash's own dimensions (the config
// defaults: 43 layers, head_dim 512, CSA every other layer at ratio 4 with a 128-wide
// indexer, HCA at ratio 128) can be laid out as NewPool lays it out (kvslab's default
// slab, DefaultSlabPages pages of the largest group, the recurrent state), with and
// without the MTP head, at the default and a larger block: a slab must hold no more pages
// of the smallest group (HCA's pooled keys) than a page id's slot addresses, as it did
// not for glm-5-flash, and 16 GiB must hold one sequence of the runner's default context.
// Sized, not allocated.
func TestRealSizePool(t *testing.T) {
	c, err := ParseConfig([]byte(`{"model_type": "deepseek_v4"}`))
	if err != nil {
		t.Fatal(err)
	}
	const budget = 16 << 30
	for _, pt := range []int{0, 1024} {
		for _, mtp := range []bool{false, true} {
			cfg := kvslab.Config{Groups: layout(c, PageTokens(c, pt), mtp).groups}
			z, err := kvslab.Size(cfg, budget, 1)
			if err != nil {
				t.Fatalf("page tokens %d, mtp %v: %v", pt, mtp, err)
			}
			for _, g := range z.Groups {
				if g.PagesPerSlab > kvslab.SlotMask+1 {
					t.Errorf("page tokens %d, mtp %v: group %s has %d pages a slab, more than a page id's %d slots", pt, mtp, g.Name, g.PagesPerSlab, kvslab.SlotMask+1)
				}
			}
			if n := budget / z.SlabBytes; n > kvslab.MaxSlabs {
				t.Errorf("page tokens %d, mtp %v: %d slabs, more than a page id addresses", pt, mtp, n)
			}
			if z.ContextTokens < 4096 {
				t.Errorf("page tokens %d, mtp %v: 16 GiB holds one sequence of %d tokens, want Load's default context 4096", pt, mtp, z.ContextTokens)
			}
			t.Logf("page tokens %d, mtp %v: %v", PageTokens(c, pt), mtp, z)
		}
	}
}
