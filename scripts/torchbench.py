"""The torch side of the CPU speed comparisons (scripts/glm5-bench.py,
scripts/deepseek-v4-bench.py): a model package's mid-size benchmark config, timed in
transformers on torch's CPU path, printed side by side with the Go benchmarks' figures.

A script gives main() its config, batch sizes, Go benchmark prefix, default prompt and
decode lengths and a build_model() that returns the transformers model in eval mode with its
linear weights drawn by init_linear(); scripts/torchbench.sh runs the Go side.

Figures: prefill tokens/s (batch sequences of --prompt tokens in one forward call, logits of
every row, as the Go forward computes them) and decode tokens/s (--steps steps of one token
per sequence from --prompt tokens of context, through transformers' DynamicCache), each the
median of --runs runs; and tokens per CPU-second of the process (all threads, all runs),
which other load on the machine disturbs less than wall time.
"""
import argparse
import json
import os
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def go_config(package):
    """The benchConfigJSON constant of models/<package>/bench_test.go: the config the Go
    benchmarks default to, read from there so that both sides cannot drift apart."""
    path = os.path.join(ROOT, "models", package, "bench_test.go")
    with open(path) as f:
        m = re.search(r"^const benchConfigJSON = `(.*?)`", f.read(), re.S | re.M)
    if not m:
        raise SystemExit(f"{path}: no `const benchConfigJSON = `...`` to read the bench config from")
    return json.loads(m.group(1))


def tokens(j, n, vocab):
    """Sequence j's prompt, as the Go benchmarks' benchTokens make it."""
    return [(i * 7919 + j * 104729 + 3) % vocab for i in range(n)]


def init_linear(model, gen, skip=("embed",)):
    """Draws every weight of two or more dimensions whose name contains none of skip from
    N(0, 1/fan_in), as the Go packages' random weights are."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and not any(s in name for s in skip):
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def torch_figures(model, vocab, batches, args):
    """Median tok/s and tokens per CPU-second (process time, all threads, all runs), keyed
    "prefill/B" and "decode/B"."""
    import torch
    rate, cpu = {}, {}

    def timed(fn, ntok, key, rates, spent):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        rates.append(ntok / (time.perf_counter() - w0))
        spent[key] = spent.get(key, 0.0) + time.process_time() - c0

    with torch.no_grad():
        model(input_ids=torch.tensor([tokens(0, 16, vocab)]))  # warm-up
        for b in batches:
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


def go_figures(bench_file, bench):
    """Median tok/s per Benchmark<bench>Prefill/Decode sub-benchmark of `go test -bench`
    output (-count runs), and the number of runs of each."""
    runs = {}
    pat = re.compile(rf"^Benchmark{bench}(Prefill|Decode)/batch=(\d+)\S*\s+\d+\s+.*?([\d.]+) tok/s")
    with open(bench_file) as f:
        for line in f:
            m = pat.match(line)
            if m:
                runs.setdefault(f"{m.group(1).lower()}/{m.group(2)}", []).append(float(m.group(3)))
    return {k: statistics.median(v) for k, v in runs.items()}, {k: len(v) for k, v in runs.items()}


def go_profile(profile_file, counts, args):
    """Go tokens per CPU-second and GEMM share (%) per benchmark from the lines
    'BENCH CPU_MS GEMM_MS' scripts/torchbench.sh writes from the Go CPU profile."""
    go_cpu, gemm = {}, {}
    with open(profile_file) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and float(parts[1]) > 0:
                k, all_ms, gemm_ms = parts[0], float(parts[1]), float(parts[2])
                phase, b = k.split("/")
                ntok = counts.get(k, 0) * int(b) * (args.prompt if phase == "prefill" else args.steps)
                go_cpu[k] = ntok / (all_ms / 1000)
                gemm[k] = f"{100 * gemm_ms / all_ms:.1f}"
    return go_cpu, gemm


def main(config, batches, build_model, bench, prompt, steps):
    """Parses the command line of a *-bench.py script and prints its config
    (--print-config) or the side-by-side table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--print-config", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=prompt)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--go-bench", help=f"go test -bench output of Benchmark{bench}Prefill/Decode")
    ap.add_argument("--go-profile", help="lines 'BENCH CPU_MS GEMM_MS' from the Go CPU profile")
    args = ap.parse_args()
    if args.print_config:
        json.dump(config, sys.stdout, indent=1)
        print()
        return
    import torch
    import transformers
    assert transformers.__version__ == "5.23.0", transformers.__version__
    torch.set_num_threads(args.threads)
    model = build_model()
    vocab = config.get("text_config", config)["vocab_size"]
    tf, tf_cpu = torch_figures(model, vocab, batches, args)
    go, n = go_figures(args.go_bench, bench) if args.go_bench else ({}, {})
    go_cpu, gemm = go_profile(args.go_profile, n, args) if args.go_profile else ({}, {})
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{args.threads} threads; prompt {args.prompt}, {args.steps} decode steps; "
          f"median of {args.runs} runs (Go: of {max(n.values()) if n else 0})")
    cols = ["resin (Go)", "torch", "Go/torch", "resin (Go)", "torch", "Go GEMM %"]
    print(f"{'':<11}{'-- tok/s (median) --':>36}{'-- tok/CPU-s --':>24}")
    print(f"{'':<11}" + "".join(f"{c:>12}" for c in cols))
    fmt = lambda v: f"{v:.1f}" if v else "-"
    for k in [f"{p}/{b}" for p in ("prefill", "decode") for b in batches]:
        g, t = go.get(k), tf[k]
        row = [fmt(g), fmt(t), f"{g / t:.2f}" if g else "-", fmt(go_cpu.get(k)), fmt(tf_cpu[k]), gemm.get(k, "-")]
        print(f"{k:<11}" + "".join(f"{c:>12}" for c in row))
