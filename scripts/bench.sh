#!/usr/bin/env bash
# scripts/bench.sh [MODEL_DIR] [OUT_FILE]: the standard benchmark set for a scaffolded model
# (default models/llama), with the machine it ran on, printed and appended to OUT_FILE
# (default .cache/bench/NAME.txt) so figures can be compared across changes.
#
#   1. go test -bench . of the model package (BenchmarkGenerate and BenchmarkExecute on the
#      tiny config, with allocs);
#   2. `NAME bench` through core/engine at concurrency 1, 4 and 16 (random weights unless
#      MODEL_WEIGHTS names a checkpoint directory).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${1:-models/llama}
[ -f "$dir/resin.toml" ] || { echo "bench.sh: $dir has no resin.toml (not a resin-new scaffold)" >&2; exit 2; }
name=$(sed -n 's/^name = "\(.*\)"/\1/p' "$dir/resin.toml" | head -n1)
outfile=${2:-$root/.cache/bench/$name.txt}
mkdir -p "$(dirname "$outfile")"
weights=${MODEL_WEIGHTS:-.}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT

{
	echo "# $name $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo none)"
	echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ //'), $(go version | cut -d' ' -f3)"
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
		echo "# gpu: $(nvidia-smi -L | head -n1)"
	else
		echo "# gpu: none"
	fi
	(cd "$dir" && go test -run '^$' -bench . -benchmem -count 1 .)
	(cd "$dir" && go build -o "$bin/$name" "./cmd/$name")
	for c in 1 4 16; do
		(cd "$dir" && "$bin/$name" bench --model "$weights" --requests 16 --prompt-len 64 --gen-len 32 --concurrency "$c")
	done
} 2>&1 | tee -a "$outfile"
echo "== appended to $outfile"
