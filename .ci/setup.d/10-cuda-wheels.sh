#!/usr/bin/env bash
# .ci/setup.d/10-cuda-wheels.sh: installs NVRTC (libnvrtc.so) and ptxas from PyPI's NVIDIA
# wheels under .cache/cuda-wheels, so the kernel tests compile every .cu for sm_90a (Hopper)
# and sm_100a (Blackwell; NVRTC and ptxas 12.8 and newer know it) with the production
# compiler on a machine without a GPU or driver. Appends RESIN_NVRTC_LIB and
# RESIN_PTXAS to .cache/test.env. Idempotent; a registry out of reach only makes those
# tests skip.
set -uo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dir="$root/.cache/cuda-wheels"
ver=12.9.86
stamp="$dir/.installed-$ver"
mkdir -p "$root/.cache"

if [ ! -e "$stamp" ] && ! command -v python3 >/dev/null; then
	echo "   python3 not found: cannot install the CUDA wheels; NVRTC/ptxas tests will skip"
	exit 0
fi
if [ ! -e "$stamp" ]; then
	echo "   installing nvidia-cuda-nvrtc-cu12==$ver nvidia-cuda-nvcc-cu12==$ver into $dir"
	rm -rf "$dir.tmp"
	if timeout 600 python3 -m pip install -q --disable-pip-version-check --no-deps \
		--target "$dir.tmp" "nvidia-cuda-nvrtc-cu12==$ver" "nvidia-cuda-nvcc-cu12==$ver"; then
		rm -rf "$dir" && mv "$dir.tmp" "$dir" && touch "$stamp"
	else
		rm -rf "$dir.tmp"
		echo "   pip could not install the CUDA wheels; NVRTC/ptxas tests will skip"
		exit 0
	fi
fi

nvrtc=$(ls "$dir"/nvidia/cuda_nvrtc/lib/libnvrtc.so* 2>/dev/null | grep -v builtins | head -n1)
ptxas="$dir/nvidia/cuda_nvcc/bin/ptxas"
if [ -n "$nvrtc" ]; then
	echo "RESIN_NVRTC_LIB=$nvrtc" >> "$root/.cache/test.env"
fi
if [ -x "$ptxas" ]; then
	echo "RESIN_PTXAS=$ptxas" >> "$root/.cache/test.env"
fi
echo "   NVRTC: ${nvrtc:-missing}; ptxas: $( [ -x "$ptxas" ] && echo "$ptxas" || echo missing)"
