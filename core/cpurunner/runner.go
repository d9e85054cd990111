package cpurunner

import (
	"context"
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/engine"
)

// Forwarder is a model's forward pass over one plan. It reads and writes the cache it was
// bound to and writes the logits of the rows plan.LogitsIndices names, row-major
// [len(plan.LogitsIndices)][vocab], into logits. It must not modify the plan.
type Forwarder interface {
	Forward(plan *engine.BatchPlan, logits []float32) error
}

// ForwardFunc adapts a function to a Forwarder.
type ForwardFunc func(plan *engine.BatchPlan, logits []float32) error

// Forward calls f(plan, logits).
func (f ForwardFunc) Forward(plan *engine.BatchPlan, logits []float32) error { return f(plan, logits) }

// ErrNotBound is what a Forwarder returns while its model has no cache to run on (and what
// Execute reports for a Runner built without a Forwarder).
var ErrNotBound = errors.New("runner not bound to a cache pool (call NewPool or Bind)")

// Runner implements engine.Runner over a Forwarder. Its Execute is meant for one
// goroutine (the engine's loop).
type Runner struct {
	info    engine.RunnerInfo
	fwd     Forwarder
	sampler engine.Sampler
	logits  []float32
	res     engine.StepResult
	top     []engine.TopLogprob

	capture func(LogitsRow)
	// allRows: this step computes the logits of every token row (capturing, or scoring
	// prompt logprobs), so row k of the logits buffer is token row k.
	allRows bool
	all     engine.BatchPlan // the plan with every token row asked for, while capturing
	allIdx  []int32
	allSt   []int32

	drafter Drafter   // nil: the model proposes no drafts (spec.go)
	hist    []int32   // a draft row's token history
	p       []float32 // a sampled draft row's target distribution
}

var _ engine.Runner = (*Runner)(nil)

// New returns the runner of a model described by info whose forward pass is f. EOS ids
// outside the vocabulary are dropped (HF configs sometimes list them); the runner takes no
// pending tokens and proposes drafts only when f is a Drafter, so Info reports AsyncTokens
// false and MaxDrafts 0 (or the Drafter's) whatever info says. It leaves a plan's CacheOps
// to the engine (ExecutesCacheOps false), which executes them on the pool the model's
// cache is bound to just before Execute. Its sampler applies token masks (TokenMasks
// true: grammar-constrained requests). A nil f makes every Execute
// fail with ErrNotBound.
func New(info engine.RunnerInfo, f Forwarder) *Runner {
	var eos []int32
	for _, t := range info.EOS {
		if t >= 0 && int(t) < info.VocabSize {
			eos = append(eos, t)
		}
	}
	info.EOS, info.MaxDrafts, info.AsyncTokens, info.ExecutesCacheOps = eos, 0, false, false
	info.TokenMasks = true
	r := &Runner{info: info, fwd: f}
	if d, ok := f.(Drafter); ok && d.MaxDrafts() > 0 {
		r.drafter, r.info.MaxDrafts = d, d.MaxDrafts()
	}
	return r
}

// Info describes the runner to the engine.
func (r *Runner) Info() engine.RunnerInfo { return r.info }

// Execute runs the forward over plan and samples the next token of every sequence with a
// logits row. Errors of the forward come back prefixed with the runner's name.
func (r *Runner) Execute(ctx context.Context, plan *engine.BatchPlan) (engine.StepResult, error) {
	if r.fwd == nil {
		return engine.StepResult{}, fmt.Errorf("%s: %w", r.info.Name, ErrNotBound)
	}
	if err := ctx.Err(); err != nil {
		return engine.StepResult{}, err
	}
	run := plan
	r.allRows = r.capture != nil || scoresPrompt(plan)
	if r.allRows {
		run = r.allRowsPlan(plan)
	}
	vocab := r.info.VocabSize
	n := len(run.LogitsIndices) * vocab
	if cap(r.logits) < n {
		r.logits = make([]float32, n)
	}
	r.logits = r.logits[:n]
	if err := r.fwd.Forward(run, r.logits); err != nil {
		return engine.StepResult{}, fmt.Errorf("%s: %w", r.info.Name, err)
	}
	b := plan.NumSeqs()
	res := &r.res
	res.Reset(b)
	anyLP := false
	for _, lp := range plan.Logprobs {
		anyLP = anyLP || lp >= 0
	}
	for i := 0; i < b; i++ {
		lo, hi := int(plan.LogitsStart[i]), int(plan.LogitsStart[i+1])
		if lo == hi {
			continue
		}
		if r.drafter != nil && plan.NumDrafts[i] > 0 {
			a, err := r.verify(plan, i, lo, hi, anyLP)
			if err != nil {
				return engine.StepResult{}, fmt.Errorf("%s: %w", r.info.Name, err)
			}
			res.Accepted[i] = a
			continue
		}
		// Without drafts a sequence has one logits row: its last scheduled token. While
		// capturing, every token row has logits and row k of the buffer is token row k.
		row := hi - 1
		if r.allRows {
			row = int(plan.LogitsIndices[row])
		}
		pos := int(plan.Positions[plan.LogitsIndices[hi-1]]) + 1
		tok, lp, top := r.sampler.Sample(r.logits[row*vocab:(row+1)*vocab], plan.SamplingOf(i), pos, r.top[:0])
		r.top = top
		res.Accepted[i] = 1
		r.appendSampled(tok, lp, top, anyLP)
	}
	if r.allRows && len(plan.PromptLogprobs) > 0 {
		r.scorePrompts(plan)
	}
	if r.drafter != nil {
		if err := r.drafter.Draft(plan, res); err != nil {
			return engine.StepResult{}, fmt.Errorf("%s: %w", r.info.Name, err)
		}
	}
	if r.capture != nil {
		r.emit(plan)
	}
	return *res, nil
}

// appendSampled appends a sampled token to the step's result, with its logprob when a
// sequence of the plan asks for logprobs, and its top alternatives.
func (r *Runner) appendSampled(tok int32, lp float32, top []engine.TopLogprob, anyLP bool) {
	res := &r.res
	res.Tokens = append(res.Tokens, tok)
	if anyLP {
		res.Logprobs = append(res.Logprobs, lp)
	}
	for _, t := range top {
		res.TopTokens = append(res.TopTokens, t.Token)
		res.TopLogprobs = append(res.TopLogprobs, t.Logprob)
	}
}

// scoresPrompt reports whether a sequence of plan asks for prompt logprobs in this step.
func scoresPrompt(plan *engine.BatchPlan) bool {
	for i := range plan.PromptLogprobs {
		if plan.PromptRows(i) > 0 {
			return true
		}
	}
	return false
}

// scorePrompts appends the prompt logprobs the plan asks for (every token row has logits
// in this step): row j of sequence i scored against plan.PromptTarget(i, j).
func (r *Runner) scorePrompts(plan *engine.BatchPlan) {
	vocab := r.info.VocabSize
	res := &r.res
	for i := 0; i < plan.NumSeqs(); i++ {
		k := int(plan.PromptLogprobs[i])
		for j := 0; j < plan.PromptRows(i); j++ {
			buf := int(plan.QueryStart[i]) + j
			lp, top := r.sampler.Score(r.logits[buf*vocab:(buf+1)*vocab], plan.PromptTarget(i, j), k, r.top[:0])
			r.top = top
			res.PromptLogprobs = append(res.PromptLogprobs, lp)
			for _, t := range top {
				res.PromptTopTokens = append(res.PromptTopTokens, t.Token)
				res.PromptTopLogprobs = append(res.PromptTopLogprobs, t.Logprob)
			}
		}
	}
}
