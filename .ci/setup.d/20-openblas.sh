#!/usr/bin/env bash
# .ci/setup.d/20-openblas.sh: installs OpenBLAS from PyPI's scipy-openblas32 wheel (no root
# needed) under .cache/openblas, so ref.MatMul/MatMulT and the model tests run on a real
# CBLAS through core/blas. Appends RESIN_BLAS_LIB to .cache/test.env, and
# RESIN_BLAS_THREADS=1: go test runs test binaries side by side on CI's cores, and a BLAS
# that splits each GEMM over every core stalls at its barriers when the cores are busy
# (m=8 GEMMs 10x slower under load on 2 threads than on 1). Idempotent; when pip cannot
# install it the tests run on the gonum fallback and the BLAS-only tests skip.
set -uo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dir="$root/.cache/openblas"
ver=0.3.34.481.3
stamp="$dir/.installed-$ver"
mkdir -p "$root/.cache"

if [ ! -e "$stamp" ] && ! command -v python3 >/dev/null; then
	echo "   python3 not found: cannot install scipy-openblas32; GEMM runs on the gonum fallback"
	exit 0
fi
if [ ! -e "$stamp" ]; then
	echo "   installing scipy-openblas32==$ver into $dir"
	rm -rf "$dir.tmp"
	if timeout 600 python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps \
		--target "$dir.tmp" "scipy-openblas32==$ver"; then
		rm -rf "$dir" && mv "$dir.tmp" "$dir" && touch "$stamp"
	else
		rm -rf "$dir.tmp"
		echo "   pip could not install scipy-openblas32; GEMM runs on the gonum fallback"
		exit 0
	fi
fi

lib=$(ls "$dir"/scipy_openblas32/lib/libscipy_openblas*.so 2>/dev/null | head -n1)
if [ -z "$lib" ]; then
	echo "   scipy-openblas32 installed but its library is missing under $dir; GEMM runs on the gonum fallback"
	exit 0
fi
echo "RESIN_BLAS_LIB=$lib" >> "$root/.cache/test.env"
echo "RESIN_BLAS_THREADS=1" >> "$root/.cache/test.env"
echo "   OpenBLAS: $lib (1 thread per test binary)"
