package glmdemo

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
)

// mtpTextRunner is the tiny model (runner_test.go) behind a runner that drafts drafts
// tokens per step with its MTP layer.
func mtpTextRunner(t testing.TB, m *TextModel, drafts int) (*TextRunner, *kvslab.Pool) {
	t.Helper()
	r, err := NewMTPTextRunner(m, 8, 512, drafts)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := r.NewPool(16 << 20)
	if err != nil {
		t.Fatal(err)
	}
	return r, pool
}

// TestMTPRunnerConformance runs core/runnertest's suite on the drafting runner, whose
// Drafts check compares it with testRunner (no drafts), greedy and seeded, with one and
// three drafts per step; prefix hits resume the MTP layer from checkpointed hidden states.
func TestMTPRunnerConformance(t *testing.T) {
	for _, k := range []int{1, 3} {
		t.Run(fmt.Sprintf("drafts=%d", k), func(t *testing.T) {
			runnertest.Run(t, func(t testing.TB) (engine.Runner, *kvslab.Pool) { return mtpTextRunner(t, tinyTextModel(t), k) },
				runnertest.Options{MaxTokens: 12, Plain: testRunner})
		})
	}
}

// specPrompts are prompts of distinct lengths (forceDraft tells requests apart by them)
// whose prefills and decodes close pools (4 tokens) and blocks (8 tokens) at every offset.
func specPrompts(vocab int) [][]int32 {
	var ps [][]int32
	for i, n := range []int{5, 14, 22, 23, 31, 40} {
		ps = append(ps, runnertest.Prompt(n, vocab, 20+i))
	}
	return ps
}

// generateAll runs the prompts together through the engine on r and returns each output
// and the engine's counters.
func generateAll(t *testing.T, r engine.Runner, pool *kvslab.Pool, prompts [][]int32, sp engine.SamplingParams, budget int) ([]runnertest.Output, engine.Counters) {
	t.Helper()
	s := runnertest.New(t, func(testing.TB) (engine.Runner, *kvslab.Pool) { return r, pool }, runnertest.Options{})
	h := s.StartWith(t, r, pool, engine.Config{MaxBatchTokens: budget})
	outs := h.GenerateAll(t, prompts, sp)
	c := h.Counters()
	h.Stop(t)
	return outs, c
}

// TestMTPGreedyEqualsPlain checks through the real engine that decoding with 1, 2 or 3
// MTP drafts per step gives what decoding without them gives, token for token (log
// probabilities within 1e-5), for a mixed batch of prompts in chunked prefills: with the
// MTP layer's own drafts, and with drafts forced right but at every third position, so
// that drafts are accepted and rejected at every offset of the pools and blocks (a
// rejected draft's KDA states must come back exactly for the rest to agree). Seeded
// sampling at temperature 0.8 must agree too.
func TestMTPGreedyEqualsPlain(t *testing.T) {
	m := tinyTextModel(t)
	prompts := specPrompts(m.Config.VocabSize)
	greedy := engine.SamplingParams{MaxTokens: 20, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3}
	seeded := engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true, Temperature: 0.8, Seed: 3, HasSeed: true}
	for _, sp := range []engine.SamplingParams{greedy, seeded} {
		for _, budget := range []int{0, 13} {
			plain := NewTextRunner(m, 8, 512)
			pool, err := plain.NewPool(16 << 20)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := generateAll(t, plain, pool, prompts, sp, budget)
			full := map[int][]int32{}
			for i, p := range prompts {
				full[len(p)] = append(slices.Clone(p), want[i].Tokens...)
			}
			for _, tc := range []struct {
				drafts int
				forced bool
			}{{1, false}, {1, true}, {2, true}, {3, false}, {3, true}} {
				r, pool := mtpTextRunner(t, m, tc.drafts)
				if tc.forced {
					r.forceDraft = func(promptLen, pos, _ int, logits []float32) int32 {
						seq := full[promptLen]
						if pos >= len(seq) || pos%3 == 0 {
							return (int32(ref.Argmax(logits)) + 1) % int32(m.Config.VocabSize)
						}
						return seq[pos]
					}
				}
				got, c := generateAll(t, r, pool, prompts, sp, budget)
				what := fmt.Sprintf("T=%g budget %d drafts %d forced %v", sp.Temperature, budget, tc.drafts, tc.forced)
				for i := range prompts {
					if !slices.Equal(got[i].Tokens, want[i].Tokens) {
						t.Fatalf("%s: prompt of %d tokens: %v with MTP, %v without", what, len(prompts[i]), got[i].Tokens, want[i].Tokens)
					}
					for j, lp := range got[i].Logprobs {
						if d := float64(lp.Logprob - want[i].Logprobs[j].Logprob); d > 1e-5 || d < -1e-5 {
							t.Fatalf("%s: prompt %d token %d: logprob %g, want %g", what, i, j, lp.Logprob, want[i].Logprobs[j].Logprob)
						}
					}
				}
				if c.DraftsProposed == 0 || tc.forced && (c.DraftsAccepted == 0 || c.DraftsAccepted == c.DraftsProposed) {
					t.Errorf("%s: %d drafts, %d accepted", what, c.DraftsProposed, c.DraftsAccepted)
				}
				t.Logf("%s: %d drafts, %d accepted (%.0f%%)", what, c.DraftsProposed, c.DraftsAccepted, 100*float64(c.DraftsAccepted)/float64(max(c.DraftsProposed, 1)))
			}
		}
	}
}

