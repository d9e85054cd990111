#!/usr/bin/env bash
# scripts/check-kernels.sh: compile every CUDA kernel for Hopper on a machine without a GPU,
# and report registers, spills and shared memory per kernel.
#
#   scripts/check-kernels.sh [auto|nvrtc|clang|both] [DIR...]
#
#   auto (default)  NVRTC if found, else clang-16
#   nvrtc           NVRTC only (core/cudart's binding; core kernels through the kernel cache)
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
# Every kernel compiles with -I core/kernels/cuda (the prelude) and -I its own directory.
# NVRTC and ptxas come from PyPI's nvidia-cuda-nvrtc / nvidia-cuda-nvcc wheels, installed by
# .ci/setup.d/10-cuda-wheels.sh (RESIN_NVRTC_LIB, RESIN_PTXAS); ptxas on PATH also works.
# A kernel that fails to compile or spills registers fails the check.
set -euo pipefail
usage() { echo "usage: $0 [auto|nvrtc|clang|both] [DIR...]" >&2; exit 2; }
mode=auto
case "${1:-}" in
auto|nvrtc|clang|both) mode=$1; shift ;;
-h|--help) usage ;;
esac
dirs=()
for d in "$@"; do
	[ -d "$d" ] || { echo "$0: $d is not a directory (modes: auto|nvrtc|clang|both)" >&2; usage; }
	dirs+=("$(cd "$d" && pwd)")
done
cd "$(dirname "$0")/.."
root=$(pwd)

if [ -z "${RESIN_NVRTC_LIB:-}" ] && [ ! -s .cache/test.env ]; then
	bash .ci/setup.d/10-cuda-wheels.sh >/dev/null 2>&1 || true
fi
if [ -f .cache/test.env ]; then
	set -a; . .cache/test.env; set +a
fi
ptxas=${RESIN_PTXAS:-$(command -v ptxas || true)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The kernels beyond core/kernels/cuda: srcs[i] is the file compiled, labels[i] what the
# table calls it (a rendered template is named by its .cu.tmpl).
core=1
srcs=()
labels=()
add() { srcs+=("$1"); labels+=("$2"); }
shopt -s nullglob
if [ ${#dirs[@]} -gt 0 ]; then
	core=0
	for d in "${dirs[@]}"; do
		n=${#srcs[@]}
		for f in "$d"/*.cu "$d"/kernels/*.cu; do add "$f" "$(basename "$d")/${f#"$d"/}"; done
		[ ${#srcs[@]} -gt "$n" ] || { echo "$0: no .cu files in $d or $d/kernels" >&2; exit 2; }
	done
else
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
width=20
for l in "${labels[@]}"; do [ ${#l} -lt $width ] || width=$((${#l} + 1)); done

# report LABEL PTX ARCH assembles PTX with ptxas -v and prints a line per kernel; it fails
# on spills.
report() {
	local label=$1 ptx=$2 arch=$3
	if [ -z "$ptxas" ]; then
		printf "  %-${width}s PTX %6d bytes (no ptxas: no register report)\n" "$label" "$(wc -c <"$ptx")"
		return 0
	fi
	"$ptxas" -v -arch="$arch" -o "$ptx.cubin" "$ptx" 2>&1 | awk -v f="$label" -v w="$width" '
		/Compiling entry function/ { match($0, /'"'"'[A-Za-z0-9_]+'"'"'/); k = substr($0, RSTART+1, RLENGTH-2) }
		/spill stores/ { st = $5; ld = $9 }
		/^ptxas.*(error|fatal)/ { print; bad = 1 }
		/Used [0-9]+ registers/ { r = $0; sub(/.*Used /, "", r); sub(/ registers.*/, "", r)
			sm = 0; if (match($0, /[0-9]+ bytes smem/)) { sm = substr($0, RSTART, RLENGTH); sub(/ bytes smem/, "", sm) }
			printf "  %-" w "s %-24s regs %3d  spill st/ld %s/%s  smem %5d\n", f, k, r, st, ld, sm
			if (st + ld > 0) bad = 1 }
		END { exit bad }'
}

# nvrtcDriver compiles each file named after the output directory to PTX with core/cudart's
# NVRTC and core/kernels/cuda's options, exiting 3 when NVRTC is not installed.
nvrtcDriver='package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/cuda"
)

