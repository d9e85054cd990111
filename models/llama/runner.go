package llama

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// Name is the model's name in logs, metrics and the registry.
const Name = "llama"

// Options tune a runner.
type Options struct {
	// MaxContext caps the context (default: min(max_position_embeddings, 4096)).
	MaxContext int
	// PageTokens is the cache block size in tokens (default 16).
	PageTokens int
	// Seed seeds the random weights used when the directory holds no safetensors.
	Seed uint64
	// DType is the form the projections are held and multiplied in on the CPU: fp32 (the
	// default), bf16 (exact for a bf16 checkpoint; rounded from fp32 ones) or int8 (blocks
	// of 32 quantised at load). See ref.DType.
	DType ref.DType
}

// Runner serves the model to core/engine. The engine wiring (sampling, logprobs, the step
// result, logits capture for `generate --logits-out`) is core/cpurunner's; what is the
// model's own is here: loading it and binding its cache. This file is yours: to run the
// model on a GPU, replace the forward below with your device runner.
type Runner struct {
	*cpurunner.Runner // Info, Execute, CaptureLogits
	Model             *Model
	pageTokens        int
	kv                *KVCache           // nil until Bind
	spec              *dspark.Speculator // UseDSpark's; its draft context is the last group
}

var _ engine.Runner = (*Runner)(nil)

// NewRunner wraps a model; bind it to a cache pool with NewPool (or Bind) before Execute.
func NewRunner(m *Model, pageTokens int) *Runner {
	if pageTokens <= 0 {
		pageTokens = 16
	}
	r := &Runner{Model: m, pageTokens: pageTokens}
	c := m.Config
	info := engine.RunnerInfo{
		Name: Name, VocabSize: c.VocabSize, MaxContext: m.MaxContext(), EOS: c.EOSTokenID,
		CacheGroups: r.CacheGroups(),
	}
	r.Runner = cpurunner.New(info, cpurunner.ForwardFunc(func(p *engine.BatchPlan, logits []float32) error {
		if r.kv == nil {
			return cpurunner.ErrNotBound
		}
		return r.Model.Forward(p, r.kv, logits)
	}))
	return r
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
		if err := weights.CheckMemory(WeightBytes(c), "seeded random weights of "+filepath.Join(dir, "config.json")); err != nil {
			return nil, fmt.Errorf("load %s: %w (put the checkpoint's safetensors there, or shrink the config)", dir, err)
		}
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
		maxCtx = DefaultMaxContext(c)
	}
	dt := opts.DType
	if dt == "" {
		dt = ref.DTypeFP32
	}
	m, err := NewModelDType(c, w, maxCtx, dt)
	if err != nil {
		return nil, fmt.Errorf("load %s as %s: %w", dir, dt, err)
	}
	if dt != ref.DTypeFP32 {
		w.dropProjections()
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

// OpenDType is Open with the projections in dtype (fp32, bf16 or int8; see
// ref.ParseDType): the entry point of `--dtype`.
func OpenDType(dir string, cacheBytes int64, dtype string) (engine.Runner, *kvslab.Pool, error) {
	dt, err := ref.ParseDType(dtype)
	if err != nil {
		return nil, nil, err
	}
	r, err := Load(dir, Options{DType: dt})
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
// With a DSpark drafter (UseDSpark) they end with the drafter's context group.
func (r *Runner) CacheGroups() []kvslab.GroupSpec {
	g := CacheGroups(r.Model.Config, r.pageTokens)
	if r.spec != nil {
		g = append(g, r.spec.Drafter.CacheGroup(r.pageTokens))
	}
	return g
}

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
	if r.spec != nil {
		if err := r.spec.Bind(pool, len(CacheGroups(r.Model.Config, r.pageTokens))); err != nil {
			return fmt.Errorf("%s: %w", Name, err)
		}
	}
	r.kv = kv
	return nil
}

// UseDSpark makes the runner draft with a DSpark drafter (core/dspark, loaded with
// dspark.Load): each step the model's forward hands the drafter the features of its
// tapped layers, and the drafts are verified exactly at any temperature (cpurunner's
// DraftSampler). maxDrafts ≤ 0 drafts whole blocks; threshold is the confidence cut (0:
// none). A drafter built for another vocabulary, hidden size or depth is refused. The
// draft context is kept in one more cache group (the drafter's CacheGroup), so that prefix
// hits and preempted requests draft at once: call UseDSpark before NewPool or Bind. The
// Speculator it returns can trace verifications.
func (r *Runner) UseDSpark(d *dspark.Drafter, maxDrafts int, threshold float32) (*dspark.Speculator, error) {
	c := r.Model.Config
	if err := d.Config.CheckTarget(c.VocabSize, c.HiddenSize, c.NumHiddenLayers); err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	if r.kv != nil || r.spec != nil {
		return nil, fmt.Errorf("%s: UseDSpark after Bind or a first UseDSpark: the pool would lack the drafter's cache group", Name)
	}
	r.spec = dspark.NewSpeculator(tapForward{r}, d, maxDrafts, threshold)
	info := r.Runner.Info()
	info.CacheGroups = r.CacheGroups()
	r.Runner = cpurunner.New(info, r.spec)
	return r.spec, nil
}

// tapForward is the runner's forward with DSpark's feature tap (dspark.TapForwarder).
type tapForward struct{ r *Runner }

func (f tapForward) Forward(p *engine.BatchPlan, logits []float32) error {
	return f.ForwardTap(p, logits, nil)
}

func (f tapForward) ForwardTap(p *engine.BatchPlan, logits []float32, tap *dspark.FeatureTap) error {
	if f.r.kv == nil {
		return cpurunner.ErrNotBound
	}
	return f.r.Model.ForwardTap(p, f.r.kv, logits, tap)
}

// DefaultMaxContext is the context a runner loaded without Options.MaxContext covers:
// min(max_position_embeddings, 4096), or 4096 where the config gives none. A drafter
// sized before the runner is opened (Options.DSpark on the GPU) reads it here.
func DefaultMaxContext(c *Config) int {
	if n := min(c.MaxPositionEmbeddings, 4096); n > 1 {
		return n
	}
	return 4096
}
