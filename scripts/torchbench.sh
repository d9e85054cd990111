# scripts/torchbench.sh: the shell side of the CPU speed comparisons, sourced by
# scripts/glm5-bench.sh and scripts/deepseek-v4-bench.sh (see their headers). The torch
# side is scripts/torchbench.py.
#
# torchbench NAME PACKAGE BENCH CONFIG_ENV STEPS_FLAG DEFAULT_STEPS [--threads N] [--runs R] [--steps S]
#   runs scripts/NAME-bench.py's config through models/PACKAGE's BenchmarkBENCHPrefill and
#   BenchmarkBENCHDecode (the config file in $CONFIG_ENV, -STEPS_FLAG decode steps per op)
#   under a CPU profile, then the torch side on the same config and thread count, and
#   prints the table, with the machine and its load average, appending it to
#   .cache/bench/NAME-vs-torch.txt.

torchbench() {
	local name=$1 pkg=$2 bench=$3 config_env=$4 steps_flag=$5 steps=$6
	shift 6
	local root threads runs=3
	root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
	threads=$(nproc)
	while [ $# -gt 0 ]; do
		case "$1" in
		--threads) threads=$2; shift 2 ;;
		--runs) runs=$2; shift 2 ;;
		--steps) steps=$2; shift 2 ;;
		*) echo "$name-bench.sh: unknown argument $1 (see --help)" >&2; return 2 ;;
		esac
	done
	local venv=$root/.cache/torch-venv
	if [ ! -x "$venv/bin/python" ]; then
		mkdir -p "$root/.cache"
		[ -e "$root/.cache/.gitignore" ] || echo '*' > "$root/.cache/.gitignore"
		python3 -m venv "$venv"
	fi
	"$venv/bin/pip" install -q "torch==2.15.0" "transformers==5.23.0" "safetensors==0.8.0"
	local py=("$venv/bin/python" "$root/scripts/$name-bench.py")
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	"${py[@]}" --print-config > "$tmp/config.json"
	local out=$root/.cache/bench/$name-vs-torch.txt
	mkdir -p "$(dirname "$out")"

	load() { cut -d' ' -f1-3 /proc/loadavg; }
	# CPU milliseconds sampled under the timed loop of benchmark $1 ("prefill/4"), and with
	# -focus, those with gonum's BLAS on the stack.
	ms() { local b=$1; shift; go tool pprof -unit=ms -tags -tagfocus "bench=$b" "$@" "$tmp/cpu.prof" 2>/dev/null | sed -n 's/.*Total \([0-9.]*\)ms.*/\1/p' | head -n1; }
	{
		echo "# $pkg vs transformers $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo none)"
		echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(go version | cut -d' ' -f3); load average before Go: $(load)"
		(cd "$root/models/$pkg" &&
			env "$config_env=$tmp/config.json" GOMAXPROCS="$threads" \
				go test -run '^$' -bench "Benchmark$bench(Prefill|Decode)\$" -benchtime 1x -count "$runs" \
				-cpuprofile "$tmp/cpu.prof" -o "$tmp/$name.test" . -args -"$steps_flag"="$steps") | tee "$tmp/go.txt" | grep '^Benchmark'
		# The benchmarks that ran, as "prefill/4".
		local b
		: > "$tmp/profile.txt"
		for b in $(sed -n "s/^Benchmark$bench\(Prefill\|Decode\)\/batch=\([0-9]*\).*/\1\/\2/p" "$tmp/go.txt" | tr 'A-Z' 'a-z' | sort -u); do
			echo "$b $(ms "$b") $(ms "$b" -focus 'gonum.org/v1/gonum/blas')" >> "$tmp/profile.txt"
		done
		echo "# load average before torch: $(load)"
		"${py[@]}" --threads "$threads" --runs "$runs" --steps "$steps" --go-bench "$tmp/go.txt" --go-profile "$tmp/profile.txt"
		echo "# load average after: $(load)"
	} 2>&1 | tee -a "$out"
	echo "== appended to $out"
}