// TestRejectedDraftRestoresState feeds a sequence right drafts then wrong ones and checks
// that after the verify step its state page (every KDA layer's conv history and recurrent
// state, and the last token's hidden state) is bit for bit what a twin sequence that
// decoded the accepted tokens one at a time holds, with the rejected drafts at every
// offset of a block, and that what the twins generate next agrees.
func TestRejectedDraftRestoresState(t *testing.T) {
	m := tinyTextModel(t)
	v := m.Config.VocabSize
	for _, tc := range []struct {
		prompt, drafts, good int
	}{{22, 1, 0}, {23, 1, 0}, {21, 3, 1}, {20, 3, 2}, {18, 2, 0}, {13, 3, 0}} {
		t.Run(fmt.Sprintf("prompt=%d drafts=%d good=%d", tc.prompt, tc.drafts, tc.good), func(t *testing.T) {
			ctx := t.Context()
			var rs [2]*TextRunner
			var pools [2]*kvslab.Pool
			var seqs [2]*runnertest.Seq
			for k := range rs {
				rs[k], pools[k] = mtpTextRunner(t, m, tc.drafts)
				seqs[k] = runnertest.OpenSeq(t, pools[k], runnertest.Prompt(tc.prompt, v, 50))
			}
			step := func(k, n int) []int32 {
				t.Helper()
				res, err := rs[k].Execute(ctx, runnertest.Plan(t, pools[k], seqs[k:k+1], []int{n}, false))
				if err != nil {
					t.Fatal(err)
				}
				got := slices.Clone(res.Tokens)
				runnertest.Settle(t, pools[k], seqs[k], got)
				return got
			}
			for k := range rs {
				step(k, tc.prompt)
			}
			var want []int32
			for range tc.good + 1 {
				want = append(want, step(1, 1)...)
			}
			drafts := slices.Clone(want[:tc.good])
			for j := tc.good; j < tc.drafts; j++ {
				drafts = append(drafts, (want[tc.good]+1+int32(j))%int32(v))
			}
			seqs[0].Drafts = drafts
			if got := step(0, 1); !slices.Equal(got, want) {
				t.Fatalf("verify step of drafts %v accepted %v, want %v", drafts, got, want)
			}
			if seqs[0].Computed != seqs[1].Computed {
				t.Fatalf("lengths %d and %d", seqs[0].Computed, seqs[1].Computed)
			}
			var pages [2][]float32
			for k := range rs {
				pages[k] = slices.Clone(rs[k].kv.statePage(pools[k].StatePage(seqs[k].ID, rs[k].kv.L.kda)))
			}
			if d, at := runnertest.MaxAbsDiff(pages[0], pages[1]); d != 0 {
				t.Fatalf("state page differs by %g at float %d of %d (KDA states end at %d)", d, at, len(pages[0]), rs[0].kv.L.hiddenOff)
			}
			for range 4 {
				a, b := step(0, 1), step(1, 1)
				if !slices.Equal(a, b) {
					t.Fatalf("after the rollback: %v, twin %v", a, b)
				}
			}
		})
	}
}

