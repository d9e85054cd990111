"""Writes GLM-5.3-Flash (glm5_next) goldens for models/glm-5-flash: what transformers
5.23.0's Glm5NextConfig makes of nested (text_config + vision_config), flat and legacy
config.json forms.

Run through scripts/glm5-goldens.sh, which installs the pinned torch and transformers into
.cache/torch-venv.

  glm5-goldens.py [--out models/glm-5-flash/testdata] [--only-config]

Writes OUT/config_cases.json: per case the input dict and either the normalised text-model
fields ("want", read from config.text_config, plus the top-level tie_word_embeddings) or
the error transformers raised.
"""
import argparse
import json
import os

import transformers
from transformers import Glm5NextConfig

# Every Glm5NextTextConfig attribute the text model reads (modeling_glm5_next.py, text
# classes), plus the derived qk_head_dim.
FIELDS = ["vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
          "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "n_shared_experts",
          "n_routed_experts", "routed_scaling_factor", "kv_lora_rank", "q_lora_rank",
          "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "qk_head_dim", "head_dim",
          "n_group", "topk_group", "num_experts_per_tok", "norm_topk_prob", "hidden_act",
          "max_position_embeddings", "rms_norm_eps", "pad_token_id", "bos_token_id",
          "eos_token_id", "mlp_layer_types", "attention_bias", "index_topk", "index_head_dim",
          "index_n_heads", "layer_types", "indexer_types", "swiglu_limit", "linear_head_dim",
          "linear_num_heads", "linear_conv_kernel_dim", "linear_lower_bound", "hc_mult",
          "hc_eps", "hc_sinkhorn_iters", "index_kpool", "index_kpool_always_select_tail"]

# A GLM-5.3-Flash-shaped config.json (nested, as the published checkpoint layout has it;
# the vision tower's fields are what Glm5NextVisionConfig defaults to).
NESTED = {
    "architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
    "text_config": {"model_type": "glm5_next_text", "num_hidden_layers": 45,
                    "rms_norm_eps": 1e-5, "eos_token_id": [154820, 154827, 154829]},
    "vision_config": {"model_type": "glm5_next_vision", "depth": 24},
    "image_token_id": 154854, "tie_word_embeddings": False,
}

