package qwen3tiny

import (
	"fmt"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
)

// DenseConfig describes the model to core/gpurunner's dense GPU model: its sizes, its
// rotary table for maxContext positions and its cache page size.
func (c *Config) DenseConfig(maxContext, pageTokens int) (*gpurunner.DenseConfig, error) {
	rope, err := c.RopeTable(maxContext)
	if err != nil {
		return nil, err
	}
	if pageTokens <= 0 {
		pageTokens = 16
	}
	return &gpurunner.DenseConfig{
		Name: Name, Vocab: c.VocabSize, Hidden: c.HiddenSize, Layers: c.NumHiddenLayers,
		Heads: c.NumAttentionHeads, KVHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim, Intermediate: c.IntermediateSize,
		RMSNormEps: float32(c.RMSNormEps), QKVBias: c.QKVBias, OBias: c.OBias, QKNorm: c.QKNorm, Window: c.Window,
		TiedEmbeddings: c.TieWordEmbeddings, MaxContext: rope.MaxPos, PageTokens: pageTokens,
		RopeCos: rope.Cos, RopeSin: rope.Sin, RopeDim: rope.Dim, EOS: c.EOSTokenID,
	}, nil
}

// DenseWeights views the weights as core/gpurunner's host weights (no copy).
func (w *Weights) DenseWeights() *gpurunner.DenseWeights {
	d := &gpurunner.DenseWeights{Embed: w.Embed, Norm: w.Norm, Head: w.Head, Layers: make([]gpurunner.DenseLayer, len(w.Layers))}
	for i := range w.Layers {
		l := &w.Layers[i]
		d.Layers[i] = gpurunner.DenseLayer{
			AttnNorm: l.AttnNorm, MLPNorm: l.MLPNorm, Q: l.Q, K: l.K, V: l.V, O: l.O,
			QBias: l.QBias, KBias: l.KBias, VBias: l.VBias, OBias: l.OBias, QNorm: l.QNorm, KNorm: l.KNorm,
			Gate: l.Gate, Up: l.Up, Down: l.Down,
		}
	}
	return d
}

// OpenGPU loads the model in dir (a checkpoint, or seeded random weights of its
// config.json) and uploads it to the GPU as core/gpurunner's dense model, with a device
// cache pool of cacheBytes (0: gpurunner's default): `--device cuda`.
func OpenGPU(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return nil, nil, fmt.Errorf("%s on the GPU: %w", Name, err)
	}
	r, err := Load(dir, Options{})
	if err != nil {
		return nil, nil, err
	}
	cfg, err := r.Model.Config.DenseConfig(r.Model.MaxContext(), r.pageTokens)
	if err != nil {
		return nil, nil, err
	}
	opts.CacheBytes = cacheBytes
	gr, pool, err := gpurunner.NewDense(cfg, r.Model.W.DenseWeights(), opts)
	if err != nil {
		return nil, nil, fmt.Errorf("%s on the GPU: %w", Name, err)
	}
	return gr, pool, nil
}
