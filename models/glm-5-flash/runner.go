package glm5flash

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// Name is the model's name in logs, metrics and the registry.
const Name = "glm-5-flash"

// Open loads the model in dir (config.json and safetensors, or seeded random weights when
// dir holds no safetensors) and builds a host cache pool of cacheBytes bytes (0 = 256 MiB)
// for it: the registry's entry point.
func Open(dir string, cacheBytes int64) (engine.Runner, *kvslab.Pool, error) {
	r, err := LoadText(dir, 0, 0)
	if err != nil {
		return nil, nil, err
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}

// OpenSpeculative is Open with MTP speculative decoding (drafts draft tokens per step).
// The GLM MTP head is not implemented yet: drafts > 0 is refused.
func OpenSpeculative(dir string, cacheBytes int64, drafts int) (engine.Runner, *kvslab.Pool, error) {
	if drafts <= 0 {
		return Open(dir, cacheBytes)
	}
	return nil, nil, fmt.Errorf("%s: MTP speculative decoding is not implemented yet (the glm5_next MTP layer, layers.{num_hidden_layers}.*, is read by nothing)", Name)
}

// TextRunner serves the GLM-5.3-Flash text model to core/engine through core/cpurunner:
// each plan's sequences continue their state in the kvslab pool (cache.go).
type TextRunner struct {
	*cpurunner.Runner
	Model      *TextModel
	MaxContext int
	pageTokens int
	kv         *textKVCache
}

var _ engine.Runner = (*TextRunner)(nil)

// NewTextRunner wraps a model; bind it to a pool with NewPool (or Bind) before Execute.
func NewTextRunner(m *TextModel, pageTokens, maxContext int) *TextRunner {
	c := m.Config
	if maxContext <= 0 {
		maxContext = min(c.MaxPositionEmbeddings, 4096)
	}
	r := &TextRunner{Model: m, MaxContext: maxContext, pageTokens: TextPageTokens(c, pageTokens)}
	r.Runner = cpurunner.New(engine.RunnerInfo{
		Name: Name, VocabSize: c.VocabSize, MaxContext: maxContext, EOS: c.EOSTokenID,
		CacheGroups: r.CacheGroups(),
	}, cpurunner.ForwardFunc(r.forward))
	return r
}

// CacheGroups returns the groups the runner's pool must hold.
func (r *TextRunner) CacheGroups() []kvslab.GroupSpec {
	return TextCacheGroups(r.Model.Config, r.pageTokens)
}

// NewPool builds a host-memory pool of bytes bytes (0 = 256 MiB) and binds the runner to it.
func (r *TextRunner) NewPool(bytes int64) (*kvslab.Pool, error) {
	pool, err := engine.NewHostPool(r.CacheGroups(), bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: cache pool: %w", Name, err)
	}
	return pool, r.Bind(pool)
}

// Bind makes the runner read and write its cache in pool.
func (r *TextRunner) Bind(pool *kvslab.Pool) error {
	kv, err := newTextKVCache(r.Model, pool)
	if err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	r.kv = kv
	return nil
}

// forward runs one plan on the sequences' kvslab-backed states as one batch
// (TextModel.ForwardBatch), computing the logits of the rows plan.LogitsIndices names only.
func (r *TextRunner) forward(p *engine.BatchPlan, logits []float32) error {
	if r.kv == nil {
		return cpurunner.ErrNotBound
	}
	chunks := make([]TextChunk, p.NumSeqs())
	for i := range chunks {
		st, err := r.kv.bind(p, i)
		if err != nil {
			return err
		}
		toks, _ := p.Seq(i)
		q0 := int(p.QueryStart[i])
		rows := []int{}
		for _, row := range p.LogitsIndices[p.LogitsStart[i]:p.LogitsStart[i+1]] {
			rows = append(rows, int(row)-q0)
		}
		chunks[i] = TextChunk{State: st, Tokens: toks, Rows: rows}
	}
	out, err := r.Model.ForwardBatch(chunks)
	if err != nil {
		return err
	}
	copy(logits, out)
	return nil
}

// randomSource makes seeded random tensors for any name and shape the loader asks for:
// weights N(0, fan_in^-1/2), norms 1 + N(0, 0.1), hc scales 1, dt_bias −3 (mild decays),
// other vectors N(0, 0.1).
type randomSource struct{ rng *rand.Rand }

func (randomSource) Names() []string { return nil }

// Has says yes to every tensor but a separate MTP head: a random model's MTP layer
// shares lm_head.
func (randomSource) Has(name string) bool { return !strings.HasSuffix(name, "shared_head.head.weight") }
func (s randomSource) Float32(name string, shape ...int) ([]float32, error) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		z := float32(s.rng.NormFloat64())
		switch {
		case len(shape) >= 2:
			v[i] = z / float32(math.Sqrt(float64(shape[len(shape)-1])))
		case strings.HasSuffix(name, "norm.weight"):
			v[i] = 1 + 0.1*z
		case strings.HasSuffix(name, "scale"):
			v[i] = 1
		case strings.HasSuffix(name, "dt_bias"):
			v[i] = -3 + 0.1*z
		default:
			v[i] = 0.1 * z
		}
	}
	return v, nil
}

// RandomTextModel is a model of config c with seeded random weights.
func RandomTextModel(c *TextConfig, seed uint64) (*TextModel, error) {
	w, _, err := loadTextWeights(randomSource{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}, c)
	if err != nil {
		return nil, err
	}
	return &TextModel{Config: c, W: w}, nil
}

// LoadText opens the model in dir: config.json and its safetensors weights, or, when dir
// holds no safetensors, seeded random weights of the config.
func LoadText(dir string, pageTokens int, seed uint64) (*TextRunner, error) {
	c, err := LoadTextConfig(dir)
	if err != nil {
		return nil, err
	}
	var m *TextModel
	ck, err := weights.Open(dir)
	switch {
	case err == nil:
		ck.Close()
		m, err = LoadTextModel(dir)
	case errors.Is(err, weights.ErrNotFound):
		if seed == 0 {
			seed = 1
		}
		m, err = RandomTextModel(c, seed)
	}
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	return NewTextRunner(m, pageTokens, 0), nil
}
