package deepseekv4flash

import (
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// tinyConfigJSON is a small DeepSeek-V4 crossing every layer kind: sliding, CSA (ratio 4)
// and HCA (ratio 8), hash and learned routing, an indexer whose top-k cuts.
const tinyConfigJSON = `{
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 96, "hidden_size": 32, "moe_intermediate_size": 16, "num_hidden_layers": 4,
  "num_attention_heads": 4, "head_dim": 16, "q_lora_rank": 16, "num_experts_per_tok": 2,
  "n_routed_experts": 4, "o_groups": 2, "o_lora_rank": 8, "index_n_heads": 8,
  "index_head_dim": 8, "index_topk": 3, "sliding_window": 8, "hc_mult": 2,
  "partial_rotary_factor": 0.5, "swiglu_limit": 1.0, "max_position_embeddings": 512,
  "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention", "compressed_sparse_attention"],
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
  "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"]
}`

func tinyConfig(t testing.TB) *Config {
	t.Helper()
	c, err := ParseConfig([]byte(tinyConfigJSON))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func tinyModel(t testing.TB) *Model {
	t.Helper()
	c := tinyConfig(t)
	m, err := NewModel(c, RandomWeights(c, 7, true), 512)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// testRunner is the runner the conformance suite (conformance_test.go) drives.
func testRunner(t testing.TB) (engine.Runner, *kvslab.Pool) {
	t.Helper()
	r := NewRunner(tinyModel(t), 8)
	pool, err := r.NewPool(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	return r, pool
}
