"""Writes DeepSeek-V4 goldens for models/deepseek-v4-flash: what transformers 5.23.0's
DeepseekV4Config makes of several legacy and current config.json forms, and tiny
checkpoints with the logits transformers computes for them (torch on the CPU, float32,
eager attention).

Run through scripts/deepseek-v4-goldens.sh, which installs the pinned torch and
transformers into .cache/torch-venv.

  deepseek-v4-goldens.py [--out models/deepseek-v4-flash/testdata]

Writes OUT/config_cases.json (input dict -> normalised fields, or the error) and
OUT/parity/<case>/{config.json, model.safetensors, logits.safetensors}; logits.safetensors
holds token_ids (I32 [T]), logits (F32 [T, vocab]) and, when the checkpoint has mtp.*
weights, mtp_logits (F32 [T-1, vocab]): the MTP head's logits at positions 0..T-2, computed
here from the checkpoint layout (transformers drops mtp.*), see mtp_reference below.
"""
import argparse
import json
import math
import os
import shutil
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

FIELDS = ["vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "q_lora_rank",
          "num_experts_per_tok", "n_routed_experts", "n_shared_experts", "scoring_func",
          "norm_topk_prob", "routed_scaling_factor", "max_position_embeddings", "rope_theta",
          "layer_types", "compress_rates", "compress_rope_theta", "hc_mult",
          "hc_sinkhorn_iters", "hc_eps", "mlp_layer_types", "swiglu_limit", "sliding_window",
          "o_groups", "o_lora_rank", "index_n_heads", "index_head_dim", "index_topk",
          "num_nextn_predict_layers", "hidden_act", "rms_norm_eps", "bos_token_id",
          "eos_token_id", "pad_token_id", "tie_word_embeddings", "rope_parameters",
          "partial_rotary_factor", "qk_rope_head_dim", "attention_bias", "mlp_bias"]

YARN = {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
        "beta_fast": 32, "beta_slow": 1}

# DeepSeek-V4-Flash's config.json as published (upstream fields: compress_ratios 44 long for
# 43 layers, num_hash_layers, qk_rope_head_dim, rope_scaling yarn), less the fields no
# code reads.
V4_FLASH = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "expert_dtype": "fp4", "hc_eps": 1e-06, "hc_mult": 4, "hc_sinkhorn_iters": 20, "head_dim": 512,
    "hidden_act": "silu", "hidden_size": 4096, "index_head_dim": 128, "index_n_heads": 64,
    "index_topk": 512, "initializer_range": 0.02, "max_position_embeddings": 1048576,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 64, "num_experts_per_tok": 6,
    "num_hidden_layers": 43, "num_hash_layers": 3, "num_key_value_heads": 1,
    "num_nextn_predict_layers": 1, "o_groups": 8, "o_lora_rank": 1024, "q_lora_rank": 1024,
    "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                     "original_max_position_embeddings": 65536, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus",
    "sliding_window": 128, "swiglu_limit": 10.0, "tie_word_embeddings": False,
    "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 129280,
    "compress_rope_theta": 160000, "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
}

CONFIG_CASES = {
    "deepseek-v4-flash": V4_FLASH,
    "defaults": {},
    "defaults-5-layers": {"num_hidden_layers": 5},
    "defaults-1-layer": {"num_hidden_layers": 1},
    # The upstream checkpoint's legacy fields.
    "legacy": {"num_hidden_layers": 5, "compress_ratios": [0, 0, 4, 128, 4],
               "compress_rate_csa": 4, "compress_rate_hca": 16, "num_hash_layers": 2,
               "qk_rope_head_dim": 16, "head_dim": 64, "rope_scaling": dict(YARN)},
    "legacy-hca-only": {"num_hidden_layers": 3, "compress_rate_hca": 32},
    "current": {"num_hidden_layers": 4,
                "layer_types": ["sliding_attention", "compressed_sparse_attention",
                                "heavily_compressed_attention", "compressed_sparse_attention"],
                "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
                "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
                "partial_rotary_factor": 0.25, "head_dim": 64,
                "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                                    "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 64,
                                                 "partial_rotary_factor": 0.25, "attention_factor": 1.0},
                                    "rope_theta": 5.0}},
    "flat-rope-parameters": {"num_hidden_layers": 2, "rope_theta": 20000.0,
                             "rope_parameters": {"rope_type": "yarn", "factor": 8.0,
                                                 "original_max_position_embeddings": 4096,
                                                 "rope_theta": 30000.0}},
    "rope-scaling-default": {"num_hidden_layers": 2, "compress_rope_theta": 40000.0,
                             "rope_scaling": {"type": "default"}},
    "eos-list": {"num_hidden_layers": 2, "eos_token_id": [1, 7], "bos_token_id": None,
                 "tie_word_embeddings": True, "scoring_func": "sigmoid"},
    "layer-types-too-long": {"num_hidden_layers": 2,
                             "layer_types": ["sliding_attention"] * 3},
    "bad-layer-type": {"num_hidden_layers": 2,
                       "layer_types": ["sliding_attention", "full_attention"]},
    "bad-compress-ratio": {"num_hidden_layers": 2, "compress_ratios": [0, 8]},
    "bad-mlp-layer-type": {"num_hidden_layers": 2, "mlp_layer_types": ["moe", "dense"]},
    "flat-rope-theta-only": {"num_hidden_layers": 2,
                             "rope_parameters": {"rope_type": "default", "rope_theta": 30000.0}},
    "nested-no-partial": {"num_hidden_layers": 2, "head_dim": 64,
                          "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 1000.0},
                                              "compress": {"rope_type": "default", "rope_theta": 2000.0,
                                                           "partial_rotary_factor": 0.5}}},
    "layer-types-too-short": {"num_hidden_layers": 3, "layer_types": ["sliding_attention"] * 2},
    "unknown-rope-type": {"num_hidden_layers": 2, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192}},
    "hash-layers-beyond": {"num_hidden_layers": 2, "num_hash_layers": 5},
}


