package gpurunner

import (
	"fmt"

	"github.com/resin-llm/resin/core/dist/tp"
)

// DenseShard gives rank's part of a dense model for a group of size ranks: its config and
// its weights, laid out as ShardDense cuts them. NewDenseTPShards calls it once per rank,
// in rank order, and uploads each part before it asks for the next, so the host holds
// one rank's weights at a time.
type DenseShard func(rank, size int) (*DenseConfig, *DenseWeights, error)

// CutDense is the DenseShard of a whole model in memory (ShardDense).
func CutDense(cfg *DenseConfig, w *DenseWeights) DenseShard {
	return func(rank, size int) (*DenseConfig, *DenseWeights, error) { return ShardDense(cfg, w, rank, size) }
}

// ReadDense is the DenseShard of a checkpoint: each rank reads only its slices of src
// (LoadDenseShard).
func ReadDense(cfg *DenseConfig, src tp.Source) DenseShard {
	return func(rank, size int) (*DenseConfig, *DenseWeights, error) { return LoadDenseShard(cfg, src, rank, size) }
}

// LoadDenseShard reads rank's part of the llama-family model cfg describes from src (its
// tensors by their Hugging Face names, as core/dist/tp.LoadShard reads them; a
// weights.Checkpoint reads only the bytes of each slice): the rows of q/k/v (and their
// biases) and gate/up, the columns of o and down, its vocab shard's rows of the embedding
// and the head padded with zero rows (VocabParallel), the norms and the o bias whole.
// What it returns is what ShardDense cuts from the whole model.
func LoadDenseShard(cfg *DenseConfig, src tp.Source, rank, size int) (*DenseConfig, *DenseWeights, error) {
	sc, lo, hi, err := shardConfig(cfg, rank, size)
	if err != nil {
		return nil, nil, err
	}
	h, hd, v := cfg.Hidden, cfg.HeadDim, cfg.Vocab
	qd, kvd := cfg.QDim(), cfg.KVDim()
	ql, kl, il := sc.Heads*hd, sc.KVHeads*hd, sc.Intermediate
	q0, k0, i0 := rank*ql, rank*kl, rank*il
	// read keeps the first error; the reads after it are not used.
	read := func(x []float32, e error) []float32 {
		if err == nil && e != nil {
			err = e
		}
		return x
	}
	vocab := func(name string) []float32 {
		x := read(src.Float32Rows(name, lo, hi, v, h))
		if size > 1 && err == nil {
			x = padRows(x, sc.VocabShard*h)
		}
		return x
	}
	w := &DenseWeights{Embed: vocab("model.embed_tokens.weight"), Norm: read(src.Float32("model.norm.weight", h))}
	w.Head = w.Embed
	if !cfg.TiedEmbeddings {
		if !src.Has("lm_head.weight") {
			return nil, nil, fmt.Errorf("gpurunner: tp rank %d of %d: no lm_head.weight and the config does not tie the embeddings", rank, size)
		}
		w.Head = vocab("lm_head.weight")
	}
	for l := range cfg.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		ly := DenseLayer{
			AttnNorm: read(src.Float32(p+"input_layernorm.weight", h)),
			MLPNorm:  read(src.Float32(p+"post_attention_layernorm.weight", h)),
			Q:        read(src.Float32Rows(p+"self_attn.q_proj.weight", q0, q0+ql, qd, h)),
			K:        read(src.Float32Rows(p+"self_attn.k_proj.weight", k0, k0+kl, kvd, h)),
			V:        read(src.Float32Rows(p+"self_attn.v_proj.weight", k0, k0+kl, kvd, h)),
			O:        read(src.Float32Cols(p+"self_attn.o_proj.weight", q0, q0+ql, h, qd)),
			Gate:     read(src.Float32Rows(p+"mlp.gate_proj.weight", i0, i0+il, cfg.Intermediate, h)),
			Up:       read(src.Float32Rows(p+"mlp.up_proj.weight", i0, i0+il, cfg.Intermediate, h)),
			Down:     read(src.Float32Cols(p+"mlp.down_proj.weight", i0, i0+il, h, cfg.Intermediate)),
		}
		if cfg.QKVBias {
			ly.QBias = read(src.Float32Rows(p+"self_attn.q_proj.bias", q0, q0+ql, qd))
			ly.KBias = read(src.Float32Rows(p+"self_attn.k_proj.bias", k0, k0+kl, kvd))
			ly.VBias = read(src.Float32Rows(p+"self_attn.v_proj.bias", k0, k0+kl, kvd))
		}
		if cfg.OBias {
			ly.OBias = read(src.Float32(p+"self_attn.o_proj.bias", h))
		}
		if cfg.QKNorm {
			ly.QNorm = read(src.Float32(p+"self_attn.q_norm.weight", hd))
			ly.KNorm = read(src.Float32(p+"self_attn.k_norm.weight", hd))
		}
		w.Layers = append(w.Layers, ly)
		if err != nil {
			break
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("gpurunner: tp rank %d of %d: %w", rank, size, err)
	}
	if err := w.Check(&sc); err != nil {
		return nil, nil, fmt.Errorf("gpurunner: tp rank %d of %d: %w", rank, size, err)
	}
	return &sc, w, nil
}
