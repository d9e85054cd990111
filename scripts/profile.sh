#!/usr/bin/env bash
# scripts/profile.sh [MODEL_DIR] [OUT_DIR]: profiles a generate run of a scaffolded model
# (default models/llama) and prints the top of each profile.
#
#   pprof CPU and heap profiles of `go run ./cmd/NAME generate` (random weights unless
#   MODEL_WEIGHTS names a checkpoint directory), and of BenchmarkGenerate;
#   nsys (timeline) and ncu (per-kernel) when they are on PATH and a GPU is present.
#
# Profiles land in OUT_DIR (default .cache/profile/NAME-<utc time>). Environment:
# TOKENS (generated tokens, default 128), MODEL_WEIGHTS (checkpoint directory).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${1:-models/llama}
[ -f "$dir/resin.toml" ] || { echo "profile.sh: $dir has no resin.toml (not a resin-new scaffold)" >&2; exit 2; }
name=$(sed -n 's/^name = "\(.*\)"/\1/p' "$dir/resin.toml" | head -n1)
out=${2:-$root/.cache/profile/$name-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
tokens=${TOKENS:-128}
weights=${MODEL_WEIGHTS:-.}

echo "== machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ //'), $(go version | cut -d' ' -f3)"
echo "== building $name"
(cd "$dir" && go build -o "$out/$name" "./cmd/$name")

echo "== generate: $tokens tokens, pprof CPU + heap -> $out"
(cd "$dir" && "$out/$name" generate --model "$weights" --prompt-ids 1,2,3,4,5,6,7,8 --max-tokens "$tokens" \
	--cpuprofile "$out/cpu.prof" --memprofile "$out/heap.prof")
go tool pprof -top -nodecount 15 "$out/$name" "$out/cpu.prof" 2>/dev/null | sed -n '1,22p'
go tool pprof -sample_index=alloc_space -top -nodecount 10 "$out/$name" "$out/heap.prof" 2>/dev/null | sed -n '1,16p'

echo "== BenchmarkGenerate (tiny config), pprof CPU -> $out/bench-cpu.prof"
(cd "$dir" && go test -run '^$' -bench BenchmarkGenerate -benchtime 3x -benchmem \
	-cpuprofile "$out/bench-cpu.prof" -o "$out/$name.test" .)

gpu=no
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=yes; fi
if [ "$gpu" = yes ] && command -v nsys >/dev/null 2>&1; then
	echo "== nsys timeline -> $out/nsys.nsys-rep"
	(cd "$dir" && nsys profile -q -o "$out/nsys" "$out/$name" generate --model "$weights" --prompt-ids 1,2,3,4 --max-tokens "$tokens")
else
	echo "== nsys: skipped (GPU: $gpu, nsys: $(command -v nsys || echo absent))"
fi
if [ "$gpu" = yes ] && command -v ncu >/dev/null 2>&1; then
	echo "== ncu kernel metrics -> $out/ncu.ncu-rep"
	(cd "$dir" && RESIN_GPU=1 ncu -o "$out/ncu" --target-processes all go test -count=1 -run Parity ./kernels/...)
else
	echo "== ncu: skipped (GPU: $gpu, ncu: $(command -v ncu || echo absent))"
fi
echo "== profiles in $out"
