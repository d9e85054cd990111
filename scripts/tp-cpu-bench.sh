#!/usr/bin/env bash
# scripts/tp-cpu-bench.sh: llama's CPU tensor parallelism, TP=1 against TP=2, on the
# llama bench config (scripts/llama-cpu-bench.sh's ~120M llama: hidden 1024, 8 layers,
# 16 heads / 4 KV heads, intermediate 2816, vocab 32000, fp32, seeded random weights).
# Prints prefill and decode tokens/s side by side for
#
#   tp1        `resin bench model --model llama` (models/llama's own forward)
#   tp2        `--tp 2`: two ranks, goroutines of one process (core/dist/tp)
#   tp2-procs  `--tp 2 --tp-procs`: rank 1 a worker process meeting rank 0 in shared memory
#
# and, for the TP=2 layouts, the share of rank 0's prefill and decode steps spent inside
# collectives (`--dist-stats`: the plan broadcast, the embedding's and the 2 per layer
# all-reduces, the logits' all-gather; waiting for the other rank included, so on a
# machine whose two ranks share cores it holds the other rank's lag too).
#
# Each measurement is one `bench model --batch-sizes BATCH --repeat 1` process (one
# prompt of PROMPT_LEN tokens in one engine step, then GEN_LEN-1 decode steps); the
# layouts alternate ROUNDS times (tp1, tp2, tp2-procs, tp1, ...), so each sees the same
# machine, and the summary is the median over rounds. The load (uptime) is printed
# with each round: on a shared machine the figures drift.
#
# Environment: PROMPT_LEN (512), GEN_LEN (32), BATCH (1), ROUNDS (3), LAYOUTS
# ("tp1 tp2 tp2-procs"; LAYOUT@N runs it with GOMAXPROCS N in each process, e.g.
# tp2-procs@1: two processes of one thread, as many threads as tp1 at GOMAXPROCS 2),
# GOMAXPROCS (default: nproc, each process), CONFIG (an HF
# config.json instead of the default), OUT (.cache/tp-cpu-bench). The BLAS: as
# llama-cpu-bench.sh (RESIN_BLAS_LIB from .cache/test.env when set there).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
root=$(pwd)
prompt=${PROMPT_LEN:-512}
gen=${GEN_LEN:-32}
batch=${BATCH:-1}
rounds=${ROUNDS:-3}
layouts=${LAYOUTS:-tp1 tp2 tp2-procs}
out=${OUT:-$root/.cache/tp-cpu-bench}
export GOMAXPROCS=${GOMAXPROCS:-$(nproc)}
mkdir -p "$out"

# The llama bench config (scripts/llama-bench-config.json) unless CONFIG names another.
cp "${CONFIG:-$root/scripts/llama-bench-config.json}" "$out/config.json"

if [ -z "${RESIN_BLAS_LIB:-}" ] && [ -f "$root/.cache/test.env" ]; then
	lib=$(sed -n 's/^RESIN_BLAS_LIB=//p' "$root/.cache/test.env" | tail -n1)
	if [ -n "$lib" ] && [ -f "$lib" ]; then export RESIN_BLAS_LIB=$lib; fi
fi

# The pool: the KV cache of the batch's tokens and a margin (layers × 2 × kv_heads ×
# head_dim × 4 bytes a token), at least 64 MiB.
cache_bytes=$(python3 - "$out/config.json" "$batch" "$prompt" "$gen" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
per_token = c["num_hidden_layers"] * 2 * c.get("num_key_value_heads", c["num_attention_heads"]) * hd * 4
print(max(64 << 20, per_token * (int(sys.argv[2]) * (int(sys.argv[3]) + int(sys.argv[4]) + 64) + 4096)))
EOF
)

echo "== machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), GOMAXPROCS $GOMAXPROCS, BLAS ${RESIN_BLAS_LIB:-searched}, $(go version | cut -d' ' -f3), commit $(git rev-parse --short HEAD 2>/dev/null || echo none)"
echo "== config: $(tr -d ' \n' < "$out/config.json" | head -c 400)"
echo "== batch $batch, prompt $prompt tokens (one step), $gen generated; $rounds rounds of: $layouts"
go build -o "$out/resin" ./cmd/resin

flags() {
	case ${1%@*} in
	tp1) ;;
	tp2) echo --tp 2 --dist-stats ;;
	tp2-procs) echo --tp 2 --tp-procs --dist-stats ;;
	*) echo "tp-cpu-bench.sh: unknown layout $1 (tp1, tp2, tp2-procs)" >&2; exit 2 ;;
	esac
}

# share(LINE): the "(0.123 of the steps)" figure of a --dist-stats line (POSIX awk).
share_fn='function share(s) { sub(/ of the steps\).*/, "", s); sub(/.*\(/, "", s); return s }'
rm -f "$out"/run.*.txt
for round in $(seq 1 "$rounds"); do
	echo "== round $round of $rounds (load $(cut -d' ' -f1-3 /proc/loadavg))"
	for l in $layouts; do
		f="$out/run.$l.$round.txt"
		# shellcheck disable=SC2046
		procs=$GOMAXPROCS
		case $l in *@*) procs=${l#*@} ;; esac
		GOMAXPROCS=$procs "$out/resin" bench model --model llama --random-weights "$out/config.json" --cache-bytes "$cache_bytes" \
			--max-batch-tokens $((batch * prompt + 64)) --batch-sizes "$batch" --prompt-len "$prompt" --gen-len "$gen" \
			--repeat 1 $(flags "$l") > "$f" 2>&1 || { cat "$f" >&2; exit 1; }
		awk -v l="$l" "$share_fn"'
			/batch [0-9]+  prefill/ { pre = $4; dec = $7 }
			/rank 0 prefill:/ { sp = share($0) }
			/rank 0 decode:/ { sd = share($0) }
			END { printf "  %-12s prefill %8.1f tok/s  decode %7.1f tok/s", l, pre, dec
			      if (sp != "") printf "   comm share prefill %s decode %s", sp, sd
			      printf "\n" }' "$f"
	done
done

echo "== summary: median over $rounds rounds (tokens/s; ×: against tp1's median; comm: rank 0's share of a step inside collectives)"
for l in $layouts; do
	cat "$out"/run."$l".*.txt | awk -v l="$l" "$share_fn"'
		function median(list,   n, a, i, j, t) {
			n = split(list, a, " ")
			for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		/batch [0-9]+  prefill/ { pre = pre " " $4; dec = dec " " $7 }
		/rank 0 prefill:/ { sp = sp " " share($0) }
		/rank 0 decode:/ { sd = sd " " share($0) }
		END { printf "%s %s %s %s %s\n", l, median(pre), median(dec), (sp == "" ? "-" : median(sp)), (sd == "" ? "-" : median(sd)) }'
done > "$out/summary.txt"
awk 'NR == 1 { p1 = $2; d1 = $3 }
	{ printf "  %-12s prefill %8.1f tok/s (%.2f×)  decode %7.1f tok/s (%.2f×)", $1, $2, $2 / p1, $3, $3 / d1
	  if ($4 != "-") printf "   comm share prefill %.2f decode %.2f", $4, $5
	  printf "\n" }' "$out/summary.txt"
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
