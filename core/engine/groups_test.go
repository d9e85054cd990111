package engine_test

import (
	"context"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// TestPlanCoversEveryCacheKind schedules requests over a pool with a full, a sliding
// window, a compressed and a recurrent group, and checks each group's view of every plan:
// slots agree with the page tables, windows keep the pages their tokens need, recurrent
// sequences have a state page.
func TestPlanCoversEveryCacheKind(t *testing.T) {
	const bt = 8
	groups := []kvslab.GroupSpec{
		{Name: "full", Kind: kvslab.Full, Layers: 2, BytesPerToken: 4, PageTokens: bt},
		{Name: "swa", Kind: kvslab.SlidingWindow, Layers: 1, BytesPerToken: 4, PageTokens: bt, Window: 12},
		{Name: "csa", Kind: kvslab.Compressed, Layers: 1, BytesPerToken: 8, PageTokens: bt, Ratio: 4},
		{Name: "state", Kind: kvslab.Recurrent, Layers: 1, BytesPerToken: 64, PageTokens: bt, Checkpoints: 2},
	}
	pool, err := engine.NewHostPool(groups, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	model := &standIn{}
	info := model.Info()
	info.CacheGroups = groups
	s, err := engine.NewScheduler(info, engine.Config{Pool: pool, MaxBatchTokens: 24})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := s.Add(engine.Request{ID: string(rune('a' + i)), Prompt: prompt(i, 10+9*i), Sampling: engine.SamplingParams{MaxTokens: 20}}, &recorder{}); err != nil {
			t.Fatal(err)
		}
	}
	steps := 0
	for p := s.Schedule(); p != nil; p = s.Schedule() {
		steps++
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
		if len(p.Groups) != 4 {
			t.Fatalf("%d groups", len(p.Groups))
		}
		for i := 0; i < p.NumSeqs(); i++ {
			_, pos := p.Seq(i)
			q0 := int(p.QueryStart[i])
			for g, spec := range groups {
				table := p.PageTableOf(g, i)
				for j, at := range pos {
					slot := p.Groups[g].SlotMapping[q0+j]
					switch spec.Kind {
					case kvslab.Full, kvslab.SlidingWindow:
						want := int64(table[int(at)/bt])*bt + int64(int(at)%bt)
						if table[int(at)/bt] == kvslab.NoPage || slot != want {
							t.Fatalf("%s: token at %d has slot %d, want %d", spec.Name, at, slot, want)
						}
					case kvslab.Compressed:
						want := int64(table[int(at)/bt])*(bt/4) + int64(int(at)%bt/4)
						if slot != want {
							t.Fatalf("%s: token at %d has slot %d, want %d", spec.Name, at, slot, want)
						}
					case kvslab.Recurrent:
						if slot != engine.NoSlot {
							t.Fatalf("recurrent slot %d", slot)
						}
					}
				}
				if spec.Kind == kvslab.SlidingWindow {
					// Every block the first token's window reaches holds a page.
					first := max(0, int(pos[0])-spec.Window+1)
					for b := first / bt; b <= int(pos[len(pos)-1])/bt; b++ {
						if table[b] == kvslab.NoPage {
							t.Fatalf("window block %d of a token at %d has no page", b, pos[0])
						}
					}
				}
				if spec.Kind == kvslab.Recurrent {
					if len(p.Groups[g].StatePage) != p.NumSeqs() || p.Groups[g].StatePage[i] == kvslab.NoPage {
						t.Fatalf("recurrent state pages %v", p.Groups[g].StatePage)
					}
				} else if len(p.Groups[g].StatePage) != 0 {
					t.Fatalf("%s has state pages", spec.Name)
				}
			}
		}
		res, err := model.Execute(context.Background(), p)
		if err := s.Update(p, res, err); err != nil {
			t.Fatal(err)
		}
		if err := s.CheckBookkeeping(); err != nil {
			t.Fatal(err)
		}
	}
	if c := s.Counters(); c.Finished[engine.FinishLength] != 5 {
		t.Fatalf("finishes %v after %d steps", c.Finished, steps)
	}
	if err := pool.Check(); err != nil {
		t.Fatal(err)
	}
	pool.ClearCache()
	if !pool.Whole() {
		t.Fatal("pool not whole")
	}
}
