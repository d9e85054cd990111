#!/usr/bin/env bash
# scripts/check-kernels.sh: compile every CUDA kernel in core/kernels/cuda for Hopper on a
# machine without a GPU, and report registers, spills and shared memory per kernel.
#
#   scripts/check-kernels.sh          NVRTC if found, else clang-16
#   scripts/check-kernels.sh nvrtc    NVRTC only (core/cudart's binding, through the kernel cache)
#   scripts/check-kernels.sh clang    clang-16 only (-nocudainc -nocudalib, sm_90, PTX 7.8)
#   scripts/check-kernels.sh both
#
# NVRTC and ptxas come from PyPI's nvidia-cuda-nvrtc / nvidia-cuda-nvcc wheels, installed by
# .ci/setup.d/10-cuda-wheels.sh (RESIN_NVRTC_LIB, RESIN_PTXAS); ptxas on PATH also works.
# A kernel that spills registers fails the check.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-auto}
case "$mode" in auto|nvrtc|clang|both) ;; *) echo "usage: $0 [auto|nvrtc|clang|both]" >&2; exit 2;; esac

if [ -z "${RESIN_NVRTC_LIB:-}" ] && [ ! -s .cache/test.env ]; then
	bash .ci/setup.d/10-cuda-wheels.sh >/dev/null 2>&1 || true
fi
if [ -f .cache/test.env ]; then
	set -a; . .cache/test.env; set +a
fi
ptxas=${RESIN_PTXAS:-$(command -v ptxas || true)}

run_nvrtc() {
	echo "== NVRTC (core/cudart) -> sm_90a cubin + compute_90a PTX, ptxas -v"
	local log
	log=$(go test -count=1 -v -run '^TestCompileAllKernelsSM90a$' ./core/kernels/cuda/ 2>&1) || { echo "$log"; return 1; }
	if grep -q -- '--- SKIP' <<<"$log"; then
		grep -A3 -- '--- SKIP' <<<"$log" | sed 's/^/   /'
		return 3
	fi
	grep -E 'NVRTC|regs|PASS|ok ' <<<"$log" | sed 's/^ *compile_test.go:[0-9]*: //'
}

run_clang() {
	local cc
	cc=$(command -v clang-16 || true)
	if [ -z "$cc" ] && command -v clang >/dev/null && clang --version | grep -q 'version 1[6-9]'; then cc=clang; fi
	if [ -z "$cc" ]; then
		echo "== clang-16 not found (apt-get install clang-16)"; return 3
	fi
	echo "== $cc -> sm_90 PTX (no CUDA headers), ptxas -v"
	local out=.cache/kernels-clang fail=0
	mkdir -p "$out"
	for src in core/kernels/cuda/*.cu; do
		local name ptx
		name=$(basename "$src" .cu)
		ptx="$out/$name.ptx"
		"$cc" -x cuda --cuda-gpu-arch=sm_90 --cuda-device-only -nocudainc -nocudalib \
			-Xclang -target-feature -Xclang +ptx78 -O3 -S -Icore/kernels/cuda -Werror -o "$ptx" "$src"
		if [ -z "$ptxas" ]; then
			printf '  %-20s PTX %6d bytes (no ptxas: no register report)\n' "$name.cu" "$(wc -c <"$ptx")"
			continue
		fi
		"$ptxas" -v -arch=sm_90 -o "$out/$name.cubin" "$ptx" 2>&1 | awk -v f="$name.cu" '
			/Compiling entry function/ { match($0, /'"'"'[A-Za-z0-9_]+'"'"'/); k = substr($0, RSTART+1, RLENGTH-2) }
			/spill stores/ { st = $5; ld = $9 }
			/Used [0-9]+ registers/ { r = $0; sub(/.*Used /, "", r); sub(/ registers.*/, "", r)
				sm = 0; if (match($0, /[0-9]+ bytes smem/)) { sm = substr($0, RSTART, RLENGTH); sub(/ bytes smem/, "", sm) }
				printf "  %-20s %-24s regs %3d  spill st/ld %s/%s  smem %5d\n", f, k, r, st, ld, sm
				if (st + ld > 0) bad = 1 }
			END { exit bad }' || fail=1
	done
	return $fail
}

status=0
case "$mode" in
nvrtc) run_nvrtc || status=$? ;;
clang) run_clang || status=$? ;;
both) run_nvrtc || status=$?; run_clang || status=$? ;;
auto)
	set +e; run_nvrtc; s=$?; set -e
	if [ $s -eq 3 ]; then echo "   NVRTC unavailable: falling back to clang-16"; run_clang || status=$?; else status=$s; fi ;;
esac
if [ $status -eq 3 ]; then echo "no kernel compiler found"; exit 1; fi
exit $status