// TestMTPDraftsMatchReference checks the first draft of every step the runner proposes
// through the engine (chunked prefills beside decodes, rejected drafts rolled back, a
// second request that resumes from the prefix cache and reads the hidden state
// checkpointed at the hit's block end) against the MTP layer run in Go memory over the
// whole sequence: the draft for position q comes from the MTP logits of row q−2 (hidden
// state at q−2, token q−1), within 1e-4.
func TestMTPDraftsMatchReference(t *testing.T) {
	m := tinyTextModel(t)
	V, D := m.Config.VocabSize, m.Config.HiddenSize
	base := runnertest.Prompt(35, V, 9)
	prompts := [][]int32{base, append(slices.Clone(base[:33]), 7, 8, 9, 10)}
	type draftAt struct{ promptLen, pos int }
	for _, drafts := range []int{1, 3} {
		r, pool := mtpTextRunner(t, m, drafts)
		seen := map[draftAt][]float32{}
		r.forceDraft = func(promptLen, pos, j int, logits []float32) int32 {
			if j == 0 {
				seen[draftAt{promptLen, pos}] = slices.Clone(logits)
			}
			return int32(ref.Argmax(logits))
		}
		sp := engine.SamplingParams{MaxTokens: 10, IgnoreEOS: true}
		var outs []runnertest.Output
		s := runnertest.New(t, func(testing.TB) (engine.Runner, *kvslab.Pool) { return r, pool }, runnertest.Options{})
		h := s.StartWith(t, r, pool, engine.Config{MaxBatchTokens: 12})
		for _, p := range prompts { // one after the other: the second hits the cache
			outs = append(outs, h.Generate(t, p, sp))
		}
		hit := pool.Stats().PrefixHitTokens
		h.Stop(t)
		if hit < 32 {
			t.Fatalf("drafts %d: the second request hit %d prompt tokens in the cache, want 32", drafts, hit)
		}
		checked := 0
		for i, p := range prompts {
			seq := append(slices.Clone(p), outs[i].Tokens...)
			_, hidden, err := m.ForwardHidden([]TextChunk{{State: m.NewTextState(), Tokens: seq}})
			if err != nil {
				t.Fatal(err)
			}
			n := len(seq) - 1
			ref := mtpSplits(t, m, hidden[:n*D], seq[1:], n)
			for at, got := range seen {
				if at.promptLen != len(p) || at.pos-2 >= n {
					continue
				}
				row := at.pos - 2
				if d, _ := runnertest.MaxAbsDiff(got, ref[row*V:(row+1)*V]); !(d <= 1e-4) {
					t.Errorf("drafts %d, prompt %d: draft for position %d differs from the reference by %g", drafts, i, at.pos, d)
				}
				checked++
			}
		}
		if checked < 10 {
			t.Errorf("drafts %d: only %d drafts checked", drafts, checked)
		}
		t.Logf("drafts %d: %d first drafts match the reference MTP logits", drafts, checked)
	}
}

// TestOpenSpeculative opens the golden checkpoint (with its MTP layer) drafting two tokens
// per step, and refuses drafts, naming the MTP layer, for one without it.
func TestOpenSpeculative(t *testing.T) {
	src := filepath.Join("testdata", "parity", "module")
	ts, cfg := goldenTensors(t, src) // skips without the goldens
	r, pool, err := OpenSpeculative(src, 16<<20, 2)
	if err != nil {
		t.Fatal(err)
	}
	if r.Info().MaxDrafts != 2 || pool == nil {
		t.Fatalf("MaxDrafts %d", r.Info().MaxDrafts)
	}
	noMTP := map[string]weights.Tensor{}
	for n, x := range ts {
		if !mtpTensor(n, 6) {
			noMTP[n] = x
		}
	}
	r, pool, err = OpenSpeculative(writeCheckpoint(t, noMTP, cfg), 16<<20, 2)
	if !errors.Is(err, ErrNoMTP) || r != nil || pool != nil {
		t.Fatalf("without the MTP layer: %v, %v, %v; want ErrNoMTP", r, pool, err)
	}
	if r, _, err := OpenSpeculative(writeCheckpoint(t, noMTP, cfg), 16<<20, 0); err != nil || r.Info().MaxDrafts != 0 {
		t.Fatalf("without drafts: %v", err)
	}
}

// TestMTPPreemption runs the prompts in a pool too small for all of them, so that the
// engine preempts sequences (freeing their pages, recomputing them later, their MTP rows
// and kept hidden states included) while they draft, and checks the output equals
// decoding without drafts.
func TestMTPPreemption(t *testing.T) {
	m := tinyTextModel(t)
	prompts := specPrompts(m.Config.VocabSize)
	sp := engine.SamplingParams{MaxTokens: 20, IgnoreEOS: true}
	run := func(r *TextRunner, slabs int64) ([]runnertest.Output, engine.Counters) {
		groups := r.CacheGroups()
		probe, err := engine.NewHostPool(groups, 64<<20)
		if err != nil {
			t.Fatal(err)
		}
		pool, err := engine.NewHostPool(groups, slabs*probe.SlabBytes())
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Bind(pool); err != nil {
			t.Fatal(err)
		}
		return generateAll(t, r, pool, prompts, sp, 0)
	}
	const slabs = 3
	want, pc := run(NewTextRunner(m, 8, 512), slabs)
	full := map[int][]int32{}
	for i, p := range prompts {
		full[len(p)] = append(slices.Clone(p), want[i].Tokens...)
	}
	r, _ := mtpTextRunner(t, m, 2)
	r.forceDraft = func(promptLen, pos, _ int, logits []float32) int32 {
		if seq := full[promptLen]; pos < len(seq) && pos%2 == 0 {
			return seq[pos]
		}
		return (int32(ref.Argmax(logits)) + 1) % int32(m.Config.VocabSize)
	}
	got, c := run(r, slabs)
	if c.Preemptions == 0 {
		t.Fatalf("no preemption in a pool of %d slabs (plain run: %d)", slabs, pc.Preemptions)
	}
	for i := range prompts {
		if !slices.Equal(got[i].Tokens, want[i].Tokens) {
			t.Fatalf("prompt %d: %v with MTP, %v without", i, got[i].Tokens, want[i].Tokens)
		}
	}
	t.Logf("%d preemptions (plain %d), %d drafts, %d accepted", c.Preemptions, pc.Preemptions, c.DraftsProposed, c.DraftsAccepted)
}

