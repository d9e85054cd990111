"""Writes GLM-5.3-Flash (glm5_next) goldens for models/glm-5-flash: what transformers
5.23.0's Glm5NextConfig makes of nested (text_config + vision_config), flat and legacy
config.json forms.

Run through scripts/glm5-goldens.sh, which installs the pinned torch and transformers into
.cache/torch-venv.

  glm5-goldens.py [--out models/glm-5-flash/testdata] [--only-config]

Writes OUT/config_cases.json: per case the input dict and either the normalised text-model
fields ("want", read from config.text_config, plus the top-level tie_word_embeddings) or
the error transformers raised; and, unless --only-config,
OUT/parity/<case>/{config.json, model.safetensors, logits.safetensors}: tiny
Glm5NextForConditionalGeneration models (a one-layer vision tower that is never run; only the
text path is used, eager attention and experts, float32 weights, the reference logits
computed in float64) with perturbed weights, written in one of two
tensor name forms ("module": the state_dict names; "checkpoint": the names save_pretrained
writes, which the conversion mapping renames on load: flat forget-gate keys, hc_*,
per-expert keys, q/k/v_conv1d), and logits.safetensors holding token_ids (I32 [T]) and
logits (F32 [T, vocab]) for every position. Each checkpoint also carries an MTP layer
(layers.{num_hidden_layers}, which transformers drops on load; see MTPLayer), and
logits.safetensors its logits mtp_logits (F32 [T-1, vocab]): row p from the final hidden
state at p and the token at p+1.
"""
import argparse
import copy
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from torch import nn
from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration
from transformers.models.glm5_next.modeling_glm5_next import (
    Glm5NextTextAttention, Glm5NextTextMoE, Glm5NextTextRMSNorm)

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
    # GLM-5.3-Flash's published spelling: the DSA layers are "deepseek_sparse_attention"
    # (transformers main's name, which 5.23.0 remaps to indexed_attention) and
    # linear_attn_config lists the layers of each kind, 0-based (5.23.0 does not read them).
    "published-layer-names": {"model_type": "glm5_next", "num_hidden_layers": 4,
                              "layer_types": ["linear_attention", "linear_attention",
                                              "linear_attention", "deepseek_sparse_attention"],
                              "linear_attn_config": {"kda_layers": [0, 1, 2], "full_attn_layers": [3]}},
    # linear_attn_config's lists alone: 5.23.0 does not read them (its default layer_types
    # stands); here they make layer_types by design.
    "kda-layers-only": {"model_type": "glm5_next", "num_hidden_layers": 4,
                        "linear_attn_config": {"kda_layers": [0, 2, 3], "full_attn_layers": [1]}},
    # Lists that contradict layer_types: 5.23.0 ignores them, refused here by design.
    "kda-layers-contradict": {"model_type": "glm5_next", "num_hidden_layers": 4,
                              "layer_types": ["linear_attention", "linear_attention",
                                              "linear_attention", "indexed_attention"],
                              "linear_attn_config": {"kda_layers": [0, 2, 3], "full_attn_layers": [1]}},
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


# Tiny text models crossing every path: KDA and MLA-DSA layers, pools of 4 or 8 closing
# inside and between the Go tests' chunks, the incomplete tail, index_topk/kpool well below
# the ~25-50 pools of 200 tokens, a shared indexer layer, group-limited routing, shared
# experts, an active SwiGLU clamp, with and without the KDA gate's lower bound.
TINY = dict(vocab_size=128, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
            num_attention_heads=2, num_key_value_heads=2, q_lora_rank=24, kv_lora_rank=16,
            qk_nope_head_dim=16, v_head_dim=8, index_n_heads=8, index_head_dim=16,
            linear_num_heads=2, linear_head_dim=8, n_routed_experts=8, num_experts_per_tok=2,
            swiglu_limit=1.0, rms_norm_eps=1e-5, pad_token_id=None, max_position_embeddings=4096)
VISION = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=16, out_hidden_size=32,
              projection_intermediate_size=16, patch_size=2, temporal_patch_size=1,
              spatial_merge_size=1)
