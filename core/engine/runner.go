package engine

import (
	"context"
	"fmt"

	"github.com/resin-llm/resin/core/kvslab"
)

// Runner is the one interface a model implements. Execute runs one frozen BatchPlan and
// returns, per scheduled sequence, the accepted tokens and the next drafts. Info is called
// once, by New.
//
// The plan must not be modified, and it stays valid only until Execute returns. The
// returned StepResult may alias the runner's buffers: the engine reads it before the next
// Execute.
type Runner interface {
	Info() RunnerInfo
	Execute(ctx context.Context, plan *BatchPlan) (StepResult, error)
}

// RunnerInfo is what a runner declares about itself.
type RunnerInfo struct {
	// Name names the model/runner in logs and metrics.
	Name string
	// VocabSize is the number of token ids (ids are 0..VocabSize-1).
	VocabSize int
	// MaxContext is the longest sequence (prompt + output) the model handles.
	MaxContext int
	// EOS lists the end-of-sequence token ids (finish reason stop unless IgnoreEOS).
	EOS []int32
	// CacheGroups describes the per-sequence caches the model keeps, in the order of
	// BatchPlan.Groups. The engine's kvslab pool must have exactly these groups.
	CacheGroups []kvslab.GroupSpec
	// GraphBuckets lists, ascending, the batch sizes (sequences) for which the runner has
	// captured CUDA graphs; empty means eager only. See BatchPlan.GraphBatch.
	GraphBuckets []int
	// MaxDrafts is how many draft tokens per sequence the runner proposes (0 = no
	// speculative decoding).
	MaxDrafts int
	// AsyncTokens says the runner accepts PendingToken in a plan's Tokens, which lets the
	// engine build plan N+1 while plan N runs (Config.Async).
	AsyncTokens bool
	// ExecutesCacheOps says the runner executes each plan's CacheOps itself, in order,
	// before its forward (on its own stream, or across a process boundary). Otherwise the
	// Engine executes them against its pool's arena with ApplyCacheOps just before it
	// calls Execute, on the goroutine that calls Execute, so they still run after the
	// previous step and before this one. (A caller that drives a Scheduler itself does
	// the same for such a runner.)
	ExecutesCacheOps bool
	// TokenMasks says the runner's sampler applies BatchPlan.TokenMask (engine.Sampler
	// does, through SamplingOf and TokenMaskOf). The engine refuses a request with a
	// Constraint when the runner does not.
	TokenMasks bool
}

// PendingToken in BatchPlan.Tokens stands for the token the runner sampled for the same
// sequence in the previous step, which the engine did not know yet when it built the plan
// (Config.Async). Only runners that declare AsyncTokens see it.
const PendingToken int32 = -1

func (ri *RunnerInfo) validate() error {
	if ri.VocabSize <= 0 {
		return fmt.Errorf("engine: runner %q declares vocabulary size %d", ri.Name, ri.VocabSize)
	}
	if ri.MaxContext <= 1 {
		return fmt.Errorf("engine: runner %q declares maximum context %d: a sequence needs room for at least one prompt token and one generated token, "+
			"so RunnerInfo.MaxContext must be at least 2; set it to the longest sequence the model handles (its max_position_embeddings)", ri.Name, ri.MaxContext)
	}
	for _, t := range ri.EOS {
		if t < 0 || int(t) >= ri.VocabSize {
			return fmt.Errorf("engine: runner %q declares EOS id %d outside the vocabulary", ri.Name, t)
		}
	}
	if ri.MaxDrafts < 0 {
		return fmt.Errorf("engine: runner %q declares %d drafts", ri.Name, ri.MaxDrafts)
	}
	for i, b := range ri.GraphBuckets {
		if b <= 0 || (i > 0 && b <= ri.GraphBuckets[i-1]) {
			return fmt.Errorf("engine: runner %q graph buckets %v must be positive and ascending", ri.Name, ri.GraphBuckets)
		}
	}
	return nil
}

// StepResult is a runner's answer to one BatchPlan, in flat arrays indexed like the plan's
// sequences. For sequence i:
//
//   - Accepted[i] tokens are taken from Tokens, in order: 0 for a mid-prompt chunk (no
//     logits rows), otherwise 1..NumDrafts[i]+1: the drafts the runner verified as correct,
//     then one token it sampled after them.
//   - NumNextDrafts[i] draft tokens for the next step are taken from Drafts (0..MaxDrafts).
//   - When any sequence asks for logprobs (plan.Logprobs[i] >= 0 for some i), Logprobs runs
//     parallel to Tokens (values of sequences that did not ask are ignored), and a sequence
//     with plan.Logprobs[i] = n > 0 takes n alternatives per accepted token, in order, from
//     TopTokens / TopLogprobs.
//   - A sequence that asks for prompt logprobs (plan.PromptRows(i) > 0) takes one entry
//     per scored row from PromptLogprobs (the logprob of plan.PromptTarget(i, j)) and
//     plan.PromptLogprobs[i] alternatives per row from PromptTopTokens/PromptTopLogprobs.
type StepResult struct {
	Accepted      []int32
	Tokens        []int32
	NumNextDrafts []int32
	Drafts        []int32
	Logprobs      []float32
	TopTokens     []int32
	TopLogprobs   []float32

	PromptLogprobs    []float32
	PromptTopTokens   []int32
	PromptTopLogprobs []float32
}

