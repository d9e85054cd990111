package glmdemo

import (
	"context"
	"fmt"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/engine/workload"
	"github.com/resin-llm/resin/core/kvslab"
)

// w1Shaped is W1's shape scaled down: a shared prefix, then requests of the prefix plus
// their own tokens, each generating a few tokens.
func w1Shaped(vocab, prefix, own, n int) [][]int32 {
	g := workload.NewSplitMix64(0)
	pre := make([]int32, prefix)
	for i := range pre {
		pre[i] = int32(g.Uniform(2, vocab-1))
	}
	var out [][]int32
	for range n {
		p := append([]int32(nil), pre...)
		for range own {
			p = append(p, int32(g.Uniform(2, vocab-1)))
		}
		out = append(out, p)
	}
	return out
}

// hitRate serves the prompts one after the other through an engine and returns the pool's
// prefix-hit rate (tokens served from the cache / tokens offered) and its stats.
func hitRate(t *testing.T, r engine.Runner, pool *kvslab.Pool, prompts [][]int32) (float64, kvslab.Stats) {
	t.Helper()
	e, err := engine.New(r, engine.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for i, p := range prompts {
		st, err := e.Submit(ctx, engine.Request{ID: fmt.Sprint(i), Prompt: p, Sampling: engine.SamplingParams{MaxTokens: 4, HasSeed: true}})
		if err != nil {
			t.Fatal(err)
		}
		for {
			ev, err := st.Recv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if ev.Finish != engine.FinishNone {
				break
			}
		}
	}
	s := pool.Stats()
	return float64(s.PrefixHitTokens) / float64(s.PrefixQueryTokens), s
}

// TestW1PrefixHitRate checks that the hybrid model (KDA state restored from block-end
// checkpoints) gets the same prefix-hit rate on a W1-shaped workload as a model with
// full attention only, on the same block size, with and without MTP drafts (whose runner
// also keeps the MTP layer's rows and the last hidden state in the pool), and logs them
// with the pools' memory.
func TestW1PrefixHitRate(t *testing.T) {
	const vocab, block = 96, 8
	prompts := w1Shaped(vocab, 64, 20, 12)
	r, pool := tinyTextRunner(t)
	glm, gs := hitRate(t, r, pool, prompts)
	full, err := enginetest.New(enginetest.Config{VocabSize: vocab, BlockTokens: block, MaxContext: 512})
	if err != nil {
		t.Fatal(err)
	}
	ref, fs := hitRate(t, full, full.Pool(), prompts)
	mr, mpool := mtpTextRunner(t, tinyTextModel(t), 2)
	mtp, ms := hitRate(t, mr, mpool, prompts)
	for name, s := range map[string]kvslab.Stats{"glm-demo": gs, "glm-demo with MTP drafts": ms, "full attention": fs} {
		var perBlock int64
		for _, g := range s.Groups {
			perBlock += g.PageBytes
			t.Logf("%s: group %s (%v), pages of %d bytes: %d cached (%d bytes), %d slabs lent (%d bytes)",
				name, g.Name, g.Kind, g.PageBytes, g.PagesCached, int64(g.PagesCached)*g.PageBytes, g.Slabs, g.Bytes)
		}
		t.Logf("%s: %d cached blocks, at most %d bytes each (a page per group), %d slabs of %d bytes", name, s.CachedBlocks, perBlock, s.Slabs, s.SlabBytes)
	}
	t.Logf("prefix-hit rate: glm-demo %.3f (with MTP drafts %.3f), full attention %.3f", glm, mtp, ref)
	if ref == 0 {
		t.Fatal("no prefix hits even with full attention: the workload does not exercise the prefix cache")
	}
	if glm != ref {
		t.Errorf("hybrid hit rate %.4f differs from full attention's %.4f", glm, ref)
	}
	if mtp != ref {
		t.Errorf("hybrid hit rate with MTP drafts %.4f differs from full attention's %.4f", mtp, ref)
	}
}
