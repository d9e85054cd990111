#!/usr/bin/env bash
# scripts/cpu-gemm-bench.sh: Resin's own CPU GEMM (core/kernels/ref, RESIN_BLAS=own) side by
# side with OpenBLAS (the scipy-openblas32 of .ci/setup.d/20-openblas.sh, or RESIN_BLAS_LIB)
# and gonum, at the shapes of a ~120M llama, then end to end.
#
#   1. BenchmarkSGEMM (m=512 and 128 against each weight: qkv, o, gate+up, down, lm head),
#      ROUNDS counts: the median GFLOP/s of each backend and own/OpenBLAS, per second of
#      wall clock and per second of the process's CPU time (which follows the load of a
#      shared machine much less).
#   2. `resin bench model --model llama --random-weights` on scripts/llama-bench-config.json's
#      ~120M config, batch sizes BATCHES, PROMPT_LEN-token prompts: own and OpenBLAS
#      alternating for ROUNDS rounds (which goes first alternates too), each round's
#      prefill and decode tokens/s and own/OpenBLAS ratios, then the medians.
#
# On a shared machine the speed drifts by tens of percent over seconds: read the medians of
# the ratios, and the load printed with each round.
#
# Environment: ROUNDS (default 5), BATCHES (1,8), PROMPT_LEN (512), GEN_LEN (32), REPEAT (3
# runs a side per round, the median kept), GONUM=0
# skips gonum in part 1 (it is slow), PART=1 or 2 runs one part, OUT (default
# .cache/cpu-gemm-bench).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
root=$(pwd)
rounds=${ROUNDS:-5}
batches=${BATCHES:-1,8}
prompt=${PROMPT_LEN:-512}
gen=${GEN_LEN:-32}
repeat=${REPEAT:-3}
part=${PART:-all}
out=${OUT:-$root/.cache/cpu-gemm-bench}
mkdir -p "$out"

if [ -z "${RESIN_BLAS_LIB:-}" ]; then
	[ -e "$root/.cache/openblas" ] || .ci/setup.d/20-openblas.sh
	RESIN_BLAS_LIB=$(ls "$root"/.cache/openblas/scipy_openblas32/lib/libscipy_openblas*.so 2>/dev/null | head -n1 || true)
fi
if [ -z "$RESIN_BLAS_LIB" ]; then
	echo "no OpenBLAS: set RESIN_BLAS_LIB or let .ci/setup.d/20-openblas.sh install it" >&2
	exit 1
fi
export RESIN_BLAS_LIB RESIN_BLAS_THREADS=1
echo "== machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load $(cut -d' ' -f1-3 /proc/loadavg), $(go version | cut -d' ' -f3)"
echo "== OpenBLAS: $RESIN_BLAS_LIB"

median='function med(s,   a, n, i, j, t) { n = split(s, a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }; return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }'

if [ "$part" = all ] || [ "$part" = 1 ]; then
	echo "== BenchmarkSGEMM, $rounds counts (GFLOP/s, median)"
	short=()
	[ "${GONUM:-1}" = 0 ] && short=(-short)
	go test ./core/kernels/ref -run '^$' -bench '^BenchmarkSGEMM$' -count "$rounds" "${short[@]}" | tee "$out/sgemm.txt" |
		awk "$median"'
			/^BenchmarkSGEMM\// {
				split($1, p, "/"); shape = p[2] "/" p[3]; sub(/-[0-9]+$/, "", p[4])
				for (i = 1; i < NF; i++) {
					if ($(i+1) == "GFLOP/s") g[shape, p[4], "w"] = g[shape, p[4], "w"] " " $i
					if ($(i+1) == "GFLOP/cpu-s") g[shape, p[4], "c"] = g[shape, p[4], "c"] " " $i
				}
				if (!(shape in seen)) { seen[shape] = 1; order[++n] = shape }
			}
			END {
				printf "  %-30s %24s   %s\n", "", "per second (wall clock)", "per CPU-second of the process"
				printf "  %-30s %7s %8s %7s %6s   %7s %8s %7s %6s\n", "shape", "own", "OpenBLAS", "gonum", "own/B", "own", "OpenBLAS", "gonum", "own/B"
				for (i = 1; i <= n; i++) {
					s = order[i]; line = sprintf("  %-30s", s)
					for (c = 1; c <= 2; c++) {
						u = c == 1 ? "w" : "c"
						o = med(g[s, "own", u]); b = med(g[s, "blas", u])
						q = g[s, "gonum", u] == "" ? "-" : sprintf("%.1f", med(g[s, "gonum", u]))
						line = line sprintf(" %7.1f %8.1f %7s %5.2fx  ", o, b, q, (b > 0 ? o / b : 0))
					}
					print line
				}
			}'
fi

if [ "$part" = all ] || [ "$part" = 2 ]; then
	cp scripts/llama-bench-config.json "$out/config.json"
	go build -o "$out/resin" ./cmd/resin
	echo "== resin bench model: llama, ~120M random weights, batch sizes $batches, $prompt-token prompts, $gen generated, GOMAXPROCS $(nproc)"
	rm -f "$out"/e2e.*.txt "$out"/ratio.*.txt
	for round in $(seq 1 "$rounds"); do
		order="own blas"
		[ $((round % 2)) = 0 ] && order="blas own"
		echo "== round $round of $rounds (load $(cut -d' ' -f1 /proc/loadavg))"
		for mode in $order; do
			RESIN_BLAS=$mode "$out/resin" bench model --model llama --random-weights "$out/config.json" \
				--batch-sizes "$batches" --prompt-len "$prompt" --gen-len "$gen" --repeat "$repeat" 2>&1 |
				grep 'batch [0-9]' | sed "s/^ */  $mode /" | tee "$out/e2e.$round.$mode.txt"
		done
		cat "$out/e2e.$round.own.txt" "$out/e2e.$round.blas.txt" | awk '
			{ v[$1, $3, "p"] = $5; v[$1, $3, "d"] = $8; bs[$3] = 1 }
			END { for (b in bs) printf "  ratio batch %s  prefill %.2fx  decode %.2fx (own/OpenBLAS)\n", b, v["own", b, "p"] / v["blas", b, "p"], v["own", b, "d"] / v["blas", b, "d"] }' |
			sort -n -k3 | tee "$out/ratio.$round.txt"
	done
	echo "== summary: median over $rounds rounds (tokens/s; ratio: the median of the rounds' own/OpenBLAS)"
	cat "$out"/e2e.*.txt "$out"/ratio.*.txt | awk "$median"'
		$2 == "batch" { t[$1, $3, "p"] = t[$1, $3, "p"] " " $5; t[$1, $3, "d"] = t[$1, $3, "d"] " " $8; bs[$3] = 1 }
		$1 == "ratio" { r[$3, "p"] = r[$3, "p"] " " ($5 + 0); r[$3, "d"] = r[$3, "d"] " " ($7 + 0) }
		END { for (b in bs) printf "  batch %s  prefill own %.1f OpenBLAS %.1f (%.2fx)  decode own %.1f OpenBLAS %.1f (%.2fx)\n", b,
			med(t["own", b, "p"]), med(t["blas", b, "p"]), med(r[b, "p"]), med(t["own", b, "d"]), med(t["blas", b, "d"]), med(r[b, "d"]) }' | sort -n -k2
fi
