package main

import (
	"fmt"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/tp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models/llama"
)

// openTP opens the llama checkpoint (or random-weights config) in dir with tensor
// parallelism over size in-process ranks (core/dist/tp): rank 0's forward serves the
// engine and broadcasts each plan to the others. The engine's pool keeps llama's cache
// groups, whose page ids the ranks' own caches follow.
func openTP(dir string, cacheBytes int64, size int) (engine.Runner, *kvslab.Pool, error) {
	r, err := llama.Load(dir, llama.Options{})
	if err != nil {
		return nil, nil, err
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	d, w, err := llamaTP(r.Model)
	if err != nil {
		return nil, nil, err
	}
	g, err := tp.StartInProcess(d, w, size, tp.CachePages(d, pool), pool.BlockTokens(), dist.Options{Timeout: time.Minute})
	if err != nil {
		return nil, nil, fmt.Errorf("--tp %d: %w", size, err)
	}
	return cpurunner.New(r.Info(), cpurunner.ForwardFunc(g.Forward)), pool, nil
}

// llamaTP describes a loaded llama model for core/dist/tp.
func llamaTP(m *llama.Model) (tp.Dense, *tp.Weights, error) {
	c := m.Config
	rope, err := c.RopeTable(m.MaxContext())
	if err != nil {
		return tp.Dense{}, nil, err
	}
	d := tp.Dense{Hidden: c.HiddenSize, HeadDim: c.HeadDim, Heads: c.NumAttentionHeads, KVHeads: c.NumKeyValueHeads,
		Inter: c.IntermediateSize, Vocab: c.VocabSize, Layers: c.NumHiddenLayers, Eps: float32(c.RMSNormEps),
		QKNorm: c.QKNorm, Window: c.Window, Rope: rope}
	w := &tp.Weights{Embed: m.W.Embed, Norm: m.W.Norm, Head: m.W.Head}
	for _, l := range m.W.Layers {
		w.Layers = append(w.Layers, tp.Layer{AttnNorm: l.AttnNorm, MLPNorm: l.MLPNorm, Q: l.Q, K: l.K, V: l.V, O: l.O,
			QBias: l.QBias, KBias: l.KBias, VBias: l.VBias, OBias: l.OBias, QNorm: l.QNorm, KNorm: l.KNorm,
			Gate: l.Gate, Up: l.Up, Down: l.Down})
	}
	return d, w, nil
}
