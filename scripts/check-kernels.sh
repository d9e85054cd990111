#!/usr/bin/env bash
# scripts/check-kernels.sh: compile every CUDA kernel for Hopper and Blackwell on a machine without a GPU,
# and report registers, spills and shared memory per kernel.
#
#   scripts/check-kernels.sh [auto|nvrtc|clang|both] [DIR...]
#
#   auto (default)  NVRTC if found, else clang-16
#   nvrtc           NVRTC only (core/cudart's binding): sm_90a and sm_100a cubins and PTX
#   clang           clang-16 only (-nocudainc -nocudalib, sm_90, PTX 7.8)
#   both
#
# Without DIR it checks core/kernels/cuda/*.cu, every model's models/*/kernels/*.cu, and the
# templates' kernels: templates/**/kernels/*.cu as they are, and *.cu.tmpl rendered through
# a throwaway `resin-new model kcheck --base BASE` scaffold. With DIR... it checks only the
# .cu files in each DIR and in DIR/kernels, so a generated runtime checks its own:
#
#   scripts/check-kernels.sh both ../my-runtime
#
# Every kernel compiles as the runtimes compile it: core/kernels/cuda's prelude.cuh and
# NVRTC flags, other quoted includes from its own directory (core/kernels/kernelcheck).
# NVRTC and ptxas come from PyPI's nvidia-cuda-nvrtc / nvidia-cuda-nvcc wheels, installed by
# .ci/setup.d/10-cuda-wheels.sh (RESIN_NVRTC_LIB, RESIN_PTXAS); ptxas on PATH also works.
# A kernel that fails to compile or spills registers fails the check.
set -euo pipefail
usage() { echo "usage: $0 [auto|nvrtc|clang|both] [DIR...]" >&2; exit 2; }
mode=auto
case "${1:-}" in
auto|nvrtc|clang|both) mode=$1; shift ;;
-h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
esac
dirs=()
for d in "$@"; do
	[ -d "$d" ] || { echo "$0: $d is not a directory (modes: auto|nvrtc|clang|both)" >&2; usage; }
	dirs+=("$(cd "$d" && pwd)")
done
cd "$(dirname "$0")/.."

if [ -z "${RESIN_NVRTC_LIB:-}" ] && [ ! -s .cache/test.env ]; then
	bash .ci/setup.d/10-cuda-wheels.sh >/dev/null 2>&1 || true
fi
if [ -f .cache/test.env ]; then
	set -a; . .cache/test.env; set +a
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# srcs[i] is a file to compile, labels[i] what the table calls it (a rendered template is
# named by its .cu.tmpl).
srcs=()
labels=()
add() { srcs+=("$1"); labels+=("$2"); }
shopt -s nullglob
if [ ${#dirs[@]} -gt 0 ]; then
	for d in "${dirs[@]}"; do
		n=${#srcs[@]}
		for f in "$d"/*.cu "$d"/kernels/*.cu; do add "$f" "$(basename "$d")/${f#"$d"/}"; done
		[ ${#srcs[@]} -gt "$n" ] || { echo "$0: no .cu files in $d or $d/kernels" >&2; exit 2; }
	done
else
	for f in core/kernels/cuda/*.cu; do add "$f" "$(basename "$f")"; done
	for f in models/*/kernels/*.cu; do add "$f" "$f"; done
	while IFS= read -r f; do add "$f" "$f"; done < <(find templates -path '*/kernels/*.cu' -type f | sort)
	bases=$(find templates -path '*/kernels/*.cu.tmpl' -type f | cut -d/ -f2 | sort -u)
	for base in $bases; do
		out="$work/render-$base"
		if ! go run ./cmd/resin-new model kcheck --base "$base" --out "$out" >"$work/render-$base.log" 2>&1; then
			echo "render templates/$base: resin-new failed:" >&2; cat "$work/render-$base.log" >&2; exit 1
		fi
		for f in "$out"/kernels/*.cu; do add "$f" "templates/$base/kernels/$(basename "$f").tmpl"; done
	done
fi
shopt -u nullglob
args=()
for i in "${!srcs[@]}"; do args+=("${labels[$i]}=${srcs[$i]}"); done

# The checks themselves are core/kernels/kernelcheck's, through its command: it exits 3
# when the compiler is not installed, 1 when a kernel fails to compile, warns or spills.
go build -o "$work/kernelcheck" ./core/kernels/kernelcheck/cmd/kernelcheck
run_nvrtc() { "$work/kernelcheck" -compiler nvrtc -arch sm_90a,sm_100a "${args[@]}"; }
run_clang() { "$work/kernelcheck" -compiler clang "${args[@]}"; }

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
