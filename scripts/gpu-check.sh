#!/usr/bin/env bash
# scripts/gpu-check.sh: the GPU check, in one script for a machine with an NVIDIA GPU.
#
# It checks for the driver (and says what is missing), builds Resin, prints `resin doctor`,
# runs the gpu-tagged tests of core/... verbosely (NVRTC compile + launch, CUDA graph
# capture and replay, cuBLASLt GEMM against the CPU, every shared kernel against its
# core/kernels/ref reference, the device arena) and the GPU runner's tests (core/gpurunner:
# dense bf16 logits against the CPU reference within 0.05 + 2% of the row's largest logit,
# graph replay equal to eager bit for bit, device greedy sampling equal to the CPU
# sampler's), then the runner's figures for a ~1.1B-parameter random-weight llama: decode
# tokens/s at batch 1, 32 and 256, prefill tokens/s and each decode step against the HBM
# roofline (weights + KV bytes read per step ÷ device-to-device copy bandwidth), and the
# same model end to end through the engine (`resin bench model --device cuda`). It ends
# with the parity lines and the figures. It takes a few minutes (under 8 on an H100/H200);
# each test binary is limited to 5 minutes.
#
#   scripts/gpu-check.sh            build with the local Go toolchain, then run
#   scripts/gpu-check.sh --build    only build the binaries into .cache/gpu-bin (for a GPU
#                                   machine without Go: carry .cache/gpu-bin there and run
#                                   scripts/gpu-check.sh, which then uses them)
#
# Libraries: libcuda from the driver; NVRTC, cuBLASLt and NCCL from the CUDA toolkit or
# NVIDIA's Python wheels (found automatically; RESIN_CUDA_LIB_DIR or RESIN_NVRTC_LIB
# override). Output is also written to $OUT/gpu-check.log (without OUT: .cache/gpu-check.log).
set -uo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
root=$(pwd)
bin="$root/.cache/gpu-bin"
log=${OUT:-$root/.cache}/gpu-check.log
mkdir -p "$(dirname "$log")"

build() {
	echo "== build ($(go version))"
	rm -rf "$bin" && mkdir -p "$bin"
	CGO_ENABLED=0 go build -ldflags='-s -w' -o "$bin/resin" ./cmd/resin || return 1
	# Test binaries of every core package with gpu-tagged tests, plus the GPU packages
	# (core/gpurunner's TestGPU* tests need no tag).
	local pkgs
	pkgs=$( (grep -rl --include='*_test.go' '^//go:build gpu' core | xargs -r -n1 dirname; echo core/cudart; echo core/kernels/cuda; echo core/gpurunner) | sort -u)
	for dir in $pkgs; do
		local name=${dir//\//_}
		CGO_ENABLED=0 go test -c -tags gpu -ldflags='-s -w' -o "$bin/$name.test" "./$dir" || return 1
		echo "$name $dir" >>"$bin/packages.txt"
	done
	ls -la "$bin"
}

# driver checks that an NVIDIA driver is installed, and says what is missing when not.
driver() {
	local lib
	lib=$( (ldconfig -p 2>/dev/null | grep -o '/[^ ]*libcuda\.so\.1$'; ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1 2>/dev/null) | head -n1)
	if [ -z "$lib" ] && [ -z "${RESIN_CUDA_LIB_DIR:-}" ]; then
		echo "no NVIDIA driver here: libcuda.so.1 is not in the loader's cache nor in the usual directories"
		echo "(install the NVIDIA driver, or point RESIN_CUDA_LIB_DIR at the directory holding libcuda.so.1)"
		return 1
	fi
	echo "driver: ${lib:-under RESIN_CUDA_LIB_DIR=$RESIN_CUDA_LIB_DIR}"
	command -v nvidia-smi >/dev/null || echo "note: nvidia-smi not found (the driver library is; continuing)"
}

main() {
	local start=$SECONDS
	echo "== machine"
	date -u
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || echo "nvidia-smi not available"
	driver || return 1
	if command -v go >/dev/null; then
		build || { echo "BUILD FAILED"; return 1; }
	elif [ -x "$bin/resin" ]; then
		echo "== no Go toolchain here: using the binaries in $bin"
	else
		echo "no Go toolchain and no prebuilt $bin (run scripts/gpu-check.sh --build where Go is)"; return 1
	fi

	# .cache/test.env (from .ci/setup.d) names NVRTC and ptxas where the setup ran.
	if [ -f .cache/test.env ]; then set -a; . .cache/test.env; set +a; fi
	# Otherwise look for them in a CUDA toolkit or NVIDIA's Python wheels.
	if [ -z "${RESIN_NVRTC_LIB:-}" ] && [ -z "${RESIN_CUDA_LIB_DIR:-}" ]; then
		for f in /usr/local/cuda/lib64/libnvrtc.so /usr/local/cuda/lib64/libnvrtc.so.* \
			/opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.* \
			/usr/local/lib/python3*/dist-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.*; do
			case "$f" in *builtins*|*alt*) continue;; esac
			[ -e "$f" ] && { export RESIN_NVRTC_LIB=$f; break; }
		done
	fi
	if [ -z "${RESIN_PTXAS:-}" ]; then
		p=$(command -v ptxas || ls /usr/local/cuda/bin/ptxas 2>/dev/null || true)
		[ -n "$p" ] && export RESIN_PTXAS=$p
	fi
	export RESIN_KERNEL_CACHE=${RESIN_KERNEL_CACHE:-$root/.cache/gpu-kernel-cache}
	echo "RESIN_NVRTC_LIB=${RESIN_NVRTC_LIB:-} RESIN_PTXAS=${RESIN_PTXAS:-}"

	echo; echo "== resin doctor"
	"$bin/resin" doctor

	local failed=0
	while read -r name dir; do
		echo; echo "== go test -tags gpu ./$dir"
		# core/gpurunner's figures (RESIN_GPU_FIGURES) run there, after its checks.
		# stdin is the package list this loop reads: keep the tests off it.
		(cd "$dir" && RESIN_GPU_FIGURES=1 timeout 300 "$bin/$name.test" -test.v -test.count=1 -test.timeout=290s </dev/null) || failed=1
	done <"$bin/packages.txt"

	# The same ~1.1B llama end to end: the engine, the GPU runner, device sampling.
	echo; echo "== resin bench model --model llama --device cuda (~1.1B random weights)"
	local cfg=$root/.cache/gpu-check-llama-1b.json
	cat >"$cfg" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000, "hidden_size": 2048,
 "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
 "intermediate_size": 8192, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 500000,
 "hidden_act": "silu", "tie_word_embeddings": false, "eos_token_id": 2}