def config_cases():
    out = {}
    for name, d in CONFIG_CASES.items():
        try:
            c = DeepseekV4Config(**json.loads(json.dumps(d)))
            got = {k: getattr(c, k, None) for k in FIELDS}
            case = {"input": d, "want": got}
            if all(c.rope_parameters[k]["rope_type"] in ("default", "yarn") for k in ("main", "compress")):
                from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding
                rot = DeepseekV4RotaryEmbedding(c)
                case["rotary"] = {k: {"inv_freq": getattr(rot, f"{k}_inv_freq").tolist(),
                                      "scaling": getattr(rot, f"{k}_attention_scaling")}
                                  for k in ("main", "compress")}
            out[name] = case
        except Exception as e:  # noqa: BLE001 - the error is the expectation
            out[name] = {"input": d, "error": f"{type(e).__name__}: {e}"}
    return out


# Tiny models that cross every code path: all three layer kinds, CSA ratio 4, HCA ratio
# 16/32, sliding window 16 (12 in one case), windows closing inside and between chunks of
# the Go tests, hash and learned routing, shared expert, an active SwiGLU clamp, sinks, an
# indexer top-k that cuts (index_topk well below the ~50 CSA entries of 200 tokens), the
# MTP head. Each case is written in one of the three tensor name forms.
TINY = dict(vocab_size=128, hidden_size=32, moe_intermediate_size=16, num_attention_heads=4,
            head_dim=32, q_lora_rank=24, num_experts_per_tok=2, n_routed_experts=6,
            o_groups=2, o_lora_rank=16, index_n_heads=8, index_head_dim=16, index_topk=6,
            sliding_window=16, hc_mult=4, hc_sinkhorn_iters=20, swiglu_limit=1.0,
            max_position_embeddings=4096, rms_norm_eps=1e-6, num_nextn_predict_layers=1)