// TestMTPChainedDraftsMatchReference checks every draft of a runner with 3 drafts per step
// against the MTP layer chained in Go memory: for a sequence of length end (its last token
// sampled at position end), draft 0 comes from the MTP row at end−1 (final hidden state
// at end−1, the sampled token), and draft j from the row at end−1+j over the MTP layer's
// own output of the row before and draft j−1; logits within 1e-4.
func TestMTPChainedDraftsMatchReference(t *testing.T) {
	m := tinyTextModel(t)
	V, D := m.Config.VocabSize, m.Config.HiddenSize
	prompt := runnertest.Prompt(19, V, 4)
	r, pool := mtpTextRunner(t, m, 3)
	type draft struct {
		logits []float32
		tok    int32
	}
	steps := map[int][]draft{} // by end: drafts 0, 1, 2
	r.forceDraft = func(_, pos, j int, logits []float32) int32 {
		d := int32(ref.Argmax(logits))
		end := pos - 1 - j
		steps[end] = append(steps[end], draft{slices.Clone(logits), d})
		return d
	}
	outs, _ := generateAll(t, r, pool, [][]int32{prompt}, engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true}, 8)
	seq := append(slices.Clone(prompt), outs[0].Tokens...)
	_, hidden, err := m.ForwardHidden([]TextChunk{{State: m.NewTextState(), Tokens: seq}})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for end, ds := range steps {
		if end >= len(seq) || len(ds) != 3 {
			t.Fatalf("end %d: %d drafts recorded (sequence of %d)", end, len(ds), len(seq))
		}
		st := m.NewMTPState()
		if _, _, err := m.MTPForward([]MTPChunk{{State: st, Hidden: hidden[:(end-1)*D], Next: seq[1:end], Rows: []int{}}}); err != nil {
			t.Fatal(err)
		}
		h, next := hidden[(end-1)*D:end*D], seq[end]
		for j, d := range ds {
			lg, out, err := m.MTPForward([]MTPChunk{{State: st, Pos0: end - 1 + j, Hidden: h, Next: []int32{next}}})
			if err != nil {
				t.Fatal(err)
			}
			if diff, _ := runnertest.MaxAbsDiff(d.logits, lg); !(diff <= 1e-4) {
				t.Errorf("end %d draft %d: logits differ from the chained reference by %g", end, j, diff)
			}
			h, next = out, d.tok
			checked++
		}
	}
	if checked < 9 {
		t.Fatalf("only %d drafts checked", checked)
	}
	t.Logf("%d drafts of %d steps match the chained reference", checked, len(steps))
}

// TestMTPNaNDraftLogits checks that an MTP layer whose logits are all NaN (a broken
// checkpoint: here its shared_head.norm) does not fail the engine's step: the drafts it
// proposes must still be tokens of the vocabulary (ref.Argmax gives −1 for an all-NaN
// row, which the engine refuses for every sequence of the step), and the output is what
// the runner without drafts gives.
func TestMTPNaNDraftLogits(t *testing.T) {
	m := tinyTextModel(t)
	prompts := specPrompts(m.Config.VocabSize)[:3]
	sp := engine.SamplingParams{MaxTokens: 8, IgnoreEOS: true}
	plain := NewTextRunner(m, 8, 512)
	pool, err := plain.NewPool(16 << 20)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := generateAll(t, plain, pool, prompts, sp, 0)
	nan := *m
	w := *m.W
	mtp := *w.mtp
	mtp.norm = slices.Clone(mtp.norm)
	for i := range mtp.norm {
		mtp.norm[i] = float32(math.NaN())
	}
	w.mtp = &mtp
	nan.W = &w
	r, pool := mtpTextRunner(t, &nan, 2)
	got, c := generateAll(t, r, pool, prompts, sp, 0)
	for i := range prompts {
		if !slices.Equal(got[i].Tokens, want[i].Tokens) {
			t.Fatalf("prompt %d: %v with NaN drafts, %v without drafts", i, got[i].Tokens, want[i].Tokens)
		}
	}
	if c.DraftsProposed == 0 {
		t.Error("no drafts proposed")
	}
}
