package demo

import (
	"context"
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// Name is the model's name in logs, metrics and the registry.
const Name = "demo"

// Options tune a runner.
type Options struct {
	// MaxContext caps the context (default: min(max_position_embeddings, 4096)).
	MaxContext int
	// PageTokens is the cache block size in tokens (default 16).
	PageTokens int
	// Seed seeds the random weights used when the directory holds no safetensors.
	Seed uint64
}

// Runner serves the model to core/engine: it runs each BatchPlan through the reference
// forward and samples one token per sequence that has a logits row.
type Runner struct {
	Model      *Model
	pageTokens int
	kv         *KVCache
	sampler    engine.Sampler
	logits     []float32
	res        engine.StepResult
	top        []engine.TopLogprob
}

var _ engine.Runner = (*Runner)(nil)

// NewRunner wraps a model; bind it to a cache pool with NewPool (or Bind) before Execute.
func NewRunner(m *Model, pageTokens int) *Runner {
	if pageTokens <= 0 {
		pageTokens = 16
	}
	return &Runner{Model: m, pageTokens: pageTokens}
}

// Load opens the model in dir: config.json and its safetensors weights, or, when dir holds
// no safetensors, seeded random weights of the config.
func Load(dir string, opts Options) (*Runner, error) {
	c, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	var w *Weights
	ck, err := weights.Open(dir)
	switch {
	case err == nil:
		defer ck.Close()
		if w, err = LoadWeights(c, ck); err != nil {
			return nil, fmt.Errorf("load %s: %w", dir, err)
		}
	case errors.Is(err, weights.ErrNotFound):
		seed := opts.Seed
		if seed == 0 {
			seed = 1
		}
		w = RandomWeights(c, seed)
	default:
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	maxCtx := opts.MaxContext
	if maxCtx <= 0 {
		maxCtx = min(c.MaxPositionEmbeddings, 4096)
		if maxCtx <= 1 {
			maxCtx = 4096
		}
	}
	m, err := NewModel(c, w, maxCtx)
	if err != nil {
		return nil, err
	}
	return NewRunner(m, opts.PageTokens), nil
}

// Open loads the model in dir and builds a host cache pool of cacheBytes bytes (0 = 256
// MiB) for it: the registry's entry point.
func Open(dir string, cacheBytes int64) (engine.Runner, *kvslab.Pool, error) {
	r, err := Load(dir, Options{})
	if err != nil {
		return nil, nil, err
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}

// CacheGroups returns the groups the runner's pool must hold.
func (r *Runner) CacheGroups() []kvslab.GroupSpec { return CacheGroups(r.Model.Config, r.pageTokens) }

// NewPool builds a host-memory pool of bytes bytes (0 = 256 MiB) for the model's cache
// groups and binds the runner to it. Pass it to engine.New in engine.Config.Pool.
func (r *Runner) NewPool(bytes int64) (*kvslab.Pool, error) {
	pool, err := engine.NewHostPool(r.CacheGroups(), bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: cache pool: %w", Name, err)
	}
	return pool, r.Bind(pool)
}

// Bind makes the runner read and write its cache in pool.
func (r *Runner) Bind(pool *kvslab.Pool) error {
	kv, err := NewKVCache(r.Model.Config, pool)
	if err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	r.kv = kv
	return nil
}

// Info describes the runner to the engine.
func (r *Runner) Info() engine.RunnerInfo {
	c := r.Model.Config
	var eos []int32
	for _, t := range c.EOSTokenID {
		if t >= 0 && int(t) < c.VocabSize {
			eos = append(eos, t)
		}
	}
	return engine.RunnerInfo{
		Name: Name, VocabSize: c.VocabSize, MaxContext: r.Model.MaxContext(), EOS: eos,
		CacheGroups: r.CacheGroups(),
	}
}

// Execute runs one plan and samples the next token of every sequence with a logits row.
func (r *Runner) Execute(ctx context.Context, plan *engine.BatchPlan) (engine.StepResult, error) {
	if r.kv == nil {
		return engine.StepResult{}, fmt.Errorf("%s: runner not bound to a cache pool (call NewPool or Bind)", Name)
	}
	if err := ctx.Err(); err != nil {
		return engine.StepResult{}, err
	}
	vocab := r.Model.Config.VocabSize
	n := len(plan.LogitsIndices) * vocab
	if cap(r.logits) < n {
		r.logits = make([]float32, n)
	}
	r.logits = r.logits[:n]
	if err := r.Model.Forward(plan, r.kv, r.logits); err != nil {
		return engine.StepResult{}, fmt.Errorf("%s: %w", Name, err)
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
		// Without drafts a sequence has one logits row: its last scheduled token.
		row := hi - 1
		pos := int(plan.Positions[plan.LogitsIndices[row]]) + 1
		tok, lp, top := r.sampler.Sample(r.logits[row*vocab:(row+1)*vocab], plan.SamplingOf(i), pos, r.top[:0])
		r.top = top
		res.Accepted[i] = 1
		res.Tokens = append(res.Tokens, tok)
		if anyLP {
			res.Logprobs = append(res.Logprobs, lp)
		}
		for _, t := range top {
			res.TopTokens = append(res.TopTokens, t.Token)
			res.TopLogprobs = append(res.TopLogprobs, t.Logprob)
		}
	}
	return *res, nil
}