JSON
	timeout 240 "$bin/resin" bench model --model llama --random-weights "$cfg" --device cuda --cache-bytes 17179869184 \
		--batch-sizes 1,32,256 --prompt-len 512 --gen-len 64 --repeat 1 --max-batch-tokens 8192 --max-seqs 256 || failed=1

	echo; echo "== summary"
	echo "tests: $(grep -c -- '^--- PASS' "$log") passed, $(grep -c -- '^--- FAIL' "$log") failed, $(grep -c -- '^--- SKIP' "$log") skipped"
	grep -- '^--- FAIL' "$log"
	# Nothing skips silently: each skipped test with the reason it logged. On a GPU machine
	# a TestGPU* test may skip only for NCCL (optional); any other means the device, NVRTC
	# or cuBLASLt was not usable, and the check fails.
	if grep -qE -- '^ *--- SKIP' "$log"; then
		echo "-- skipped"
		grep -hE -B1 -- '^ *--- SKIP' "$log" | grep -v -- '^--$' | sed 's/^ */  /'
	fi
	local gpuskips
	gpuskips=$(grep -E -- '^ *--- SKIP: TestGPU' "$log" | grep -v -- 'TestGPUNCCL' || true)
	if [ -n "$gpuskips" ]; then
		echo "GPU tests skipped on a GPU machine:"; echo "$gpuskips"
		failed=1
	fi
	echo "-- parity"; grep -hE '_test.go:[0-9]+: parity' "$log" | sed 's/^.*: parity /  /'
	echo "-- figures"; grep -hE '_test.go:[0-9]+: FIGURE' "$log" | sed 's/^.*FIGURE /  /'
	echo "-- end to end (resin bench model --device cuda)"; grep -hE '^  batch +[0-9]+ +prefill' "$log"
	echo "-- registers (NVRTC + ptxas)"; grep -hE '^ +[a-z_]+\.cu +resin_.* regs ' "$log" | sed 's/^ */  /'
	echo "-- wall time: $((SECONDS - start)) s (the issue asks under 480 on an H100/H200)"
	[ $failed -eq 0 ] && echo "GPU CHECK PASSED" || echo "GPU CHECK FAILED"
	return $failed
}

if [ "${1:-}" = "--build" ]; then
	build
	exit $?
fi
: >"$log"
main 2>&1 | tee -a "$log"
exit "${PIPESTATUS[0]}"
