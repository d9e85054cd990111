package deepseekv4flash

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"unsafe"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// mtpRunner is testRunner's model behind a runner that drafts with the MTP head, drafts
// tokens per step.
func mtpRunner(t testing.TB, drafts int) (*Runner, *kvslab.Pool) {
	t.Helper()
	r, err := NewMTPRunner(tinyModel(t), 8, drafts)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := r.NewPool(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	return r, pool
}

// TestMTPRunnerConformance runs core/runnertest's suite on the drafting runner, whose
// Drafts check compares it with testRunner (no drafts), with one and three drafts per
// step.
func TestMTPRunnerConformance(t *testing.T) {
	for _, k := range []int{1, 3} {
		t.Run(fmt.Sprintf("drafts=%d", k), func(t *testing.T) {
			runnertest.Run(t, func(t testing.TB) (engine.Runner, *kvslab.Pool) { return mtpRunner(t, k) },
				runnertest.Options{MaxTokens: 12, Plain: testRunner})
		})
	}
}

// specPrompts are prompts of distinct lengths (forceDraft tells requests apart by it)
// whose prefills and decodes close CSA (4) and HCA (8) windows and blocks (8 tokens) at
// every offset, inside and across steps.
func specPrompts(vocab int) [][]int32 {
	var ps [][]int32
	for i, n := range []int{5, 14, 22, 23, 31, 40} {
		ps = append(ps, runnertest.Prompt(n, vocab, 20+i))
	}
	return ps
}

// generate runs the prompts together through the engine on r and returns each output
// and the engine's counters, which its resin_spec_decode_* metrics must match.
func generate(t *testing.T, r *Runner, pool *kvslab.Pool, prompts [][]int32, sp engine.SamplingParams, budget int) ([]runnertest.Output, engine.Counters) {
	t.Helper()
	s := runnertest.New(t, func(testing.TB) (engine.Runner, *kvslab.Pool) { return r, pool }, runnertest.Options{})
	h := s.StartWith(t, r, pool, engine.Config{MaxBatchTokens: budget})
	outs := h.GenerateAll(t, prompts, sp)
	c := h.Counters()
	// The engine's metrics report what its counters hold.
	drafts := specMetric(t, h.Engine, "resin_spec_decode_draft_tokens_total")
	accepted := specMetric(t, h.Engine, "resin_spec_decode_accepted_tokens_total")
	if drafts != float64(c.DraftsProposed) || accepted != float64(c.DraftsAccepted) {
		t.Errorf("metrics: %g drafts, %g accepted; counters %d, %d", drafts, accepted, c.DraftsProposed, c.DraftsAccepted)
	}
	h.Stop(t)
	return outs, c
}

// TestMTPGreedyEqualsPlain checks through the real engine that decoding with MTP drafts
// gives what decoding without them gives, token for token (and log probabilities within
// 1e-5), for a mixed batch of prompts whose lengths put the drafts at every offset of
// the compression windows and blocks: with the MTP head's own drafts, and with drafts
// forced right except at every third position, so that drafts are accepted and rejected
// everywhere, window-closing positions and block ends included. Seeded sampling at
// temperature 0.8 must agree too.
func TestMTPGreedyEqualsPlain(t *testing.T) {
	m := tinyModel(t)
	prompts := specPrompts(m.Config.VocabSize)
	greedy := engine.SamplingParams{MaxTokens: 24, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3}
	seeded := engine.SamplingParams{MaxTokens: 16, IgnoreEOS: true, Temperature: 0.8, Seed: 3, HasSeed: true}
	for _, sp := range []engine.SamplingParams{greedy, seeded} {
		for _, budget := range []int{0, 13} {
			plainR := NewRunner(m, 8)
			pool, err := plainR.NewPool(8 << 20)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := generate(t, plainR, pool, prompts, sp, budget)
			// The whole sequences, for the forced drafts.
			full := map[int][]int32{}
			for i, p := range prompts {
				full[len(p)] = append(slices.Clone(p), want[i].Tokens...)
			}
			for _, tc := range []struct {
				drafts int
				forced bool
			}{{1, false}, {1, true}, {3, false}, {3, true}} {
				forced := tc.forced
				r, pool := mtpRunner(t, tc.drafts)
				if forced {
					r.forceDraft = forcedDraft(full, 3, m.Config.VocabSize)
				}
				got, c := generate(t, r, pool, prompts, sp, budget)
				what := fmt.Sprintf("T=%g budget %d drafts %d forced %v", sp.Temperature, budget, tc.drafts, forced)
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
				if c.DraftsProposed == 0 || forced && (c.DraftsAccepted == 0 || c.DraftsAccepted == c.DraftsProposed) {
					t.Errorf("%s: %d drafts, %d accepted", what, c.DraftsProposed, c.DraftsAccepted)
				}
				t.Logf("%s: %d drafts, %d accepted (%.0f%%)", what, c.DraftsProposed, c.DraftsAccepted, 100*float64(c.DraftsAccepted)/float64(max(c.DraftsProposed, 1)))
			}
		}
	}
}

// TestMTPDraftsMatchReference checks the drafts the runner proposes through the engine
// (chunked prefills mixed with decodes, rejected drafts rolled back, a prefix-cache hit
// whose first MTP row reads the streams checkpointed at the hit's block end) against the
// MTP head run in Go memory over the whole sequence, the path the transformers/vLLM
// parity test checks: the draft for position p comes from the MTP logits of row p−2
// (streams at p−2, token p−1), which must agree within 1e-5.
func TestMTPDraftsMatchReference(t *testing.T) {
	m := tinyModel(t)
	v := m.Config.VocabSize
	prefix := runnertest.Prompt(16, v, 40)
	prompts := [][]int32{
		append(slices.Clone(prefix), runnertest.Prompt(3, v, 41)...),
		runnertest.Prompt(11, v, 42),
		// After the first: a 2-block hit; its first draft row reads the MTP row of the
		// hit's last position, computed from the streams checkpointed there.
		append(slices.Clone(prefix), runnertest.Prompt(2, v, 43)...),
	}
	r, pool := mtpRunner(t, 1)
	type key struct{ promptLen, pos int }
	drafts := map[key][]float32{}
	r.forceDraft = func(promptLen, pos int, logits []float32) int32 {
		drafts[key{promptLen, pos}] = slices.Clone(logits)
		return int32(ref.Argmax(logits))
	}
	s := runnertest.New(t, func(testing.TB) (engine.Runner, *kvslab.Pool) { return r, pool }, runnertest.Options{})
	h := s.StartWith(t, r, pool, engine.Config{MaxBatchTokens: 7})
	sp := engine.SamplingParams{MaxTokens: 14, IgnoreEOS: true}
	outs := h.GenerateAll(t, prompts[:2], sp)
	hits := h.Counters().PrefixHits
	outs = append(outs, h.Generate(t, prompts[2], sp))
	if h.Counters().PrefixHits <= hits {
		t.Error("the third prompt got no prefix-cache hit")
	}
	h.Stop(t)
	checked, worst := 0, 0.0
	for i, p := range prompts {
		full := append(slices.Clone(p), outs[i].Tokens...)
		want := runMTP(t, m, full, []int{len(full)})
		for pos := len(p) + 1; pos < len(full); pos++ {
			got, ok := drafts[key{len(p), pos}]
			if !ok {
				if prev := drafts[key{len(p), pos - 1}]; prev == nil || int32(ref.Argmax(prev)) != full[pos-1] {
					t.Fatalf("prompt %d: no draft for position %d after a rejected one", i, pos)
				}
				continue // the previous draft was accepted: its step proposed for pos+1
			}
			d, _ := runnertest.MaxAbsDiff(got, want[(pos-2)*v:(pos-1)*v])
			if d > 1e-5 {
				t.Fatalf("prompt %d: the MTP logits for position %d differ from the reference by %g", i, pos, d)
			}
			worst = max(worst, d)
			checked++
		}
	}
	t.Logf("%d drafts' MTP logits match the reference head, max |Δ| %.3g", checked, worst)
}

// TestRejectedDraftRestoresEveryGroup feeds a draft that the runner must reject, at a
// position that closes a CSA window, an HCA window and a block (and, in the other cases,
// a CSA window only, or that opens a block; or three drafts of which the second or the
// third sits there), and, a window later, drafts it must accept. It compares the
// sequence's cache, every page of every group (sliding-window rows of every layer and
// the MTP block, CSA entries and indexer keys, HCA entries: the rows and entries of
// computed tokens; the compressors' buffers, MTP streams and checkpoints: the state
// pages whole), with a twin run that never saw the drafts; then both decode on and must
// give the same logits. The verify step computes the accepted rows in a batch of more
// rows than the twin's, which the tiny config's GEMMs (gonum's serial kernel, whose
// per-element sums do not depend on the number of rows) make bitwise equal: max |Δ| is
// 0 and the test allows 1e-6 for a GEMM that blocks by batch size.
func TestRejectedDraftRestoresEveryGroup(t *testing.T) {
	m := tinyModel(t)
	v := m.Config.VocabSize
	for _, tc := range []struct {
		name   string
		prompt int // the drafts sit at positions prompt+1...
		drafts int // how many, of which
		good   int // the first good are right
		ratio  int // the accepted drafts sit ratio positions after the rejected ones
	}{
		{"CSA and HCA windows and a block close", 22, 1, 0, 8},
		{"a CSA window closes", 18, 1, 0, 4},
		{"a block opens", 23, 1, 0, 8},
		{"3 drafts, the second closes everything", 21, 3, 1, 8},
		{"3 drafts, the third closes everything", 20, 3, 0, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			var rs [2]*Runner
			var pools [2]*kvslab.Pool
			var seqs [2]*runnertest.Seq
			var rows [2][][]float32
			for k := range rs {
				rs[k], pools[k] = mtpRunner(t, tc.drafts)
				seqs[k] = runnertest.OpenSeq(t, pools[k], runnertest.Prompt(tc.prompt, v, 50))
				rs[k].CaptureLogits(func(row cpurunner.LogitsRow) { rows[k] = append(rows[k], slices.Clone(row.Logits)) })
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
			// The twin decodes the next tokens plainly; the other feeds, after the same
			// token, good right drafts, then wrong ones.
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
			compareCaches(t, "after the rejected drafts", pools, seqs)
			// Then right drafts a window later: accepted, they leave what plain decodes
			// leave.
			for range tc.ratio - 1 {
				step(1, 1)
				step(0, 1)
			}
			want = want[:0]
			for range tc.drafts + 1 {
				want = append(want, step(1, 1)...)
			}
			seqs[0].Drafts = slices.Clone(want[:tc.drafts])
			if got := step(0, 1); !slices.Equal(got, want) {
				t.Fatalf("verify step accepted %v, want %v (the drafts accepted)", got, want)
			}
			compareCaches(t, "after the accepted drafts", pools, seqs)
			for range 3 {
				step(1, 1)
				step(0, 1)
			}
			compareCaches(t, "three decodes later", pools, seqs)
			if !slices.Equal(seqs[0].Tokens, seqs[1].Tokens) {
				t.Fatalf("tokens %v, the twin's %v", seqs[0].Tokens, seqs[1].Tokens)
			}
			// Every row gave the same logits (capturing leaves out the rejected draft's).
			a := rows[0]
			if len(a) != len(rows[1]) {
				t.Fatalf("%d logits rows, the twin %d", len(a), len(rows[1]))
			}
			worst := 0.0
			for j := range a {
				d, _ := runnertest.MaxAbsDiff(a[j], rows[1][j])
				worst = max(worst, d)
			}
			if worst > 1e-6 {
				t.Fatalf("logits differ from the twin's by %g", worst)
			}
			t.Logf("logits of %d rows: max |Δ| %g", len(a), worst)
		})
	}
}

// compareCaches compares, block by block, what the two sequences wrote in every page they
// hold in each group of their pools (sliding windows: those both still hold), and the
// recurrent groups' live state pages and checkpoints whole.
func compareCaches(t *testing.T, when string, pools [2]*kvslab.Pool, seqs [2]*runnertest.Seq) {
	t.Helper()
	worst, pages := 0.0, 0
	length := seqs[0].Computed
	if seqs[1].Computed != length {
		t.Fatalf("%s: %d tokens computed, the twin %d", when, length, seqs[1].Computed)
	}
	bt := pools[0].BlockTokens()
	cmp := func(what string, g, blk int, a, b kvslab.PageID) {
		spec := pools[0].Groups()[g]
		if spec.Kind == kvslab.SlidingWindow && (a == kvslab.NoPage || b == kvslab.NoPage) {
			// A window's pages behind it are let go at the next Reserve: a verify step's
			// one Reserve of two tokens can leave one that two plain steps released.
			return
		}
		if (a == kvslab.NoPage) != (b == kvslab.NoPage) {
			t.Fatalf("%s: %s: page %v, the twin's %v", when, what, a, b)
		}
		if a == kvslab.NoPage {
			return
		}
		fa, fb := pageFloats(t, pools[0], g, a), pageFloats(t, pools[1], g, b)
		if blk >= 0 && spec.Kind != kvslab.Recurrent {
			// Only the rows of computed tokens (entries of closed windows): a page the
			// pool hands out again keeps its former rows until they are written.
			fa, fb = written(spec, blk, bt, length, fa), written(spec, blk, bt, length, fb)
		}
		d, at := runnertest.MaxAbsDiff(fa, fb)
		if d > 1e-6 {
			t.Fatalf("%s: %s differs from the twin's by %g at float %d", when, what, d, at)
		}
		worst = max(worst, d)
		pages++
	}
	for g, spec := range pools[0].Groups() {
		ta, tb := pools[0].PageTable(seqs[0].ID, g), pools[1].PageTable(seqs[1].ID, g)
		if len(ta) != len(tb) {
			t.Fatalf("%s: group %s: %d blocks, the twin %d", when, spec.Name, len(ta), len(tb))
		}
		for b := range ta {
			cmp(fmt.Sprintf("group %s block %d", spec.Name, b), g, b, ta[b], tb[b])
		}
		if spec.Kind == kvslab.Recurrent {
			cmp(fmt.Sprintf("group %s live state", spec.Name), g, -1, pools[0].StatePage(seqs[0].ID, g), pools[1].StatePage(seqs[1].ID, g))
		}
	}
	t.Logf("%s: %d pages of %d groups, max |Δ| %g", when, pages, len(pools[0].Groups()), worst)
}

// written returns the floats of block blk's page (of a full, sliding-window or
// compressed group) that a sequence of length tokens has written: per layer, the rows of
// its tokens, or the entries of its closed windows.
func written(spec kvslab.GroupSpec, blk, bt, length int, page []float32) []float32 {
	rows, row := bt, spec.BytesPerToken/4
	n := min(max(length-blk*bt, 0), bt)
	if spec.Kind == kvslab.Compressed {
		rows, n = bt/spec.Ratio, min(max(length/spec.Ratio-blk*bt/spec.Ratio, 0), bt/spec.Ratio)
	}
	var out []float32
	for l := range spec.Layers {
		out = append(out, page[l*rows*row:(l*rows+n)*row]...)
	}
	return out
}

func pageFloats(t *testing.T, pool *kvslab.Pool, g int, id kvslab.PageID) []float32 {
	t.Helper()
	b, err := pool.PageBytes(g, id)
	if err != nil {
		t.Fatal(err)
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// TestLoadMTP checks Options.Drafts: the runner Load returns drafts with the MTP head of
// config.json's random weights; a model without an MTP head, or more drafts than the
// smallest compression ratio leaves room for, are refused.
func TestLoadMTP(t *testing.T) {
	r, err := Load(".", Options{Drafts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Info().MaxDrafts; got != 1 {
		t.Fatalf("MaxDrafts %d, want 1", got)
	}
	if _, err := r.NewPool(8 << 20); err != nil {
		t.Fatal(err)
	}
	c := tinyConfig(t)
	m, err := NewModel(c, RandomWeights(c, 1, false), 64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewMTPRunner(m, 8, 1); err == nil {
		t.Error("a model without an MTP head was given a drafting runner")
	}
	if _, err := NewMTPRunner(tinyModel(t), 8, 4); err == nil {
		t.Error("4 drafts per step were accepted with CSA windows of 4 tokens")
	}
}

// TestMTPPreemption runs the mixed batch in a pool too small for it, so that the engine
// preempts requests (their state is recomputed, the MTP rows and streams with it), and
// wants what decoding without drafts in the same pool gives.
func TestMTPPreemption(t *testing.T) {
	m := tinyModel(t)
	prompts := specPrompts(m.Config.VocabSize)
	sp := engine.SamplingParams{MaxTokens: 24, IgnoreEOS: true}
	run := func(r *Runner) ([]runnertest.Output, engine.Counters) {
		probe := layout(m.Config, 8, r.drafts > 0).groups
		pool, err := engine.NewHostPool(probe, 4*slabBytes(t, probe))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Bind(pool); err != nil {
			t.Fatal(err)
		}
		return generate(t, r, pool, prompts, sp, 0)
	}
	want, pc := run(NewRunner(m, 8))
	r, err := NewMTPRunner(m, 8, 2)
	if err != nil {
		t.Fatal(err)
	}
	full := map[int][]int32{}
	for i, p := range prompts {
		full[len(p)] = append(slices.Clone(p), want[i].Tokens...)
	}
	r.forceDraft = func(promptLen, pos int, logits []float32) int32 {
		if seq := full[promptLen]; pos < len(seq) && pos%2 == 0 {
			return seq[pos]
		}
		return (int32(ref.Argmax(logits)) + 1) % int32(m.Config.VocabSize)
	}
	got, c := run(r)
	if c.Preemptions == 0 {
		t.Fatalf("no preemption in a pool of 4 slabs (plain run: %d)", pc.Preemptions)
	}
	for i := range prompts {
		if !slices.Equal(got[i].Tokens, want[i].Tokens) {
			t.Fatalf("prompt %d: %v with MTP, %v without", i, got[i].Tokens, want[i].Tokens)
		}
	}
	t.Logf("%d preemptions (plain %d), %d drafts, %d accepted", c.Preemptions, pc.Preemptions, c.DraftsProposed, c.DraftsAccepted)
}

// slabBytes is the slab size engine.NewHostPool picks for groups.
func slabBytes(t *testing.T, groups []kvslab.GroupSpec) int64 {
	t.Helper()
	pool, err := engine.NewHostPool(groups, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	return pool.SlabBytes()
}

// TestMTPChainedDraftsMatchReference checks the chained drafts of a runner with 3 drafts
// per step against the MTP head chained in Go memory: for a sequence of length end (its
// last token sampled at position end), draft 0 comes from the MTP row at end−1 over the
// main model's streams, and draft j from the row at end−1+j over the MTP block's output
// streams of the row before and draft j−1; their logits must agree within 1e-5.
func TestMTPChainedDraftsMatchReference(t *testing.T) {
	const k = 3
	m := tinyModel(t)
	c := m.Config
	v, sw := c.VocabSize, c.HCMult*c.HiddenSize
	prompt := runnertest.Prompt(13, v, 70)
	r, pool := mtpRunner(t, k)
	type call struct {
		end, j int
		logits []float32
	}
	var calls []call
	r.forceDraft = func(_, pos int, logits []float32) int32 {
		// One sequence: the calls come k per step, draft 0 first.
		j := len(calls) % k
		calls = append(calls, call{end: pos - 1 - j, j: j, logits: slices.Clone(logits)})
		return int32(ref.Argmax(logits))
	}
	out, _ := generate(t, r, pool, [][]int32{prompt}, engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true}, 5)
	full := append(slices.Clone(prompt), out[0].Tokens...)
	_, streams := runChunks(t, m, full, []int{len(full)})
	worst := 0.0
	for _, cl := range calls {
		if cl.j != 0 {
			continue
		}
		ls := newLayerState(c, SlidingAttention)
		logits, outs, err := m.mtpForward([]mtpChunk{{state: &ls, streams: streams[:cl.end*sw], next: full[1 : cl.end+1]}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		lg, st := logits[(cl.end-1)*v:cl.end*v], outs[(cl.end-1)*sw:cl.end*sw]
		for j := 0; j < k; j++ {
			got := calls[slices.IndexFunc(calls, func(o call) bool { return o.end == cl.end && o.j == j })].logits
			d, _ := runnertest.MaxAbsDiff(got, lg)
			if d > 1e-5 {
				t.Fatalf("draft %d after %d tokens: logits differ from the chained reference by %g", j, cl.end, d)
			}
			worst = max(worst, d)
			next := []int32{int32(ref.Argmax(lg))}
			if logits, outs, err = m.mtpForward([]mtpChunk{{state: &ls, pos0: cl.end + j, streams: st, next: next}}, nil); err != nil {
				t.Fatal(err)
			}
			lg, st = logits, outs
		}
	}
	t.Logf("%d drafts in %d steps match the chained reference, max |Δ| %g", len(calls), len(calls)/k, worst)
}

// TestMTPNaNDraftLogits checks that an MTP head whose logits are all NaN (a broken
// checkpoint: here its final norm) does not fail the engine's step: ref.Argmax gives −1
// for an all-NaN row, which the engine refuses for every sequence of the step, so the
// draft must be a token of the vocabulary (0, what the engine's sampler picks for such a
// row), and the output is what the runner without drafts gives.
func TestMTPNaNDraftLogits(t *testing.T) {
	c := tinyConfig(t)
	plain := NewRunner(tinyModel(t), 8)
	pool, err := plain.NewPool(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	prompts := specPrompts(c.VocabSize)[:3]
	sp := engine.SamplingParams{MaxTokens: 8, IgnoreEOS: true}
	want, _ := generate(t, plain, pool, prompts, sp, 0)

	w := RandomWeights(c, 7, true)
	for i := range w.MTP.Norm {
		w.MTP.Norm[i] = float32(math.NaN())
	}
	m, err := NewModel(c, w, 512)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewMTPRunner(m, 8, 2)
	if err != nil {
		t.Fatal(err)
	}
	if pool, err = r.NewPool(8 << 20); err != nil {
		t.Fatal(err)
	}
	got, cnt := generate(t, r, pool, prompts, sp, 0)
	for i := range prompts {
		if !slices.Equal(got[i].Tokens, want[i].Tokens) {
			t.Fatalf("prompt %d: %v with NaN drafts, %v without drafts", i, got[i].Tokens, want[i].Tokens)
		}
	}
	if cnt.DraftsProposed == 0 {
		t.Error("no drafts proposed")
	}
}
