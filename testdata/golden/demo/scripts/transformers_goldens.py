"""Writes transformers parity goldens for a dense model: a tiny checkpoint and the logits
transformers computes for it, which the model's Go parity test (parity_test.go) compares
with its own forward, position by position.

Run through scripts/transformers-goldens.sh, which installs the pinned torch and
transformers into .cache/torch-venv.

  transformers_goldens.py --builtin DIR   the dense base's cases (llama, qwen2, qwen3,
                                          mistral) into DIR/<case>/
  transformers_goldens.py SOURCE          SOURCE is a scaffold directory or a config.json:
                                          its config shrunk to a few layers of a few heads,
                                          with random weights, into <model_type>-shrunk/; or
                                          a checkpoint directory (config.json and
                                          safetensors): the real weights, which are not
                                          copied (checkpoint/ records their path)
      [--out DIR] [--name CASE]           default: SOURCE's testdata/parity/<case>

Each case directory holds config.json and model.safetensors (or, for a real checkpoint, a
file `checkpoint` naming its directory) and logits.safetensors: `token_ids` (I32, [T]) and
`logits` (F32, [T, vocab]), the logits of every position of one fixed token sequence,
computed in float32 on the CPU with eager attention.
"""
import argparse
import glob
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

SEQ_LEN = 24  # longer than the sliding windows below, so the tests cross them
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, vocab_size=256,
            max_position_embeddings=128)