CONFIG_CASES = {
    "nested-defaults": NESTED,
    "top-defaults": {"model_type": "glm5_next"},
    "flat-defaults": {"model_type": "glm5_next", "num_hidden_layers": 45},
    "flat-5-layers": {"model_type": "glm5_next", "num_hidden_layers": 5, "vocab_size": 300},
    "flat-2-layers": {"model_type": "glm5_next", "num_hidden_layers": 2},
    "nested-tiny": {"model_type": "glm5_next",
                    "text_config": {"num_hidden_layers": 6, "hidden_size": 64, "vocab_size": 200,
                                    "num_attention_heads": 4, "num_key_value_heads": 4,
                                    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
                                    "v_head_dim": 8, "index_topk": 16, "index_kpool": 4,
                                    "index_n_heads": 8, "index_head_dim": 16,
                                    "linear_num_heads": 2, "linear_head_dim": 16,
                                    "n_routed_experts": 8, "num_experts_per_tok": 2,
                                    "n_group": 2, "topk_group": 1, "moe_intermediate_size": 16,
                                    "intermediate_size": 48, "hc_mult": 2,
                                    "tie_word_embeddings": True},
                    "vision_config": {"depth": 1, "hidden_size": 32}},
    "full-attention-mapped": {"model_type": "glm5_next", "num_hidden_layers": 4,
                              "layer_types": ["linear_attention", "full_attention",
                                              "indexed_attention", "linear_attention"]},
    "topk-pattern": {"model_type": "glm5_next", "num_hidden_layers": 8,
                     "layer_types": ["linear_attention", "indexed_attention", "indexed_attention",
                                     "indexed_attention", "linear_attention", "indexed_attention",
                                     "indexed_attention", "linear_attention"],
                     "index_topk_pattern": "FFSFSFSF"},
    "topk-freq": {"model_type": "glm5_next", "num_hidden_layers": 8, "index_topk_freq": 2,
                  "index_skip_topk_offset": 1,
                  "layer_types": ["indexed_attention"] * 8},
    "explicit-indexer-types": {"model_type": "glm5_next", "num_hidden_layers": 4,
                               "layer_types": ["linear_attention", "indexed_attention",
                                               "indexed_attention", "linear_attention"],
                               "indexer_types": ["full", "full", "shared", "full"],
                               "mlp_layer_types": ["dense", "sparse", "sparse", "dense"]},
    "legacy-linear-attn-config": {"model_type": "glm5_next", "num_hidden_layers": 4,
                                  "linear_attn_config": {"head_dim": 32, "num_heads": 8,
                                                         "short_conv_kernel_size": 3,
                                                         "gate_lower_bound": -3.0}},
    "legacy-linear-attn-no-bound": {"model_type": "glm5_next", "num_hidden_layers": 4,
                                    "linear_lower_bound": None,
                                    "linear_attn_config": {"gate_lower_bound": None}},
    "legacy-linear-attn-unsafe": {"model_type": "glm5_next", "num_hidden_layers": 4,
                                  "linear_lower_bound": None,
                                  "linear_attn_config": {"gate_lower_bound": None, "safe_gate": False}},
    "head-dim-ignored": {"model_type": "glm5_next", "num_hidden_layers": 4, "head_dim": 128},
    "kv-heads-none": {"model_type": "glm5_next", "num_hidden_layers": 4, "num_attention_heads": 8,
                      "num_key_value_heads": None},
    "eos-list-bos": {"model_type": "glm5_next", "num_hidden_layers": 4, "bos_token_id": 3,
                     "eos_token_id": [1, 7], "pad_token_id": None},
    # What transformers refuses.
    "bad-layer-type": {"model_type": "glm5_next", "num_hidden_layers": 2,
                       "layer_types": ["linear_attention", "sliding_attention"]},
    "layer-types-too-long": {"model_type": "glm5_next", "num_hidden_layers": 2,
                             "layer_types": ["linear_attention"] * 3},
    "bad-mlp-layer-type": {"model_type": "glm5_next", "num_hidden_layers": 2,
                           "mlp_layer_types": ["dense", "moe"]},
    "kv-heads-differ": {"model_type": "glm5_next", "num_hidden_layers": 2, "num_key_value_heads": 8},
    "rope-dim": {"model_type": "glm5_next", "num_hidden_layers": 2, "qk_rope_head_dim": 64},
    "topk-not-pool-multiple": {"model_type": "glm5_next", "num_hidden_layers": 2,
                               "index_topk": 20, "index_kpool": 16},
    "kpool-zero": {"model_type": "glm5_next", "num_hidden_layers": 2, "index_kpool": 0},
    "q-lora-none": {"model_type": "glm5_next", "num_hidden_layers": 2, "q_lora_rank": None},
    # Accepted by transformers, refused here by design (the Go test names the field).
    "shared-after-linear": {"model_type": "glm5_next", "num_hidden_layers": 4,
                            "layer_types": ["linear_attention", "indexed_attention",
                                            "linear_attention", "indexed_attention"],
                            "indexer_types": ["full", "full", "full", "shared"]},
    "unknown-indexer-type": {"model_type": "glm5_next", "num_hidden_layers": 2,
                             "indexer_types": ["full", "dense"]},
}


def config_cases():
    out = {}
    for name, d in CONFIG_CASES.items():
        try:
            c = Glm5NextConfig(**json.loads(json.dumps(d)))
            t = c.text_config
            got = {k: getattr(t, k, None) for k in FIELDS}
            got["tie_word_embeddings"] = c.tie_word_embeddings
            out[name] = {"input": d, "want": got}
        except Exception as e:  # noqa: BLE001 - the error is the expectation
            out[name] = {"input": d, "error": f"{type(e).__name__}: {e}"}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "models", "glm-5-flash", "testdata"))
    ap.add_argument("--only-config", action="store_true")
    args = ap.parse_args()
    assert transformers.__version__ == "5.23.0", transformers.__version__
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config_cases.json"), "w") as f:
        json.dump(config_cases(), f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