CASES = {
    # Current config fields, module (state_dict) names, packed experts.
    "module": ("module", dict(TINY, num_hidden_layers=5, partial_rotary_factor=0.5,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention", "heavily_compressed_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"])),
    # The upstream checkpoint's legacy fields and names (per-expert w1/w2/w3), YaRN on the
    # compress rotary, HCA ratio 32.
    "upstream": ("upstream", dict(TINY, num_hidden_layers=4, compress_ratios=[4, 0, 128, 4],
        compress_rate_hca=32, num_hash_layers=1, qk_rope_head_dim=8,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                      "beta_fast": 32, "beta_slow": 1})),
    # save_pretrained's hybrid names, tied embeddings, sigmoid scoring, hc_mult 2, window 12.
    "hybrid": ("hybrid", dict(TINY, num_hidden_layers=3, hc_mult=2, sliding_window=12,
        scoring_func="sigmoid", tie_word_embeddings=True, partial_rotary_factor=0.25,
        layer_types=["heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        mlp_layer_types=["moe", "hash_moe", "moe"])),
}
SEQ_LEN = 200


def perturb(module, gen):
    """Moves every tensor off its init: Linear-like weights N(0, 1/fan_in) (the indexer's
    weights_proj N(0, 1)), norm weights
    1+N(0, 0.1), biases/sinks/position biases/correction biases N(0, 0.1), hc scales
    1+N(0, 0.3), tid2eid distinct random experts per token."""
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            leaf = name.rsplit(".", 1)[-1]
            if "inv_freq" in name:
                continue
            if leaf == "tid2eid":
                k = t.shape[1]
                e = module.config.n_routed_experts if hasattr(module, "config") else None
                rows = [torch.randperm(NUM_EXPERTS, generator=gen)[:k] for _ in range(t.shape[0])]
                t.copy_(torch.stack(rows))
            elif name.endswith("norm.weight") or "layernorm" in name:
                t.copy_(1 + 0.1 * torch.randn(t.shape, generator=gen))
            elif leaf in ("sinks", "position_bias", "e_score_correction_bias", "base", "hc_base"):
                t.copy_(0.1 * torch.randn(t.shape, generator=gen))
            elif leaf in ("scale", "hc_scale"):
                t.copy_(1 + 0.3 * torch.randn(t.shape, generator=gen))
            elif name.endswith("weights_proj.weight"):
                # Indexer head weights large enough that the top-k cuts are clear of ties
                # (the test checks the margin at each cut).
                t.copy_(torch.randn(t.shape, generator=gen))
            elif name.endswith("embed_tokens.weight"):
                t.copy_(torch.randn(t.shape, generator=gen))
            else:
                t.copy_(torch.randn(t.shape, generator=gen) / math.sqrt(t.shape[-1]))


NUM_EXPERTS = TINY["n_routed_experts"]


def sliding_mask(n, window):
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    ok = (j <= i) & (j > i - window)
    return torch.where(ok, 0.0, float("-inf"))[None, None]


def mtp_module(config, gen):
    """The MTP head in the checkpoint layout (vLLM/SGLang's DeepSeek-V4 MTP as the
    upstream reference describes it): e_proj, h_proj, enorm, hnorm, one decoder block with
    sliding attention and a learned-routing MoE, its own hc_head and norm; the embedding
    and lm_head are the main model's."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import (
        DeepseekV4DecoderLayer, DeepseekV4HyperHead, DeepseekV4RMSNorm)
    d = config.to_dict()
    d.update(num_hidden_layers=1, layer_types=["sliding_attention"], mlp_layer_types=["moe"])
    for k in ("qk_rope_head_dim", "transformers_version", "model_type"):
        d.pop(k, None)
    c1 = DeepseekV4Config(**d)
    h = config.hidden_size
    mtp = torch.nn.Module()
    mtp.config = c1
    mtp.e_proj = torch.nn.Linear(h, h, bias=False)
    mtp.h_proj = torch.nn.Linear(h, h, bias=False)
    mtp.enorm = DeepseekV4RMSNorm(h, eps=config.rms_norm_eps)
    mtp.hnorm = DeepseekV4RMSNorm(h, eps=config.rms_norm_eps)
    mtp.norm = DeepseekV4RMSNorm(h, eps=config.rms_norm_eps)
    mtp.block = DeepseekV4DecoderLayer(c1, 0)
    mtp.hc_head = DeepseekV4HyperHead(c1)
    perturb(mtp, gen)
    return mtp, c1


def mtp_tensors(mtp, c1, tmp):
    """mtp.0.* tensors in upstream names: the block's names come from save_pretrained of a
    one-layer model holding it."""
    m1 = DeepseekV4ForCausalLM(c1)
    m1.model.layers[0].load_state_dict(mtp.block.state_dict())
    m1.save_pretrained(tmp)
    sd = load_file(os.path.join(tmp, "model.safetensors"))
    out = {"mtp.0." + k[len("model.layers.0."):]: v for k, v in sd.items() if k.startswith("model.layers.0.")}
    out.update({
        "mtp.0.e_proj.weight": mtp.e_proj.weight, "mtp.0.h_proj.weight": mtp.h_proj.weight,
        "mtp.0.enorm.weight": mtp.enorm.weight, "mtp.0.hnorm.weight": mtp.hnorm.weight,
        "mtp.0.norm.weight": mtp.norm.weight, "mtp.0.hc_head_fn": mtp.hc_head.hc_fn,
        "mtp.0.hc_head_base": mtp.hc_head.hc_base, "mtp.0.hc_head_scale": mtp.hc_head.hc_scale,
    })
    return {k: v.detach().contiguous() for k, v in out.items()}


def mtp_logits(model, mtp, c1, ids, streams):
    """MTP logits at positions 0..T-2: row t reads the main model's final streams at t and
    the embedding of token t+1, at position t (vLLM's convention), and predicts token t+2."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding
    n = ids.shape[0] - 1
    e = mtp.enorm(model.model.embed_tokens(ids[1:]))[None]           # [1, n, D]
    hs = mtp.hnorm(streams[:, :n])                                    # [1, n, hc, D]
    x = mtp.e_proj(e).unsqueeze(2) + mtp.h_proj(hs)
    pos = torch.arange(n)[None]
    rot = DeepseekV4RotaryEmbedding(c1)
    pe = {k: rot(x, pos, layer_type=k) for k in ("main", "compress")}
    y = mtp.block(x, position_embeddings=pe, position_ids=pos,
                  attention_mask=sliding_mask(n, c1.sliding_window), input_ids=None, past_key_values=None)
    return model.lm_head(mtp.norm(mtp.hc_head(y)))[0]


def write_form(model, form, case_dir, tmp):
    """Writes model.safetensors in one of the three name forms transformers loads."""
    path = os.path.join(case_dir, "model.safetensors")
    if form == "module":
        sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        return sd
    model.save_pretrained(tmp)
    sd = load_file(os.path.join(tmp, "model.safetensors"))
    if form == "hybrid":
        return sd
    up = {}
    for k, v in sd.items():
        k2 = k[len("model."):] if k.startswith("model.") else k
        k2 = {"embed_tokens.weight": "embed.weight", "hc_head.hc_fn": "hc_head_fn",
              "hc_head.hc_base": "hc_head_base", "hc_head.hc_scale": "hc_head_scale"}.get(k2, k2)
        up[k2] = v
    return up


def make_case(out, name, form, cfg, seed):
    import tempfile
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    case_dir = os.path.join(out, name)
    shutil.rmtree(case_dir, ignore_errors=True)
    os.makedirs(case_dir)
    config = DeepseekV4Config(**json.loads(json.dumps(cfg)))
    config._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM(config).eval()
    perturb(model, gen)
    if config.tie_word_embeddings:
        model.tie_weights()
    mtp, c1 = mtp_module(config, gen)
    with tempfile.TemporaryDirectory() as tmp:
        sd = write_form(model, form, case_dir, tmp)
    with tempfile.TemporaryDirectory() as tmp:
        sd.update(mtp_tensors(mtp, c1, tmp))
    save_file(sd, os.path.join(case_dir, "model.safetensors"), metadata={"format": "pt"})
    # config.json as given (legacy fields kept): the Go loader normalises it itself.
    with open(os.path.join(case_dir, "config.json"), "w") as f:
        json.dump(dict(cfg, model_type="deepseek_v4", architectures=["DeepseekV4ForCausalLM"]), f, indent=1)
        f.write("\n")
    # Reload through from_pretrained: the reference is what transformers loads from the file.
    loaded, info = DeepseekV4ForCausalLM.from_pretrained(case_dir, output_loading_info=True,
                                                         attn_implementation="eager")
    bad = {k: v for k, v in info.items() if v and k != "unexpected_keys"}
    unexpected = [k for k in info.get("unexpected_keys", []) if not k.startswith("mtp.")]
    assert not bad and not unexpected, (name, bad, unexpected)
    loaded = loaded.eval()
    ids = torch.randint(0, config.vocab_size, (SEQ_LEN,), generator=gen)
    captured = {}
    hook = loaded.model.hc_head.register_forward_pre_hook(lambda mod, args: captured.update(x=args[0]))
    with torch.no_grad():
        logits = loaded(ids[None]).logits[0].float().contiguous()
        hook.remove()
        ref_logits = model(ids[None]).logits[0]
        assert torch.allclose(ref_logits, logits, atol=1e-5), "reload changed the logits"
        mtp_out = mtp_logits(loaded, mtp, c1, ids, captured["x"]).float().contiguous()
    save_file({"token_ids": ids.to(torch.int32), "logits": logits, "mtp_logits": mtp_out},
              os.path.join(case_dir, "logits.safetensors"),
              metadata={"note": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                                f"fp32 eager, {form} names, seed {seed}"})
    size = sum(os.path.getsize(os.path.join(case_dir, f)) for f in os.listdir(case_dir))
    print(f"{case_dir}: {form} names, {len(sd)} tensors, {size/1e6:.2f} MB")


def parity(out):
    for i, (name, (form, cfg)) in enumerate(CASES.items()):
        make_case(out, name, form, cfg, seed=1234 + i)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "models",
                                                  "deepseek-v4-flash", "testdata"))
    ap.add_argument("--only-config", action="store_true")
    args = ap.parse_args()
    assert transformers.__version__ == "5.23.0", transformers.__version__
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config_cases.json"), "w") as f:
        json.dump(config_cases(), f, indent=1, sort_keys=True)
        f.write("\n")
    if args.only_config:
        return
    parity(os.path.join(args.out, "parity"))


if __name__ == "__main__":
    main()