func main() {
	out, prelude, files := os.Args[1], os.Args[2], os.Args[3:]
	if v, err := cudart.NVRTCVersion(); err != nil {
		fmt.Fprintln(os.Stderr, "  ", err)
		if errors.Is(err, cudart.ErrNoNVRTC) {
			os.Exit(3)
		}
		os.Exit(1)
	} else {
		fmt.Printf("NVRTC %s from %s\n", v, cudart.NVRTCPath())
	}
	failed := false
	for i, f := range files {
		src, err := os.ReadFile(f)
		if err == nil {
			opts := append([]string{"-I" + prelude, "-I" + filepath.Dir(f)}, cuda.Options...)
			var c cudart.Compiled
			if c, err = cudart.Compile(string(src), filepath.Base(f), "compute_90a", opts...); err == nil {
				if c.Log != "" {
					err = fmt.Errorf("NVRTC warnings:\n%s", c.Log)
				}
				if werr := os.WriteFile(filepath.Join(out, strconv.Itoa(i)+".ptx"), c.PTX, 0o644); err == nil {
					err = werr
				}
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", f, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}
'

run_nvrtc() {
	if [ $core -eq 1 ]; then
		echo "== NVRTC (core/cudart) -> sm_90a cubin + compute_90a PTX, ptxas -v"
		local log
		log=$(go test -count=1 -v -run '^TestCompileAllKernelsSM90a$' ./core/kernels/cuda/ 2>&1) || { echo "$log"; return 1; }
		if grep -q -- '--- SKIP' <<<"$log"; then
			grep -A3 -- '--- SKIP' <<<"$log" | sed 's/^/   /'
			return 3
		fi
		grep -E 'NVRTC|regs|PASS|ok ' <<<"$log" | sed 's/^ *compile_test.go:[0-9]*: //'
	fi
	[ ${#srcs[@]} -gt 0 ] || return 0
	echo "== NVRTC (core/cudart) -> compute_90a PTX, ptxas -v -arch=sm_90a: models, templates and DIRs"
	local out="$work/nvrtc" fail=0 s=0 i
	mkdir -p "$out/driver"
	printf '%s' "$nvrtcDriver" >"$out/driver/main.go"
	go build -o "$out/driver/nvrtc-check" "$out/driver/main.go" || return 1
	"$out/driver/nvrtc-check" "$out" "$root/core/kernels/cuda" "${srcs[@]}" || s=$?
	[ $s -ne 3 ] || return 3
	[ $s -eq 0 ] || fail=1
	for i in "${!srcs[@]}"; do
		if [ -f "$out/$i.ptx" ]; then
			report "${labels[$i]}" "$out/$i.ptx" sm_90a || fail=1
		else
			printf "  %-${width}s FAILED to compile (above)\n" "${labels[$i]}"
		fi
	done
	return $fail
}

run_clang() {
	local cc
	cc=$(command -v clang-16 || true)
	if [ -z "$cc" ] && command -v clang >/dev/null && clang --version | grep -q 'version 1[6-9]'; then cc=clang; fi
	if [ -z "$cc" ]; then
		echo "== clang-16 not found (apt-get install clang-16)"; return 3
	fi
	echo "== $cc -> sm_90 PTX (no CUDA headers), ptxas -v"
	local out=.cache/kernels-clang fail=0 i files=() names=()
	mkdir -p "$out"
	if [ $core -eq 1 ]; then
		for src in core/kernels/cuda/*.cu; do files+=("$src"); names+=("$(basename "$src")"); done
	fi
	files+=("${srcs[@]}")
	names+=("${labels[@]}")
	for i in "${!files[@]}"; do
		local src=${files[$i]} ptx
		ptx="$out/$(echo "${names[$i]}" | tr '/' '_' | sed 's/\.cu\(\.tmpl\)*$//').ptx"
		if ! "$cc" -x cuda --cuda-gpu-arch=sm_90 --cuda-device-only -nocudainc -nocudalib \
			-Xclang -target-feature -Xclang +ptx78 -O3 -S -Icore/kernels/cuda -I"$(dirname "$src")" -Werror -o "$ptx" "$src"; then
			printf "  %-${width}s FAILED to compile (above)\n" "${names[$i]}"
			fail=1
			continue
		fi
		report "${names[$i]}" "$ptx" sm_90 || fail=1
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
