"""Measures a mid-size GLM-5.3-Flash text model (CONFIG, fp32, random weights) in
transformers 5.23.0 on torch's CPU path, and prints it side by side with the Go runtime's
figures.

Run through scripts/glm5-bench.sh, which runs the Go benchmarks (BenchmarkGLMPrefill,
BenchmarkGLMDecode in models/glm-5-flash) on the same config (it reads CONFIG from
`--print-config`) with GOMAXPROCS equal to the thread count here.

  glm5-bench.py --print-config
  glm5-bench.py [--threads N] [--runs 3] [--prompt 256] [--steps 16]
                [--go-bench FILE] [--go-profile FILE]

Figures: prefill tokens/s (batch sequences of --prompt tokens in one forward call, logits of
every row, as the Go forward computes them) and decode tokens/s (--steps steps of one token
per sequence from --prompt tokens of context, through transformers' DynamicCache with its
KDA conv/recurrent states), at batch 1 and 4; each the median of --runs runs; and tokens per
CPU-second of the process (all threads, all runs), which other load on the machine disturbs
less than wall time. transformers runs KDA and the short convolution through its reference
PyTorch fallbacks (flash-linear-attention and causal_conv1d are CUDA packages).
"""
import argparse
import json
import os
import re
import statistics
import sys
import time

# KDA and MLA-DSA layers 2:1 (the indexer's top-k of 16 pools of 8 cuts at a 256-token
# prompt), a dense MLP then MoEs of 16 experts top-4 with a shared one, 4 mHC streams. The
# Go benchmarks (models/glm-5-flash/bench_test.go) default to the same config.
CONFIG = {
    "architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
    "text_config": {
        "model_type": "glm5_next_text", "vocab_size": 8192, "hidden_size": 512,
        "intermediate_size": 1024, "moe_intermediate_size": 512, "num_hidden_layers": 6,
        "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 256, "kv_lora_rank": 256,
        "qk_nope_head_dim": 64, "v_head_dim": 64, "index_n_heads": 8, "index_head_dim": 64,
        "index_topk": 16, "index_kpool": 8, "linear_num_heads": 8, "linear_head_dim": 64,
        "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1, "n_group": 1,
        "topk_group": 1, "hc_mult": 4, "max_position_embeddings": 4096, "eos_token_id": 1,
        "pad_token_id": None,
        "layer_types": ["linear_attention", "linear_attention", "indexed_attention",
                        "linear_attention", "linear_attention", "indexed_attention"],
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "sparse", "sparse"]},
    "vision_config": {"model_type": "glm5_next_vision", "depth": 1},
    "tie_word_embeddings": False, "torch_dtype": "float32",
}
BATCHES = (1, 4)


def tokens(j, n, vocab):
    """Sequence j's prompt, as the Go benchmark's benchTokens makes it."""
    return [(i * 7919 + j * 104729 + 3) % vocab for i in range(n)]


def build_model():
    import torch
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration
    cfg = {k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type", "torch_dtype")}
    config = Glm5NextConfig(**json.loads(json.dumps(cfg)))
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    model = Glm5NextForConditionalGeneration._from_config(config, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "embed" not in name and "visual" not in name:  # N(0, 1/fan_in), as Go's
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    return model


def torch_figures(args):
    """Median tok/s and tokens per CPU-second (process time, all threads, all runs)."""
    import torch
    torch.set_num_threads(args.threads)
    model = build_model()
    vocab = CONFIG["text_config"]["vocab_size"]
    rate, cpu = {}, {}

    def timed(fn, ntok, key, rates, spent):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        rates.append(ntok / (time.perf_counter() - w0))
        spent[key] = spent.get(key, 0.0) + time.process_time() - c0

    with torch.no_grad():
        model(input_ids=torch.tensor([tokens(0, 16, vocab)]))  # warm-up
        for b in BATCHES:
            ids = torch.tensor([tokens(j, args.prompt, vocab) for j in range(b)])
            key, rates = f"prefill/{b}", []
            for _ in range(args.runs):
                timed(lambda: model(input_ids=ids, use_cache=True), b * args.prompt, key, rates, cpu)
            rate[key], cpu[key] = statistics.median(rates), args.runs * b * args.prompt / cpu[key]
            key, rates = f"decode/{b}", []
            for _ in range(args.runs):
                cache = model(input_ids=ids, use_cache=True).past_key_values
                warm = torch.tensor([[1]] * b)  # one untimed step: first-call set-up
                cache = model(input_ids=warm, past_key_values=cache, use_cache=True).past_key_values

                def decode(cache=cache):
                    for i in range(args.steps):
                        nxt = torch.tensor([[(i * 131 + j * 31 + 5) % vocab] for j in range(b)])
                        cache = model(input_ids=nxt, past_key_values=cache, use_cache=True).past_key_values
                timed(decode, b * args.steps, key, rates, cpu)
            rate[key], cpu[key] = statistics.median(rates), args.runs * b * args.steps / cpu[key]
    return rate, cpu


def go_figures(bench_file):
    """Median tok/s per benchmark from `go test -bench` output (-count runs)."""
    runs = {}
    pat = re.compile(r"^BenchmarkGLM(Prefill|Decode)/batch=(\d+)\S*\s+\d+\s+.*?([\d.]+) tok/s")
    with open(bench_file) as f:
        for line in f:
            m = pat.match(line)
            if m:
                runs.setdefault(f"{m.group(1).lower()}/{m.group(2)}", []).append(float(m.group(3)))
    return {k: statistics.median(v) for k, v in runs.items()}, {k: len(v) for k, v in runs.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--print-config", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--go-bench", help="go test -bench output of BenchmarkGLMPrefill/Decode")
    ap.add_argument("--go-profile", help="lines 'BENCH CPU_MS GEMM_MS' from the Go CPU profile")
    args = ap.parse_args()
    if args.print_config:
        json.dump(CONFIG, sys.stdout, indent=1)
        print()
        return
    import torch
    import transformers
    assert transformers.__version__ == "5.23.0", transformers.__version__
    tf, tf_cpu = torch_figures(args)
    go, n = go_figures(args.go_bench) if args.go_bench else ({}, {})
    go_cpu, gemm = {}, {}
    if args.go_profile:
        with open(args.go_profile) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and float(parts[1]) > 0:
                    k, all_ms, gemm_ms = parts[0], float(parts[1]), float(parts[2])
                    phase, b = k.split("/")
                    ntok = n.get(k, 0) * int(b) * (args.prompt if phase == "prefill" else args.steps)
                    go_cpu[k] = ntok / (all_ms / 1000)
                    gemm[k] = f"{100 * gemm_ms / all_ms:.1f}"
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{args.threads} threads; prompt {args.prompt}, {args.steps} decode steps; "
          f"median of {args.runs} runs (Go: of {max(n.values()) if n else 0})")
    cols = ["resin (Go)", "torch", "Go/torch", "resin (Go)", "torch", "Go GEMM %"]
    print(f"{'':<11}{'-- tok/s (median) --':>36}{'-- tok/CPU-s --':>24}")
    print(f"{'':<11}" + "".join(f"{c:>12}" for c in cols))
    fmt = lambda v: f"{v:.1f}" if v else "-"
    for k in [f"{p}/{b}" for p in ("prefill", "decode") for b in BATCHES]:
        g, t = go.get(k), tf[k]
        row = [fmt(g), fmt(t), f"{g / t:.2f}" if g else "-", fmt(go_cpu.get(k)), fmt(tf_cpu[k]), gemm.get(k, "-")]
        print(f"{k:<11}" + "".join(f"{c:>12}" for c in row))

if __name__ == "__main__":
    main()
