#!/usr/bin/env bash
# scripts/glm5-bench.sh: models/glm-5-flash (GLM-5.3-Flash text) on the CPU side by side with
# transformers 5.23.0 on torch's CPU path, on the same mid-size GLM-5.3-Flash config (fp32,
# random weights; CONFIG in glm5-bench.py) and the same thread count: prefill
# tokens/s (256-token prompts, batch 1 and 4) and decode tokens/s (from 256 tokens of
# context, batch 1 and 4), each the median of the runs; tokens per CPU-second (all runs, all
# threads: less sensitive to other load on the machine than wall time); and the Go CPU
# profile's GEMM share (samples under gonum's BLAS, per timed loop). The table, with the
# machine and its load average, is printed and appended to
# .cache/bench/glm5-vs-torch.txt.
#
# Usage: scripts/glm5-bench.sh [--threads N] [--runs R] [--steps S]
#   --threads N   GOMAXPROCS and torch.set_num_threads (default: nproc)
#   --runs R      runs per figure, the median is reported (default 3)
#   --steps S     decode steps per run (default 16)
# torch, transformers and safetensors are installed, pinned, into .cache/torch-venv.
# The run itself is scripts/torchbench.sh's (and torchbench.py's), shared by glm5-bench.sh and
# deepseek-v4-bench.sh.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
. "$(dirname "$0")/torchbench.sh"
torchbench glm5 glm-5-flash GLM RESIN_GLM5_BENCH_CONFIG glm5.steps 16 "$@"
