package glm5flash

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/runnertest"
)

// Comparisons that survive a flipped greedy choice: a GPU run whose rounding (bf16, FP8)
// differs from the CPU reference may pick another token where two are close, after which
// the outputs share nothing. Instead every log probability the GPU engine reports is
// compared with the CPU engine's teacher-forced one for the same token after the same
// tokens (the CPU run of prompt + the GPU's tokens with PromptLogprobs), so each GPU
// decode, verify or prefill row is checked against the reference on its own trajectory.

// forcedLogprobs returns, from engine e, the log probability of seq[k] after seq[:k] for
// k = 1 .. len(seq)-1 (PromptLogprobs; one token is generated and dropped).
func forcedLogprobs(t *testing.T, e *runnertest.Engine, seq []int32) []float32 {
	t.Helper()
	ctx := context.Background()
	st, err := e.Submit(ctx, engine.Request{Prompt: seq, Sampling: engine.SamplingParams{MaxTokens: 1, IgnoreEOS: true, PromptLogprobs: true}})
	if err != nil {
		t.Fatal(err)
	}
	var out []float32
	for {
		ev, err := st.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, lp := range ev.PromptLogprobs {
			out = append(out, lp.Logprob)
		}
		if ev.Finish != engine.FinishNone {
			if ev.Err != nil {
				t.Fatal(ev.Err)
			}
			break
		}
	}
	if len(out) != len(seq)-1 {
		t.Fatalf("%d prompt logprobs for %d tokens", len(out), len(seq))
	}
	return out
}

// forcedWorst returns the largest |g's logprob − the CPU engine's forced logprob| over
// g's tokens after prompt, appending each difference to diffs.
func forcedWorst(t *testing.T, ce *runnertest.Engine, prompt []int32, g runnertest.Output, diffs *[]float64) float64 {
	t.Helper()
	if len(g.Logprobs) != len(g.Tokens) || len(g.Tokens) == 0 {
		t.Fatalf("%d tokens, %d logprobs", len(g.Tokens), len(g.Logprobs))
	}
	want := forcedLogprobs(t, ce, append(append([]int32(nil), prompt...), g.Tokens...))
	worst := 0.0
	for i, lp := range g.Logprobs {
		d := math.Abs(float64(lp.Logprob - want[len(prompt)-1+i]))
		if !(d <= math.MaxFloat64) {
			d = math.Inf(1)
		}
		worst = max(worst, d)
		*diffs = append(*diffs, d)
	}
	return worst
}

// forcedCheck fails t where forcedWorst is above tol, and returns it.
func forcedCheck(t *testing.T, what string, ce *runnertest.Engine, prompt []int32, g runnertest.Output, tol float64, diffs *[]float64) float64 {
	t.Helper()
	w := forcedWorst(t, ce, prompt, g, diffs)
	if !(w <= tol) {
		t.Errorf("%s: a logprob %.3g from the CPU's teacher-forced one (tolerance %g)", what, w, tol)
	}
	return w
}

// promptWorst returns the largest difference between the two engines' teacher-forced
// logprobs over prompt (every prefill row, in the engines' chunking).
func promptWorst(t *testing.T, ge, ce *runnertest.Engine, prompt []int32, diffs *[]float64) float64 {
	t.Helper()
	g, c := forcedLogprobs(t, ge, prompt), forcedLogprobs(t, ce, prompt)
	worst := 0.0
	for i := range c {
		d := math.Abs(float64(g[i] - c[i]))
		if !(d <= math.MaxFloat64) {
			d = math.Inf(1)
		}
		worst = max(worst, d)
		*diffs = append(*diffs, d)
	}
	return worst
}

// endToEnd runs the end-to-end requests of the FP8 and bf16 checks on ge (a GPU engine,
// fresh pool) against ce (the CPU reference): a prefill's rows (teacher-forced), one
// request alone, a batch of three of different lengths decoding together, and prompts
// that resume from the prefix cache through a KDA checkpoint and between two; every GPU
// logprob within tol of the CPU's forced one and the median difference within
// medianTol (without full, the long prompt and its prefix hits are left out). It returns
// the largest difference and the median.
func endToEnd(t *testing.T, what string, ge, ce *runnertest.Engine, vocab, salt int, tol, medianTol float64, full bool) (float64, float64) {
	t.Helper()
	var diffs []float64
	defer func() {
		slices.Sort(diffs)
		if m := diffs[len(diffs)/2]; !(m <= medianTol) {
			t.Errorf("%s: median |Δ logprob| %.3g over %d rows (tolerance %g)", what, m, len(diffs), medianTol)
		}
	}()
	greedy := engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true, Logprobs: true}
	p := runnertest.Prompt(37, vocab, salt+1)
	worst := promptWorst(t, ge, ce, p, &diffs)
	if !(worst <= tol) {
		t.Errorf("%s: prefill rows: a logprob %.3g from the CPU's (tolerance %g)", what, worst, tol)
	}
	worst = max(worst, forcedCheck(t, what+", one request", ce, p, ge.Generate(t, p, greedy), tol, &diffs))
	batch := [][]int32{runnertest.Prompt(3, vocab, salt+2), runnertest.Prompt(19, vocab, salt+3), runnertest.Prompt(30, vocab, salt+4)}
	for i, g := range ge.GenerateAll(t, batch, greedy) {
		worst = max(worst, forcedCheck(t, fmt.Sprintf("%s, request %d of a batch", what, i), ce, batch[i], g, tol, &diffs))
	}
	if !full {
		return worst, median(diffs)
	}
	long := runnertest.Prompt(70, vocab, salt+5)
	worst = max(worst, forcedCheck(t, what+", a long prompt", ce, long, ge.Generate(t, long, greedy), tol, &diffs))
	for _, n := range []int{60, 32} { // between the checkpoints at 48 and 64; at 32
		hit := append(append([]int32(nil), long[:n]...), 1, 2, 3)
		before := ge.Counters().PrefixHits
		worst = max(worst, forcedCheck(t, fmt.Sprintf("%s, a prompt sharing %d tokens", what, n), ce, hit, ge.Generate(t, hit, greedy), tol, &diffs))
		if ge.Counters().PrefixHits <= before {
			t.Errorf("%s: a prompt sharing %d tokens got no prefix hit", what, n)
		}
	}
	return worst, median(diffs)
}

// median is the middle of v (sorted in a copy).
func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}