# The dense base's cases: each variant with what sets it apart, in configs shaped as the
# real checkpoints are (transformers writes them with save_pretrained).
BUILTIN = {
    # Llama 3: biases on q/k/v/o (attention_bias), llama3 rope scaling across the sequence,
    # head_dim not hidden/heads, GQA 2:1.
    "llama": dict(model_type="llama", num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  attention_bias=True, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                       low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=16)),
    # Qwen2: q/k/v biases, tied head, GQA 4:1, rope_theta 1e6.
    "qwen2": dict(model_type="qwen2", num_attention_heads=4, num_key_value_heads=1,
                  rms_norm_eps=1e-6, tie_word_embeddings=True,
                  rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
    # Qwen3: per-head q/k RMSNorm, head_dim 16, tied head, linear rope scaling.
    "qwen3": dict(model_type="qwen3", num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  attention_bias=False, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  rope_parameters=dict(rope_type="linear", rope_theta=1000000.0, factor=2.0)),
    # Mistral: a sliding window of 6 tokens over a 24-token sequence.
    "mistral": dict(model_type="mistral", num_attention_heads=4, num_key_value_heads=2,
                    sliding_window=6, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
}


def perturb(model, seed):
    """Sets every parameter to seeded random values: projections and embeddings normal with
    std 0.15, biases std 0.1, norm weights 1 + normal with std 0.1 (so none is all ones)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
            elif "embed_tokens" in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.15 * noise)


def token_ids(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (SEQ_LEN,), generator=g, dtype=torch.int64)


def load(src):
    model, info = AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    bad = {k: sorted(v) for k, v in info.items() if v}
    if bad:
        sys.exit(f"transformers loads {src} with {bad}: the goldens would not be of this checkpoint")
    return model.eval()


def write_logits(model, case_dir, vocab, seed, note):
    ids = token_ids(vocab, seed)
    with torch.no_grad():
        logits = model(ids[None, :]).logits[0].to(torch.float32).contiguous()
    save_file({"token_ids": ids.to(torch.int32), "logits": logits},
              os.path.join(case_dir, "logits.safetensors"),
              # one key: safetensors writes several in no fixed order
              metadata={"made_by": f"transformers {transformers.__version__}, torch {torch.__version__}: {note}"})


def make_case(case_dir, config_dict, seed, note):
    """Builds a model of config_dict with perturbed weights, saves it with save_pretrained,
    loads it back through from_pretrained and writes the logits of that loaded model."""
    config_dict = dict(config_dict)
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    perturb(model, seed)
    shutil.rmtree(case_dir, ignore_errors=True)
    model.save_pretrained(case_dir)
    for extra in os.listdir(case_dir):  # generation_config.json: not part of the model
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(case_dir, extra))
    write_logits(load(case_dir), case_dir, config.vocab_size, seed, note)
    size = sum(os.path.getsize(os.path.join(case_dir, f)) for f in os.listdir(case_dir))
    print(f"{case_dir}: {model_type}, {size // 1024} KiB")


def shrink(cfg):
    """The config cut down to a few layers of a few heads, keeping what makes the variant
    (model_type, biases, q/k norm, tied head, rope scaling, GQA ratio, a window)."""
    out = {k: v for k, v in cfg.items() if k not in ("torch_dtype", "dtype", "transformers_version",
                                                     "layer_types", "max_window_layers")}
    heads = cfg.get("num_attention_heads", 1)
    kv = cfg.get("num_key_value_heads") or heads
    group = max(1, min(heads // kv, 4))
    out.update(TINY, num_key_value_heads=2, num_attention_heads=2 * group, head_dim=16)
    out["vocab_size"] = min(cfg.get("vocab_size", TINY["vocab_size"]), TINY["vocab_size"])
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = out.get(k)
        if isinstance(v, int) and v >= out["vocab_size"]:
            out[k] = out["vocab_size"] - 1
        elif isinstance(v, list):
            out[k] = [min(x, out["vocab_size"] - 1) for x in v]
    if out.get("sliding_window"):
        out["sliding_window"] = 6
    rope = out.get("rope_parameters") or out.get("rope_scaling")
    if isinstance(rope, dict) and rope.get("original_max_position_embeddings"):
        rope = dict(rope, original_max_position_embeddings=16)  # so the sequence crosses it
        out["rope_parameters" if "rope_parameters" in out and out["rope_parameters"] else "rope_scaling"] = rope
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", nargs="?", help="scaffold directory, config.json, or checkpoint directory")
    ap.add_argument("--builtin", metavar="DIR", help="write the dense base's cases into DIR")
    ap.add_argument("--out", help="parity directory (default: SOURCE's testdata/parity)")
    ap.add_argument("--name", help="case name (default: <model_type>-shrunk, or checkpoint)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.builtin:
        for i, (name, extra) in enumerate(BUILTIN.items()):
            cfg = dict(TINY, **extra)
            make_case(os.path.join(args.builtin, name), cfg, args.seed + i, f"builtin case {name}")
        return
    if not args.source:
        ap.error("give SOURCE or --builtin DIR")
    src = args.source
    cfg_path = src if src.endswith(".json") else os.path.join(src, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    if "model_type" not in cfg:
        sys.exit(f"{cfg_path} has no model_type: transformers could not build it")
    if cfg.get("qk_norm") and cfg["model_type"] != "qwen3":
        sys.exit(f"{cfg_path}: qk_norm is resin's own key; transformers' {cfg['model_type']} has no q/k norm, so it is no reference for this config")
    home = os.path.dirname(os.path.abspath(cfg_path))
    out = args.out or os.path.join(home, "testdata", "parity")
    real = os.path.isdir(src) and glob.glob(os.path.join(src, "*.safetensors"))
    name = args.name or ("checkpoint" if real else cfg["model_type"] + "-shrunk")
    case_dir = os.path.join(out, name)
    if real:
        shutil.rmtree(case_dir, ignore_errors=True)
        os.makedirs(case_dir)
        with open(os.path.join(case_dir, "checkpoint"), "w") as f:
            f.write(os.path.abspath(src) + "\n")
        write_logits(load(src), case_dir, cfg["vocab_size"], args.seed, f"checkpoint {os.path.abspath(src)}")
        print(f"{case_dir}: logits of the checkpoint {src}")
        return
    make_case(case_dir, shrink(cfg), args.seed, f"{cfg_path} shrunk")


if __name__ == "__main__":
    main()