CASES = {
    "module": ("module", dict(TINY, num_hidden_layers=6, index_kpool=4, index_topk=16,
        layer_types=["linear_attention", "indexed_attention", "indexed_attention",
                     "linear_attention", "linear_attention", "indexed_attention"],
        indexer_types=["full", "full", "shared", "full", "full", "full"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse", "dense", "sparse"],
        n_group=2, topk_group=1, hc_mult=4, linear_head_dim=16)),
    "checkpoint": ("checkpoint", dict(TINY, num_hidden_layers=5, index_kpool=8, index_topk=24,
        layer_types=["indexed_attention", "linear_attention", "indexed_attention",
                     "indexed_attention", "linear_attention"],
        indexer_types=["full", "full", "full", "shared", "full"],
        mlp_layer_types=["sparse", "dense", "sparse", "sparse", "sparse"],
        n_shared_experts=2, linear_lower_bound=None, hc_mult=2, linear_conv_kernel_dim=3)),
    # bf16 weights (float32 where transformers keeps them so), the module case's shape.
    "bf16": ("module-bf16", dict(TINY, num_hidden_layers=6, index_kpool=4, index_topk=16,
        layer_types=["linear_attention", "indexed_attention", "indexed_attention",
                     "linear_attention", "linear_attention", "indexed_attention"],
        indexer_types=["full", "full", "shared", "full", "full", "full"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse", "dense", "sparse"],
        n_group=2, topk_group=1, hc_mult=4, linear_head_dim=16)),
}
SEQ_LEN = 200
# A case's seed is 100 + its index unless listed here. The Go tests fail a golden whose
# indexer or router top-k cut has a margin under 1e-5 (a tie leaves torch.topk's order
# implementation-defined): bf16's seed 102 put its MTP layer's router cut at 7.7e-6.
SEEDS = {"bf16": 103}


def perturb(model, gen):
    """Moves every text weight off its init so that a port ignoring any of them fails."""
    perturb_params(list(model.model.language_model.named_parameters()) + list(
        model.model.language_model.named_buffers()) + [("lm_head.weight", model.lm_head.weight)], gen)


def perturb_params(named, gen):
    def rnd(shape):
        return torch.randn(shape, generator=gen)
    with torch.no_grad():
        for name, p in named:
            if p.ndim >= 2:
                p.copy_(rnd(p.shape) * p.shape[-1] ** -0.5)
            elif name.endswith("scale"):
                p.copy_(1 + 0.3 * rnd(p.shape))
            elif name.endswith("A_log"):
                p.copy_(0.5 * rnd(p.shape))
            elif name.endswith("dt_bias"):
                # Mild decays (g ≈ −0.25 per token, a memory of a few tokens): with g ≈ −2.5
                # the state forgets everything at once, the KDA output is ≈ (q·k)·β·v, near
                # zero where q ⟂ k, and o_norm amplifies float32 rounding past 1e-4.
                p.copy_(-3 + 0.1 * rnd(p.shape))
            elif name.endswith(("norm.weight", "layernorm.weight")):
                p.copy_(1 + 0.1 * rnd(p.shape))
            else:  # biases, dt_bias, hc base, e_score_correction_bias
                p.copy_(0.1 * rnd(p.shape))


def checkpoint_names(sd, cfg):
    """The names save_pretrained writes (the conversion mapping's sources)."""
    out = {}
    kd = cfg["linear_num_heads"] * cfg["linear_head_dim"]
    for k, v in sd.items():
        if ".mlp.experts.gate_up_proj" in k:
            pre = k[: -len("gate_up_proj")]
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = v[e, :inter]
                out[f"{pre}{e}.up_proj.weight"] = v[e, inter:]
            continue
        if ".mlp.experts.down_proj" in k:
            pre = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = v[e]
            continue
        if k.endswith("self_attn.conv1d.weight"):
            pre = k[: -len("conv1d.weight")]
            for i, n in enumerate("qkv"):
                out[f"{pre}{n}_conv1d.weight"] = v[i * kd:(i + 1) * kd]
            continue
        k2 = k.replace("self_attn.forget_gate.", "self_attn.")
        for a, b in (("attn_hc.fn", "hc_attn_fn"), ("attn_hc.base", "hc_attn_base"),
                     ("attn_hc.scale", "hc_attn_scale"), ("ffn_hc.fn", "hc_ffn_fn"),
                     ("ffn_hc.base", "hc_ffn_base"), ("ffn_hc.scale", "hc_ffn_scale")):
            k2 = k2.replace(a, b)
        out[k2] = v
    return out


class MTPLayer(nn.Module):
    """The glm5_next MTP layer (layers.{num_hidden_layers}), as vLLM's and SGLang's glm5_next
    MTP read the checkpoint (transformers 5.23.0 drops it on load): enorm, hnorm, eh_proj on
    [enorm(embed(next)); hnorm(hidden)], one pre-norm decoder layer without mHC (transformers'
    Glm5NextTextAttention with its own full indexer, Glm5NextTextMoE), shared_head.norm and
    shared_head.head (the main lm_head when absent)."""

    def __init__(self, tcfg, own_head):
        super().__init__()
        n, d = tcfg.num_hidden_layers, tcfg.hidden_size
        cfg = copy.deepcopy(tcfg)
        cfg.layer_types = list(tcfg.layer_types) + ["indexed_attention"]
        cfg.indexer_types = list(tcfg.indexer_types) + ["full"]
        cfg.mlp_layer_types = list(tcfg.mlp_layer_types) + ["sparse"]
        self.enorm = Glm5NextTextRMSNorm(d, tcfg.rms_norm_eps)
        self.hnorm = Glm5NextTextRMSNorm(d, tcfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.input_layernorm = Glm5NextTextRMSNorm(d, tcfg.rms_norm_eps)
        self.post_attention_layernorm = Glm5NextTextRMSNorm(d, tcfg.rms_norm_eps)
        self.self_attn = Glm5NextTextAttention(cfg, n)
        self.mlp = Glm5NextTextMoE(cfg)
        self.shared_head = nn.Module()
        self.shared_head.norm = Glm5NextTextRMSNorm(d, tcfg.rms_norm_eps)
        if own_head:
            self.shared_head.head = nn.Linear(d, tcfg.vocab_size, bias=False)

    def forward(self, embed, hidden, lm_head):
        x = self.eh_proj(torch.cat([self.enorm(embed), self.hnorm(hidden)], dim=-1))
        mask = torch.ones(x.shape[:2], dtype=torch.bool)
        a, _, _ = self.self_attn(hidden_states=self.input_layernorm(x), attention_mask=mask)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        head = self.shared_head.head if hasattr(self.shared_head, "head") else lm_head
        return head(self.shared_head.norm(x))


KEEP_FP32 = Glm5NextForConditionalGeneration._keep_in_fp32_modules_strict or [
    "e_score_correction_bias", "conv1d", "dt_bias", "A_log", "attn_hc.base", "attn_hc.scale",
    "ffn_hc.base", "ffn_hc.scale"]


def keep_fp32(name):
    """Whether transformers keeps this tensor float32 in a bf16 model."""
    return any(k in name for k in KEEP_FP32) or "_conv1d" in name or "hc_attn_base" in name or \
        "hc_attn_scale" in name or "hc_ffn_base" in name or "hc_ffn_scale" in name


def make_case(out, name, form, text, seed, bf16=False):
    case_dir = os.path.join(out, "parity", name)
    os.makedirs(case_dir, exist_ok=True)
    cfg = Glm5NextConfig(text_config=dict(text), vision_config=dict(VISION))
    model = Glm5NextForConditionalGeneration._from_config(
        cfg, attn_implementation="eager", experts_implementation="eager").eval()
    gen = torch.Generator().manual_seed(seed)
    perturb(model, gen)
    ids = torch.randint(0, text["vocab_size"], (1, SEQ_LEN), generator=gen)
    # The MTP layer: its own head and an (ignored) embed_tokens copy in the checkpoint form,
    # the main lm_head in the module form; the MTP prefix as the flat checkpoint spells it in
    # the checkpoint form.
    tcfg = model.config.text_config
    mtp = MTPLayer(tcfg, own_head=form == "checkpoint").eval()
    perturb_params(list(mtp.named_parameters()) + list(mtp.named_buffers()), gen)
    logits_bf16 = None
    if bf16:
        # A bf16 checkpoint as published: bf16 weights but for transformers'
        # _keep_in_fp32_modules_strict (kept float32). The float64 reference below runs on
        # the same rounded weights; transformers' own bf16 run is the second golden.
        with torch.no_grad():
            for mod in (model, mtp):
                for k, p in list(mod.named_parameters()) + list(mod.named_buffers()):
                    if p.is_floating_point() and not keep_fp32(k):
                        p.copy_(p.to(torch.bfloat16).float())
            bf = copy.deepcopy(model).to(torch.bfloat16)
            for (k, p), (_, p32) in zip(bf.named_parameters(), model.named_parameters()):
                if keep_fp32(k):
                    p.data = p32.data.clone()
            logits_bf16 = bf(input_ids=ids).logits[0].float()
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()
          if k.startswith("model.language_model.") or k == "lm_head.weight"}
    mtp_prefix = ("model.layers." if form == "checkpoint" else "model.language_model.layers.") + f"{tcfg.num_hidden_layers}."
    for k, v in mtp.state_dict().items():
        sd[mtp_prefix + k] = v.detach().clone().contiguous()
    if form == "checkpoint":
        sd[mtp_prefix + "embed_tokens.weight"] = model.model.language_model.embed_tokens.weight.detach().clone()
    # The reference runs in float64 on the float32 weights: transformers' own float32 run
    # differs from it by ~1e-4 on these perturbed models, which would eat the tolerance.
    with torch.no_grad():
        model = model.double()
        logits = model(input_ids=ids).logits[0].float()
        # MTP row p reads the final hidden state at p and the token at p+1.
        hidden = model.model.language_model(input_ids=ids).last_hidden_state
        embed = model.model.language_model.embed_tokens(ids[:, 1:])
        mtp_logits = mtp.double()(embed, hidden[:, :-1], model.lm_head)[0].float()
    if form == "checkpoint":
        sd = {k: v.contiguous() for k, v in checkpoint_names(sd, text).items()}
    if bf16:
        sd = {k: v if keep_fp32(k) else v.to(torch.bfloat16) for k, v in sd.items()}
    save_file(sd, os.path.join(case_dir, "model.safetensors"))
    goldens = {"token_ids": ids[0].to(torch.int32), "logits": logits.contiguous(),
               "mtp_logits": mtp_logits.contiguous()}
    if logits_bf16 is not None:
        goldens["logits_bf16"] = logits_bf16.contiguous()
    save_file(goldens, os.path.join(case_dir, "logits.safetensors"))
    config = {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
              "text_config": dict(text, model_type="glm5_next_text"),
              "vision_config": dict(VISION, model_type="glm5_next_vision"),
              "tie_word_embeddings": False, "torch_dtype": "bfloat16" if bf16 else "float32"}
    with open(os.path.join(case_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1, sort_keys=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "models", "glm-5-flash", "testdata"))
    ap.add_argument("--only-config", action="store_true")
    args = ap.parse_args()
    assert transformers.__version__ == "5.23.0", transformers.__version__
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config_cases.json"), "w") as f:
        json.dump(config_cases(), f, indent=1, sort_keys=True)
    if args.only_config:
        return
    torch.manual_seed(0)
    for i, (name, (form, text)) in enumerate(CASES.items()):
        bf16 = form.endswith("-bf16")
        make_case(args.out, name, form.removesuffix("-bf16"), text, seed=SEEDS.get(name, 100 + i), bf16=bf16)


if __name__ == "__main__":
    main()