// Reset empties r for a plan of n sequences, keeping its buffers.
func (r *StepResult) Reset(n int) {
	r.Accepted = resize(r.Accepted, n)
	r.NumNextDrafts = resize(r.NumNextDrafts, n)
	r.Tokens = r.Tokens[:0]
	r.Drafts = r.Drafts[:0]
	r.Logprobs = r.Logprobs[:0]
	r.TopTokens = r.TopTokens[:0]
	r.TopLogprobs = r.TopLogprobs[:0]
	r.PromptLogprobs = r.PromptLogprobs[:0]
	r.PromptTopTokens = r.PromptTopTokens[:0]
	r.PromptTopLogprobs = r.PromptTopLogprobs[:0]
}

func resize(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// check verifies r against the plan it answers.
func (r *StepResult) check(p *BatchPlan, maxDrafts int, vocab int) error {
	b := p.NumSeqs()
	if len(r.Accepted) != b || len(r.NumNextDrafts) != b {
		return fmt.Errorf("%w: %d accepted counts and %d draft counts for %d sequences", ErrBadResult, len(r.Accepted), len(r.NumNextDrafts), b)
	}
	nt, nd, ntop := 0, 0, 0
	accepted, drafts, logitsStart := r.Accepted[:b], r.NumNextDrafts[:b], p.LogitsStart[:b+1]
	for i, a := range accepted {
		// 1..rows accepted tokens when the sequence has logits rows, else none.
		rows := logitsStart[i+1] - logitsStart[i]
		if uint32(a) > uint32(rows) || a == 0 && rows > 0 {
			return fmt.Errorf("%w: sequence %d accepted %d tokens with %d logits rows", ErrBadResult, i, a, rows)
		}
		nt += int(a)
		d := drafts[i]
		if uint32(d) > uint32(maxDrafts) {
			return fmt.Errorf("%w: sequence %d proposes %d drafts (max %d)", ErrBadResult, i, d, maxDrafts)
		}
		nd += int(d)
	}
	if p.anyLogprobs {
		for i, n := range p.Logprobs[:b] {
			if n > 0 {
				ntop += int(accepted[i]) * int(n)
			}
		}
	}
	if len(r.Tokens) != nt || len(r.Drafts) != nd {
		return fmt.Errorf("%w: %d tokens and %d drafts, counts say %d and %d", ErrBadResult, len(r.Tokens), len(r.Drafts), nt, nd)
	}
	for _, t := range r.Tokens {
		if uint32(t) >= uint32(vocab) {
			return fmt.Errorf("%w: token %d outside the vocabulary", ErrBadResult, t)
		}
	}
	for _, t := range r.Drafts {
		if uint32(t) >= uint32(vocab) {
			return fmt.Errorf("%w: draft %d outside the vocabulary", ErrBadResult, t)
		}
	}
	// Alternatives reach clients as token text: one outside the vocabulary would show as
	// an empty token.
	for _, tops := range [...]struct {
		what string
		ids  []int32
	}{{"top logprob", r.TopTokens}, {"prompt top logprob", r.PromptTopTokens}} {
		for _, t := range tops.ids {
			if uint32(t) >= uint32(vocab) {
				return fmt.Errorf("%w: %s token %d outside the vocabulary", ErrBadResult, tops.what, t)
			}
		}
	}
	if len(p.PromptLogprobs) > 0 {
		rows, top := 0, 0
		for i := 0; i < b; i++ {
			n := p.PromptRows(i)
			rows += n
			top += n * int(p.PromptLogprobs[i])
		}
		if len(r.PromptLogprobs) != rows || len(r.PromptTopTokens) != top || len(r.PromptTopLogprobs) != top {
			return fmt.Errorf("%w: %d prompt logprobs and %d/%d alternatives, the plan scores %d rows with %d", ErrBadResult,
				len(r.PromptLogprobs), len(r.PromptTopTokens), len(r.PromptTopLogprobs), rows, top)
		}
	}
	if p.anyLogprobs {
		if len(r.Logprobs) != nt {
			return fmt.Errorf("%w: %d logprobs for %d tokens", ErrBadResult, len(r.Logprobs), nt)
		}
		if len(r.TopTokens) != ntop || len(r.TopLogprobs) != ntop {
			return fmt.Errorf("%w: %d/%d top logprobs, counts say %d", ErrBadResult, len(r.TopTokens), len(r.TopLogprobs), ntop)
		}
	}
	return nil
}
