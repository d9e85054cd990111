package main

import (
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/dist/tp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/models/llama"
)

// llamaTPModel is llama's model as the TP ranks load it: from a checkpoint each rank reads
// only its slices (tp.LoadShard over weights.Checkpoint's row and column reads); from a
// config alone the seeded random weights llama.Load would build are made whole and cut.
type llamaTPModel struct {
	c    *llama.Config
	d    tp.Dense
	info engine.RunnerInfo
	dir  string      // the checkpoint's directory; "" for random weights
	w    *tp.Weights // the random weights; nil with a checkpoint
}

// openLlamaTP reads dir's config and, without safetensors there, builds its random
// weights (seed 1, as llama.Load); a checkpoint's tensors are read by each rank's shard.
func openLlamaTP(dir string) (*llamaTPModel, error) {
	c, err := llama.LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	maxCtx := min(c.MaxPositionEmbeddings, 4096) // llama.Load's default
	if maxCtx <= 1 {
		maxCtx = 4096
	}
	rope, err := c.RopeTable(maxCtx)
	if err != nil {
		return nil, err
	}
	m := &llamaTPModel{c: c, dir: dir}
	m.d = tp.Dense{Hidden: c.HiddenSize, HeadDim: c.HeadDim, Heads: c.NumAttentionHeads, KVHeads: c.NumKeyValueHeads,
		Inter: c.IntermediateSize, Vocab: c.VocabSize, Layers: c.NumHiddenLayers, Eps: float32(c.RMSNormEps),
		QKNorm: c.QKNorm, Window: c.Window, Rope: rope}
	m.info = engine.RunnerInfo{Name: llama.Name, VocabSize: c.VocabSize, MaxContext: maxCtx, EOS: c.EOSTokenID,
		CacheGroups: llama.CacheGroups(c, 16)}
	ck, err := weights.Open(dir)
	switch {
	case err == nil:
		ck.Close()
		return m, nil
	case !errors.Is(err, weights.ErrNotFound):
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	if err := weights.CheckMemory(llama.WeightBytes(c), "seeded random weights of "+dir); err != nil {
		return nil, err
	}
	lw := llama.RandomWeights(c, 1)
	m.dir, m.w = "", &tp.Weights{Embed: lw.Embed, Norm: lw.Norm, Head: lw.Head}
	for _, l := range lw.Layers {
		m.w.Layers = append(m.w.Layers, tp.Layer{AttnNorm: l.AttnNorm, MLPNorm: l.MLPNorm, Q: l.Q, K: l.K, V: l.V, O: l.O,
			QBias: l.QBias, KBias: l.KBias, VBias: l.VBias, OBias: l.OBias, QNorm: l.QNorm, KNorm: l.KNorm,
			Gate: l.Gate, Up: l.Up, Down: l.Down})
	}
	return m, nil
}

// Info is the engine's view of the model (llama.Runner's, with 16-token pages).
func (m *llamaTPModel) Info() engine.RunnerInfo { return m.info }

// NewPool builds the engine's host pool of llama's cache groups (bytes 0: 256 MiB).
func (m *llamaTPModel) NewPool(bytes int64) (*kvslab.Pool, error) {
	pool, err := engine.NewHostPool(m.info.CacheGroups, bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: cache pool: %w", llama.Name, err)
	}
	return pool, nil
}

// shard returns rank's shard of size ranks: read from the checkpoint (only its slices) or
// cut from the random weights.
func (m *llamaTPModel) shard(rank, size int) (*tp.Shard, error) {
	if m.w != nil {
		return tp.NewShard(m.d, m.w, rank, size)
	}
	ck, err := weights.Open(m.dir)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	s, err := tp.LoadShard(m.d, ck, rank, size)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", m.dir, err)
	}
	return s, nil
}

// shards returns the shards of every rank of size.
func (m *llamaTPModel) shards(size int) ([]*tp.Shard, error) {
	out := make([]*tp.Shard, size)
	for r := range size {
		var err error
		if out[r], err = m.shard(r, size); err != nil {
			return nil, err
		}
	}
	return out, nil
}
