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
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
threads=$(nproc) runs=3 steps=16
while [ $# -gt 0 ]; do
	case "$1" in
	--threads) threads=$2; shift 2 ;;
	--runs) runs=$2; shift 2 ;;
	--steps) steps=$2; shift 2 ;;
	*) echo "glm5-bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
venv=$root/.cache/torch-venv
if [ ! -x "$venv/bin/python" ]; then
	mkdir -p "$root/.cache"
	[ -e "$root/.cache/.gitignore" ] || echo '*' > "$root/.cache/.gitignore"
	python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q "torch==2.15.0" "transformers==5.23.0" "safetensors==0.8.0"
py=("$venv/bin/python" "$root/scripts/glm5-bench.py")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${py[@]}" --print-config > "$tmp/config.json"
out=$root/.cache/bench/glm5-vs-torch.txt
mkdir -p "$(dirname "$out")"

load() { cut -d' ' -f1-3 /proc/loadavg; }
{
	echo "# glm-5-flash vs transformers $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo none)"
	echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(go version | cut -d' ' -f3); load average before Go: $(load)"
	(cd "$root/models/glm-5-flash" &&
		RESIN_GLM5_BENCH_CONFIG=$tmp/config.json GOMAXPROCS=$threads \
			go test -run '^$' -bench 'BenchmarkGLM(Prefill|Decode)$' -benchtime 1x -count "$runs" \
			-cpuprofile "$tmp/cpu.prof" -o "$tmp/glm5.test" . -args -glm5.steps="$steps") | tee "$tmp/go.txt" | grep '^Benchmark'
	for b in prefill/1 prefill/4 decode/1 decode/4; do
		# CPU milliseconds sampled under the timed loop, and those with gonum's BLAS on the stack.
		ms() { go tool pprof -unit=ms -tags -tagfocus "bench=$b" "$@" "$tmp/cpu.prof" 2>/dev/null | sed -n 's/.*Total \([0-9.]*\)ms.*/\1/p' | head -n1; }
		echo "$b $(ms) $(ms -focus 'gonum.org/v1/gonum/blas')" >> "$tmp/profile.txt"
	done
	echo "# load average before torch: $(load)"
	"${py[@]}" --threads "$threads" --runs "$runs" --steps "$steps" --go-bench "$tmp/go.txt" --go-profile "$tmp/profile.txt"
	echo "# load average after: $(load)"
} 2>&1 | tee -a "$out"
echo "== appended to $out"
