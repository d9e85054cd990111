package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/kvslab"
)

// A max_tokens so large that prompt + max tokens overflows int must be refused as too
// long, not wrap around to a negative end and stop after one token.
func TestHugeMaxTokensIsContextTooLong(t *testing.T) {
	h := start(t, enginetest.Config{}, engine.Config{})
	for _, n := range []int{math.MaxInt, math.MaxInt - 2} {
		_, err := h.e.Submit(context.Background(), engine.Request{Prompt: prompt(1, 3), Sampling: engine.SamplingParams{MaxTokens: n}})
		if !errors.Is(err, engine.ErrContextTooLong) {
			t.Errorf("max tokens %d: Submit error %v, want ErrContextTooLong", n, err)
		}
	}
}

// A top-k beyond int32 (or beyond the vocabulary) keeps every token, as top-k = vocabulary
// does; it must neither be refused by the plan check nor fail the other requests of the
// step.
func TestHugeTopKIsOff(t *testing.T) {
	h := start(t, enginetest.Config{}, engine.Config{})
	ctx := context.Background()
	big, err := h.e.Submit(ctx, engine.Request{Prompt: prompt(1, 5), Sampling: engine.SamplingParams{MaxTokens: 4, TopK: 1<<31 + 5, Temperature: 1}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := h.e.Submit(ctx, engine.Request{Prompt: prompt(2, 5), Sampling: engine.SamplingParams{MaxTokens: 4}})
	if err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]*engine.Stream{"huge top-k": big, "neighbour": other} {
		toks, ev, err := st.Collect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Finish != engine.FinishLength || len(toks) != 4 {
			t.Errorf("%s: finish %v (%v) after %d tokens, want length after 4", name, ev.Finish, ev.Err, len(toks))
		}
	}
}

// Limits far beyond any step are refused with an error; the plans are sized by them, so
// taking them would die of out-of-memory.
func TestHugeLimitsAreRefused(t *testing.T) {
	r, err := enginetest.New(enginetest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []engine.Config{{MaxBatchTokens: 100_000_000_000}, {MaxSeqs: 1_000_000_000}} {
		cfg.Pool = r.Pool()
		if _, err := engine.New(r, cfg); err == nil {
			t.Errorf("%d batch tokens, %d sequences: accepted", cfg.MaxBatchTokens, cfg.MaxSeqs)
		}
	}
}

// A pool budget beyond what page ids address is refused before its arena is allocated
// (a petabyte would not be).
func TestHugePoolIsRefused(t *testing.T) {
	groups := []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 16, PageTokens: 16}}
	if _, err := engine.NewHostPool(groups, 1<<50); !errors.Is(err, kvslab.ErrInvalidSpec) {
		t.Errorf("NewHostPool of 1 PiB: %v, want ErrInvalidSpec", err)
	}
	if _, err := enginetest.New(enginetest.Config{Pages: 1 << 40}); err == nil {
		t.Error("enginetest.New with 2^40 pages: no error")
	}
}

// A runner whose maximum context cannot hold a prompt token and a generated token is
// refused with an error that says why and what to set instead.
func TestTinyMaxContextIsExplained(t *testing.T) {
	for _, n := range []int{1, 0, -5} {
		info := engine.RunnerInfo{Name: "tiny", VocabSize: 8, MaxContext: n,
			CacheGroups: []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 16, PageTokens: 16}}}
		_, err := engine.NewScheduler(info, engine.Config{})
		if err == nil {
			t.Fatalf("maximum context %d: accepted", n)
		}
		for _, want := range []string{fmt.Sprintf("maximum context %d", n), "one prompt token and one generated token", "at least 2", "max_position_embeddings"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("maximum context %d: error %q does not say %q", n, err, want)
			}
		}
	}
}

// The default pool of a runner with small slabs (4 KiB: 65,536 of them in 256 MiB, one
// more than a page id addresses) is cut to the slabs a page id addresses, as kvslab.Size
// counts the same budget, instead of refused.
func TestDefaultPoolOfSmallSlabsIsClamped(t *testing.T) {
	groups := []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 16, PageTokens: 16}}
	z, err := kvslab.Size(kvslab.Config{Groups: groups}, engine.DefaultCacheBytes, 1)
	if err != nil {
		t.Fatal(err)
	}
	if z.SlabBytes != 4096 {
		t.Fatalf("slab of %d bytes, the case needs 4096", z.SlabBytes)
	}
	pool, err := engine.NewHostPool(groups, 0)
	if err != nil {
		t.Fatalf("default pool: %v", err)
	}
	if pool.Slabs() != z.Slabs || pool.Slabs() != kvslab.MaxSlabs {
		t.Fatalf("%d slabs, kvslab.Size counts %d (at most %d)", pool.Slabs(), z.Slabs, kvslab.MaxSlabs)
	}
}
