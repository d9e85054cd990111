#!/usr/bin/env bash
# scripts/dspark-cpu-bench.sh: DSpark's speed on the CPU, side by side: `resin bench model`
# on one Qwen3 target without DSpark, with a random DSpark drafter (drafts almost never
# accepted: DSpark's cost alone) and with a drafter whose drafts are forced right (every
# draft accepted: its best case). Prints output tokens/s and the mean accepted length
# (accepted drafts per verification) of each, the median over RUNS runs, and the speed-ups
# against no DSpark.
#
# The checkpoints are core/dspark/fixture's (go run ./core/dspark/fixture/cmd/dspark-fixture):
# a ~30M-parameter Qwen3 target (hidden 512, 8 layers, vocab 512) whose o_proj and
# down_proj are zero, so its greedy next token is t+1 after t, and two 2-layer DeepSpec
# drafters with blocks of BLOCK: the forced one's vanilla Markov head (rank = vocab) puts
# +100 on t+1, the random one is seeded random. Every layer is computed at full cost;
# only the values make the acceptance what it is. Loaded by the ordinary loaders
# (models/llama, core/dspark), run through core/engine as any checkpoint.
#
# Environment: REQUESTS (4), CONCURRENCY (1), PROMPT_LEN (64), GEN_LEN (64), RUNS (3),
# BLOCK (7), OUT (default .cache/dspark-cpu-bench).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
requests=${REQUESTS:-4}
concurrency=${CONCURRENCY:-1}
prompt=${PROMPT_LEN:-64}
gen=${GEN_LEN:-64}
runs=${RUNS:-3}
block=${BLOCK:-7}
out=${OUT:-$(pwd)/.cache/dspark-cpu-bench}
mkdir -p "$out"
go build -o "$out/resin" ./cmd/resin
go run ./core/dspark/fixture/cmd/dspark-fixture -out "$out" -size bench -block-size "$block" >/dev/null

echo "load before: $(uptime)"
echo "bench model: $requests requests × ($prompt prompt + $gen generated) tokens, concurrency $concurrency, block $block, median of $runs runs"
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
declare -A tps mean
for kind in none random forced; do
	args=()
	[ "$kind" != none ] && args=(--speculative-method dspark --draft-model "$out/$kind")
	: > "$out/$kind.tps"; : > "$out/$kind.mean"
	for _ in $(seq "$runs"); do
		"$out/resin" bench model --model llama --weights "$out/target" --requests "$requests" --concurrency "$concurrency" \
			--prompt-len "$prompt" --gen-len "$gen" "${args[@]}" > "$out/$kind.log" 2>/dev/null
		sed -n 's/.*output \([0-9.]*\) tokens\/s.*/\1/p' "$out/$kind.log" >> "$out/$kind.tps"
		m=$(sed -n 's/.*mean accepted length \([0-9.]*\) over.*/\1/p' "$out/$kind.log")
		echo "${m:-0}" >> "$out/$kind.mean"
	done
	tps[$kind]=$(median < "$out/$kind.tps")
	mean[$kind]=$(median < "$out/$kind.mean")
done
printf '%-28s %14s %22s %10s\n' "" "output tok/s" "mean accepted length" "speed-up"
for kind in none random forced; do
	label=$kind
	case $kind in none) label="no DSpark" ;; random) label="DSpark, random drafter" ;; forced) label="DSpark, forced-right drafter" ;; esac
	printf '%-28s %14.1f %22s %9.2fx\n' "$label" "${tps[$kind]}" "$([ $kind = none ] && echo - || echo "${mean[$kind]} / $block")" \
		"$(awk -v a="${tps[$kind]}" -v b="${tps[none]}" 'BEGIN {print a / b}')"
done
echo "load after: $(uptime)"
