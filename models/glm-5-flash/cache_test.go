package glm5flash

import (
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
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

// BenchmarkDecodeStep measures the runner's forward on one decode step of 8 sequences with
// 64 tokens of context in the kvslab-backed state (conformance_test.go's BenchmarkExecute
// builds its plans with runnertest.Plan, which does not handle compressed and recurrent
// groups yet).
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
	var seqs []*pagedSeq
	pre, one := make([]int, 8), make([]int, 8)
	for j := range 8 {
		id, _, err := pool.Open(nil)
		if err != nil {
			b.Fatal(err)
		}
		seqs = append(seqs, &pagedSeq{id: id, toks: toks[j*64:]})
		pre[j], one[j] = 64, 1
	}
	v := m.Config.VocabSize
	p := pagedPlan(b, pool, seqs, pre)
	if err := r.forward(p, make([]float32, len(p.LogitsIndices)*v)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		p := pagedPlan(b, pool, seqs, one)
		logits := make([]float32, len(p.LogitsIndices)*v)
		b.StartTimer()
		if err := r.forward(p, logits); err != nil {
			b.Fatal(err)
		}
	}
}
