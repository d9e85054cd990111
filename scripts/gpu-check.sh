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
# same model end to end through the engine (`resin bench model --device cuda`). Then the
# emulated device's run on the same machine, for comparison (core/cudart's RESIN_CUDA=emulate:
# the same bindings and runner, every kernel executed on the CPU; it needs g++ and is
# skipped without): the emulator's kernel tests (core/kernels/cuda TestEmu*), the runner's
# emulated tests (TestEmulated* of core/cudart and core/gpurunner, which run the TestGPU*
# suite on the emulator) and `resin generate --device cuda-emu` on a tiny llama; their
# lines are prefixed "emu|" and summarised apart. The models with device code
# (deepseek-v4-flash, glm-5-flash and their kernels) run their real-GPU tests with
# RESIN_GPU=1 (V4's TestGPUForward, GLM-5's TestParityKDADSA and its GPU runner's
# TestGPUEngineMatchesCPU, each model's kernel TestParity) and, on the emulator, their
# TestEmu* and TestEmulated* tests. It ends with the parity lines and the figures of both.
# The time budget is 480 s on an H100/H200: a lent GPU machine runs one command for at most
# 10 minutes, and the machine's start and the copy back of the log come out of the same
# allowance, so the check must end well inside it; each test binary is limited to 5
# minutes. (The models' emulated tests add a few minutes on 2 CPUs to the emulated part:
# GLM-5's TestEmulated* took 82 s there, V4's are slower; not measured on the GPU machine's
# 16 cores. Their GPU tests use tiny configs.)
#
#   scripts/gpu-check.sh            build with the local Go toolchain, then run
#   scripts/gpu-check.sh --emulated build, then run only the emulated device's part (no GPU
#                                   needed: the CI's view, and a check of this script)
#   scripts/gpu-check.sh --build    only build the binaries into .cache/gpu-bin (for a GPU
#                                   machine without Go: carry .cache/gpu-bin there and run
#                                   scripts/gpu-check.sh, which then uses them)
#   scripts/gpu-check.sh --glm      build (where Go is), then only GLM-5.3-Flash at its real
#                                   dimensions: the first 4 layers (3 KDA, 1 DSA+MoE;
#                                   models/glm-5-flash/testdata/gpu-check/config.json), random
#                                   fp32 weights (~68 GB on the host with the MTP layer, ~38 GB
#                                   on the GPU): the GPU runner against the CPU runner through
#                                   the engine (TestGPUTruncatedMatchesCPU, its parity line),
#                                   the FP8 block-scaled linears of a small FP8 fixture against
#                                   their specification and the CPU path (TestGPUFP8Linears),
#                                   its expert banks against one linear an expert and graph
#                                   replay against eager (TestGPUFP8ExpertBanks),
#                                   a 4-token verify against 4 single decodes on the device
#                                   (BenchmarkGPUVerifyVsDecode, after 196 tokens), then
#                                   prefill and decode tokens/s at batch 1, 16 and 64
#                                   (`resin bench model --device cuda`). Apart from the main
#                                   check: building the random weights takes minutes in each
#                                   of the two; allow about 10 minutes.
#   scripts/gpu-check.sh --v4       build (where Go is), then only DeepSeek-V4-Flash: its kernels
#                                   against their references on GPU 0 (kernels TestParity, the
#                                   whole forward's TestGPUForward), then its first 4 layers at
#                                   real dimensions (window, CSA, HCA, CSA; experts of the real
#                                   size, 32 of them; models/deepseek-v4-flash/testdata/gpu-check/
#                                   config.json), random fp32 weights (~22 GB on the host and as
#                                   much on the GPU, MTP layer included): the GPU runner against
#                                   the CPU runner through the engine, prefix hit and MTP drafts
#                                   included (TestGPUTruncatedMatchesCPU, its parity line), its
#                                   decode steps at batch 1, 16 and 64 against the HBM roofline
#                                   (TestGPUTruncatedFigures, on the same weights), then prefill
#                                   and decode tokens/s at batch 1, 16 and 64 through the engine
#                                   (`resin bench model --device cuda`). Apart from the main check;
#                                   allow about 10 minutes (not yet run on a GPU machine).
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

# modelPkgs are the model packages with device code whose tests the check runs: on the
# GPU only their real-GPU tests (gpuPattern, with RESIN_GPU=1), on the emulated device
# their TestEmu* and TestEmulated* tests.
modelPkgs="models/deepseek-v4-flash models/deepseek-v4-flash/kernels models/glm-5-flash models/glm-5-flash/kernels"

# gpuPattern is the -test.run pattern of a package's GPU run: everything for core's
# packages; for a model, its tests against the CPU reference on GPU 0 (TestGPUForward:
# V4's whole forward; TestGPUEngineMatchesCPU: GLM-5's GPU runner through the engine;
# TestParity: a model's kernels; TestParityKDADSA: GLM-5's KDA and DSA kernels), which
# skip without RESIN_GPU=1 and fail with it when GPU 0 does not open; "-" for a model
# with no real-GPU test.
gpuPattern() {
	case "$1" in
	models/deepseek-v4-flash) echo '^TestGPUForward$' ;;
	models/glm-5-flash) echo '^TestGPUEngineMatchesCPU$' ;;
	models/*/kernels) echo '^TestParity' ;;
	models/*) echo - ;;
	*) echo . ;;
	esac
}

build() {
	echo "== build ($(go version))"
	rm -rf "$bin" && mkdir -p "$bin"
	CGO_ENABLED=0 go build -ldflags='-s -w' -o "$bin/resin" ./cmd/resin || return 1
	# Test binaries of every core package with gpu-tagged tests, plus the GPU packages
	# (core/gpurunner's TestGPU* tests need no tag), plus the models with device code
	# (their GPU tests are asked for with RESIN_GPU=1; see gpuPattern).
	local pkgs
	pkgs=$( (grep -rl --include='*_test.go' '^//go:build gpu' core | xargs -r -n1 dirname; echo core/cudart; echo core/kernels/cuda; echo core/gpurunner; printf '%s\n' $modelPkgs) | sort -u)
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

	toolEnv

	echo; echo "== resin doctor"
	"$bin/resin" doctor

	local failed=0
	while read -r name dir; do
		echo; echo "== go test -tags gpu ./$dir"
		# core/gpurunner's figures (RESIN_GPU_FIGURES) run there, after its checks.
		# stdin is the package list this loop reads: keep the tests off it.
		local pattern
		pattern=$(gpuPattern "$dir")
		if [ "$pattern" = - ]; then echo "(no real-GPU tests: its emulated ones run below)"; continue; fi
		[ "$pattern" = . ] || echo "(RESIN_GPU=1 -test.run $pattern)"
		(cd "$dir" && RESIN_GPU=1 RESIN_GPU_FIGURES=1 timeout 300 "$bin/$name.test" -test.run "$pattern" -test.v -test.count=1 -test.timeout=290s </dev/null) || failed=1
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

	tpOneGPU "$cfg"

	emulated

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
	echo "-- parity"; grep -v '^emu| ' "$log" | grep -hE '_test.go:[0-9]+: parity' | sed 's/^.*: parity /  /'
	echo "-- figures"; grep -v '^emu| ' "$log" | grep -hE '_test.go:[0-9]+: FIGURE' | sed 's/^.*FIGURE /  /'
	echo "-- end to end (resin bench model --device cuda)"; grep -hE '^  batch +[0-9]+ +prefill' "$log"
	echo "-- registers (NVRTC + ptxas)"; grep -hE '^ +[a-z_]+\.cu +resin_.* regs ' "$log" | sed 's/^ */  /'
	echo "-- emulated device (RESIN_CUDA=emulate, kernels on the CPU; not GPU figures)"
	if grep -q '^emu| ' "$log"; then
		echo "  tests: $(grep -c -- '^emu| --- PASS' "$log") passed, $(grep -c -- '^emu| --- FAIL' "$log") failed, $(grep -c -- '^emu| --- SKIP' "$log") skipped"
		grep -- '^emu| --- FAIL' "$log" | sed 's/^emu| /  /'
		grep -hE '^emu\| .*_test.go:[0-9]+: parity' "$log" | sed 's/^.*: parity /  parity /'
		grep -hE '^emu\| (finish|emulated|  batch)' "$log" | sed 's/^emu| /  /'
	else
		echo "  not run"
	fi
	echo "-- wall time: $((SECONDS - start)) s (budget 480 s on an H100/H200: one device command may run 10 minutes, the machine's start and the log's copy included)"
	[ $failed -eq 0 ] && echo "GPU CHECK PASSED" || echo "GPU CHECK FAILED"
	return $failed
}

# toolEnv finds NVRTC and ptxas and sets the kernel cache.
toolEnv() {
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
		local p
		p=$(command -v ptxas || ls /usr/local/cuda/bin/ptxas 2>/dev/null || true)
		[ -n "$p" ] && export RESIN_PTXAS=$p
	fi
	export RESIN_KERNEL_CACHE=${RESIN_KERNEL_CACHE:-$root/.cache/gpu-kernel-cache}
	echo "RESIN_NVRTC_LIB=${RESIN_NVRTC_LIB:-} RESIN_PTXAS=${RESIN_PTXAS:-}"
}

# glmOnly is --glm: GLM-5.3-Flash's first 4 layers at real dimensions on GPU 0 (see the
# header), parity then figures, with its summary.
glmOnly() {
	local start=$SECONDS failed=0
	local cfg=$root/models/glm-5-flash/testdata/gpu-check/config.json
	echo "== machine"
	date -u
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || echo "nvidia-smi not available"
	driver || return 1
	if command -v go >/dev/null; then
		build || { echo "BUILD FAILED"; return 1; }
	elif [ ! -x "$bin/resin" ]; then
		echo "no Go toolchain and no prebuilt $bin (run scripts/gpu-check.sh --build where Go is)"; return 1
	fi
	toolEnv
	echo; echo "== glm-5-flash, 4 layers at real dimensions: the GPU runner against the CPU runner (TestGPUTruncatedMatchesCPU), the FP8 block-scaled linears against their specification and the CPU path (TestGPUFP8Linears, the path the device picks), the FP8 expert banks against one linear an expert and graphs against eager (TestGPUFP8ExpertBanks), a 4-token verify against 4 decodes (BenchmarkGPUVerifyVsDecode)"
	(cd models/glm-5-flash && RESIN_GPU=1 RESIN_GLM_CONFIG=$cfg timeout 400 "$bin/models_glm-5-flash.test" \
		-test.run '^(TestGPUTruncatedMatchesCPU|TestGPUFP8Linears|TestGPUFP8ExpertBanks)$' -test.bench '^BenchmarkGPUVerifyVsDecode$' -test.benchtime 20x \
		-test.v -test.count=1 -test.timeout=390s </dev/null) || failed=1
	echo; echo "== resin bench model --model glm-5-flash --device cuda (4 layers at real dimensions, random weights)"
	timeout 400 "$bin/resin" bench model --model glm-5-flash --random-weights "$cfg" --device cuda --cache-bytes 8589934592 \
		--batch-sizes 1,16,64 --prompt-len 128 --gen-len 16 --repeat 1 --max-batch-tokens 1024 --max-seqs 64 || failed=1
	echo; echo "== summary (glm-5-flash at real dimensions)"
	echo "-- parity"; grep -hE '_test.go:[0-9]+: parity' "$log" | sed 's/^.*: parity /  /'
	echo "-- verify vs decode (BenchmarkGPUVerifyVsDecode)"; grep -hE '^BenchmarkGPUVerifyVsDecode' "$log" | sed 's/^/  /'
	echo "-- figures (resin bench model --device cuda)"; grep -hE '^  batch +[0-9]+ +prefill' "$log"
	echo "-- wall time: $((SECONDS - start)) s"
	[ $failed -eq 0 ] && echo "GLM GPU CHECK PASSED" || echo "GLM GPU CHECK FAILED"
	return $failed
}

# v4Only is --v4: DeepSeek-V4-Flash's kernel parity and its first 4 layers at real
# dimensions on GPU 0 (see the header), parity then figures, with its summary.
v4Only() {
	local start=$SECONDS failed=0
	local cfg=$root/models/deepseek-v4-flash/testdata/gpu-check/config.json
	echo "== machine"
	date -u
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || echo "nvidia-smi not available"
	driver || return 1
	if command -v go >/dev/null; then
		build || { echo "BUILD FAILED"; return 1; }
	elif [ ! -x "$bin/resin" ]; then
		echo "no Go toolchain and no prebuilt $bin (run scripts/gpu-check.sh --build where Go is)"; return 1
	fi
	toolEnv
	echo; echo "== deepseek-v4-flash kernels against their references (TestParity) and the tiny forward (TestGPUForward)"
	(cd models/deepseek-v4-flash/kernels && RESIN_GPU=1 timeout 300 "$bin/models_deepseek-v4-flash_kernels.test" \
		-test.run '^TestParity' -test.v -test.count=1 -test.timeout=290s </dev/null) || failed=1
	(cd models/deepseek-v4-flash && RESIN_GPU=1 timeout 300 "$bin/models_deepseek-v4-flash.test" \
		-test.run '^TestGPUForward$' -test.v -test.count=1 -test.timeout=290s </dev/null) || failed=1
	echo; echo "== deepseek-v4-flash, 4 layers at real dimensions: the GPU runner against the CPU runner (TestGPUTruncatedMatchesCPU), then its figures against the HBM roofline (TestGPUTruncatedFigures)"
	(cd models/deepseek-v4-flash && RESIN_GPU=1 RESIN_GPU_FIGURES=1 RESIN_V4_CONFIG=$cfg timeout 400 "$bin/models_deepseek-v4-flash.test" \
		-test.run '^(TestGPUTruncatedMatchesCPU|TestGPUTruncatedFigures)$' -test.v -test.count=1 -test.timeout=390s </dev/null) || failed=1
	echo; echo "== resin bench model --model deepseek-v4-flash --device cuda (4 layers at real dimensions, random weights)"
	timeout 400 "$bin/resin" bench model --model deepseek-v4-flash --random-weights "$cfg" --device cuda --cache-bytes 8589934592 \
		--batch-sizes 1,16,64 --prompt-len 128 --gen-len 16 --repeat 1 --max-batch-tokens 1024 --max-seqs 64 || failed=1
	echo; echo "== summary (deepseek-v4-flash)"
	echo "tests: $(grep -c -- '^--- PASS' "$log") passed, $(grep -c -- '^--- FAIL' "$log") failed, $(grep -c -- '^--- SKIP' "$log") skipped"
	grep -- '^--- FAIL' "$log"
	echo "-- parity"; grep -hE '_test.go:[0-9]+: parity' "$log" | sed 's/^.*: parity /  /'
	echo "-- figures (TestGPUTruncatedFigures: decode steps against the HBM roofline)"; grep -hE 'FIGURE deepseek-v4-flash' "$log" | sed 's/^.*FIGURE /  /'
	echo "-- figures (resin bench model --device cuda)"; grep -hE '^  batch +[0-9]+ +prefill' "$log"
	echo "-- wall time: $((SECONDS - start)) s"
	[ $failed -eq 0 ] && echo "V4 GPU CHECK PASSED" || echo "V4 GPU CHECK FAILED"
	return $failed
}

# tpOneGPU runs core/gpurunner's tensor parallelism with two ranks on GPU 0:
# TestGPUNCCLTPEqualsOne (gpurunner.NewDenseTP: an NCCL float32 all-reduce per o and down
# projection, the vocab-parallel embedding's bf16 all-reduce and LM head's all-gather over
# the tiny llama's 261 tokens, padded to 320 and split unevenly, decode steps replaying CUDA
# graphs with the collectives captured; TP=2's greedy tokens equal TP=1's over 32 steps,
# logits within 2e-2, two TP=2 runs bit-identical) and TestGPUNCCLTPGraphsEqualEager (TP=2
# with graphs equals TP=2 eager bit for bit: tokens and logprobs sampled on the device, and
# every logits row brought back as --logits-out does; each rank replayed graphs). Two ranks
# of one communicator on one GPU need NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 (PyPI's
# nvidia-nccl-cu12 / -cu13 ship it); the tests skip, and this section fails, where the NCCL
# found is older. Written without a GPU to run it on: the same tests passed on two emulated
# GPUs (TestEmulatedTPEqualsOne, TestEmulatedTPGraphsEqualEager), not here. With them,
# prefill context parallelism over the same two ranks: TestGPUNCCLCPEqualsOne
# (gpurunner.NewDenseCP: each layer's q/k/v rows all-gathered into every rank's cache, a
# prompt split 5+4 in one plan and in plans of 4; one GPU's greedy tokens, logits within
# 2e-2; seeded sampling on the device gives one GPU's tokens), which passed on the
# emulated device (TestEmulatedCPEqualsOne) and has not run here, and TestGPUNCCLCPTPEqualsOne
# (gpurunner.NewDenseCPTP: CP=2 over two TP=2 groups, four ranks on GPU 0; one GPU's greedy
# tokens, logits within 2e-2), which passed on the emulated device (TestEmulatedCPTPEqualsOne)
# and has not run here. And TestGPUNCCLWatchdog:
# rank 0's all-reduce waits on the stream for rank 1, which never calls it; the watchdog
# (gpurunner.Watchdog) aborts the communicator after 1 s (ncclCommAbort from another
# goroutine) and the wait returns; then an abort that a supervisor's worker exit calls. It
# passed on the emulated device (TestWatchdog, RESIN_EMU_NCCL_HANG=1), not here. Then the
# llama bench at --tp 2 (its config is $1).
tpOneGPU() {
	echo; echo "== tensor and context parallelism: 2 ranks on GPU 0, NCCL_MULTI_RANK_GPU_ENABLE=1 (TestGPUNCCLTPEqualsOne, TestGPUNCCLTPGraphsEqualEager, TestGPUNCCLCPEqualsOne, TestGPUNCCLCPTPEqualsOne, TestGPUNCCLWatchdog)"
	local out
	out=$(cd core/gpurunner && NCCL_MULTI_RANK_GPU_ENABLE=1 timeout 200 "$bin/core_gpurunner.test" \
		-test.run '^(TestGPUNCCLTPEqualsOne|TestGPUNCCLTPGraphsEqualEager|TestGPUNCCLCPEqualsOne|TestGPUNCCLCPTPEqualsOne|TestGPUNCCLWatchdog)$' -test.v -test.count=1 -test.timeout=190s </dev/null 2>&1)
	local rc=$?
	echo "$out"
	if [ $rc -ne 0 ]; then
		failed=1
	else
		local name
		for name in TestGPUNCCLTPEqualsOne TestGPUNCCLTPGraphsEqualEager TestGPUNCCLCPEqualsOne TestGPUNCCLCPTPEqualsOne TestGPUNCCLWatchdog; do
			if ! grep -q -- "^--- PASS: $name" <<<"$out"; then
				echo "$name did not run (it needs NCCL >= 2.30: the skip above says which was found)"
				failed=1
			fi
		done
	fi
	# glm-5-flash's GPU layouts, EP=2, TP=2 and TP=2 x EP=2 on GPU 0 (TestGPUNCCLLayoutEqualsOne:
	# the tiny config with ungrouped routing, greedy tokens equal one GPU's, logits within
	# gpuNCCLTol, a decode step replayed a graph with the all-reduces inside). Written without
	# a GPU: the same layouts passed on the emulated NCCL (TestEmulatedEPEqualsOne,
	# TestEmulatedTPEqualsOne), not here.
	echo; echo "== glm-5-flash GPU layouts: EP=2, TP=2, TP=2 x EP=2 on GPU 0 (TestGPUNCCLLayoutEqualsOne)"
	out=$(cd models/glm-5-flash && RESIN_GPU=1 NCCL_MULTI_RANK_GPU_ENABLE=1 timeout 200 "$bin/models_glm-5-flash.test" \
		-test.run '^TestGPUNCCLLayoutEqualsOne$' -test.v -test.count=1 -test.timeout=190s </dev/null 2>&1)
	rc=$?
	echo "$out"
	if [ $rc -ne 0 ] || ! grep -q -- '^--- PASS: TestGPUNCCLLayoutEqualsOne' <<<"$out"; then
		echo "TestGPUNCCLLayoutEqualsOne failed or did not run (it needs NCCL >= 2.30: the skip above says which was found)"
		failed=1
	fi
	# deepseek-v4-flash's GPU layout EP=2 with rank 1 a worker process (--tp-procs: the NCCL id
	# over the shared-memory control communicator, gpurunner.JoinGroup), both ranks on GPU 0,
	# against the in-process EP=2: the same tokens. Written without a GPU: on the emulated
	# device the two are bit-identical (TestGenerateLayoutProcsOnTheEmulatedDevice), not here.
	echo; echo "== deepseek-v4-flash GPU layout EP=2: worker processes against in-process ranks, GPU 0"
	local inproc procs
	inproc=$(NCCL_MULTI_RANK_GPU_ENABLE=1 timeout 200 "$bin/resin" generate --model deepseek-v4-flash --random-weights models/deepseek-v4-flash/config.json \
		--device cuda --ep 2 --prompt-ids 1,2,3,4,5 --max-tokens 8 --ignore-eos 2>&1 | grep '^tokens:')
	procs=$(NCCL_MULTI_RANK_GPU_ENABLE=1 timeout 200 "$bin/resin" generate --model deepseek-v4-flash --random-weights models/deepseek-v4-flash/config.json \
		--device cuda --ep 2 --tp-procs --prompt-ids 1,2,3,4,5 --max-tokens 8 --ignore-eos 2>&1 | grep '^tokens:')
	echo "in-process: $inproc"; echo "--tp-procs: $procs"
	if [ -z "$inproc" ] || [ "$inproc" != "$procs" ]; then
		echo "the worker-process layout did not print the in-process tokens"
		failed=1
	fi
	# DP-attention 2 x EP 2 on GPU 0 for both MoE models (a GPU per dp rank where there are
	# two, here both on GPU 0: the rows exchanged by NCCL all-gather and reduce-scatter,
	# rank 1 idling through the MoE collectives) against one GPU: the same greedy tokens,
	# with the decode steps as CUDA graphs on both ranks (the default: rank 1 replaying the
	# graph of padding rows; the log says "decode graphs") and with --cuda-eager. Written
	# without a GPU: on the emulated device they equal the CPU's
	# (TestGenerateDPAttentionOnTheEmulatedDevice), not here.
	local model one dpt eager
	for model in deepseek-v4-flash glm-5-flash; do
		echo; echo "== $model --dp 2 --dp-attention on GPU 0 against one GPU (decode graphs, and --cuda-eager)"
		one=$(timeout 200 "$bin/resin" generate --model $model --random-weights models/$model/config.json \
			--device cuda --prompt-ids 1,2,3,4,5 --max-tokens 8 --ignore-eos 2>&1 | grep '^tokens:')
		dpt=$(NCCL_MULTI_RANK_GPU_ENABLE=1 timeout 200 "$bin/resin" generate --model $model --random-weights models/$model/config.json \
			--device cuda --dp 2 --dp-attention --prompt-ids 1,2,3,4,5 --max-tokens 8 --ignore-eos 2>&1 | grep -E '^tokens:|decode graphs')
		eager=$(NCCL_MULTI_RANK_GPU_ENABLE=1 timeout 200 "$bin/resin" generate --model $model --random-weights models/$model/config.json \
			--device cuda --dp 2 --dp-attention --cuda-eager --prompt-ids 1,2,3,4,5 --max-tokens 8 --ignore-eos 2>&1 | grep '^tokens:')
		echo "one GPU: $one"; echo "--dp 2 --dp-attention: $dpt"; echo "--dp 2 --dp-attention --cuda-eager: $eager"
		if [ -z "$one" ] || [ "$one" != "$(grep '^tokens:' <<<"$dpt")" ] || [ "$one" != "$eager" ] || ! grep -q 'decode graphs' <<<"$dpt"; then
			echo "$model: DP-attention (graphs or eager) did not print one GPU's tokens, or ran no decode graphs"
			failed=1
		fi
	done
	# The MoE models' prefill CP over 2 ranks on GPU 0 against --cp 1 (a 20-token prompt
	# split 10 + 10: V4's KV side, GLM's latents, indexer keys and KDA inputs all-gathered
	# per layer), and CP over the ep ranks (--cp 2 --ep 2) against --ep 2: the same tokens.
	# Written without a GPU: byte-equal --logits-out on the emulated device
	# (TestGenerateMoECPOnTheEmulatedDevice, TestGenerateCPOverEPOnTheEmulatedDevice).
	for model in deepseek-v4-flash glm-5-flash; do
		echo; echo "== $model --cp 2 on GPU 0 against --cp 1, --cp 2 --ep 2 against --ep 2"
		cpargs=(--model $model --random-weights models/$model/config.json --device cuda
			--prompt-ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20 --max-tokens 8 --ignore-eos)
		one=$(timeout 200 "$bin/resin" generate "${cpargs[@]}" 2>&1 | grep '^tokens:')
		cp2=$(NCCL_MULTI_RANK_GPU_ENABLE=1 timeout 200 "$bin/resin" generate "${cpargs[@]}" --cp 2 2>&1 | grep '^tokens:')
		ep2=$(NCCL_MULTI_RANK_GPU_ENABLE=1 timeout 200 "$bin/resin" generate "${cpargs[@]}" --ep 2 2>&1 | grep '^tokens:')
		cpep=$(NCCL_MULTI_RANK_GPU_ENABLE=1 timeout 200 "$bin/resin" generate "${cpargs[@]}" --cp 2 --ep 2 2>&1 | grep '^tokens:')
		echo "--cp 1: $one"; echo "--cp 2: $cp2"; echo "--ep 2: $ep2"; echo "--cp 2 --ep 2: $cpep"
		if [ -z "$one" ] || [ "$one" != "$cp2" ] || [ -z "$ep2" ] || [ "$ep2" != "$cpep" ]; then
			echo "$model: --cp 2 did not print --cp 1's tokens, or --cp 2 --ep 2 --ep 2's"
			failed=1
		fi
	done
	# The ~1.1B llama of the section above ($1) at --tp 2, both ranks on GPU 0: the figures
	# against --tp 1's show what the collectives cost (two ranks sharing one GPU are not
	# faster); decode replays graphs with the collectives inside.
	echo; echo "== resin bench model --model llama --device cuda --tp 2 (~1.1B random weights, 2 ranks on GPU 0)"
	NCCL_MULTI_RANK_GPU_ENABLE=1 timeout 300 "$bin/resin" bench model --model llama --random-weights "$1" --device cuda --tp 2 \
		--cache-bytes 8589934592 --batch-sizes 1,32,256 --prompt-len 512 --gen-len 64 --repeat 1 --max-batch-tokens 8192 --max-seqs 256 || failed=1
}

# emulated runs the emulated device's tests and a generate on it, from the same binaries,
# each output line prefixed "emu| " so that the GPU's summary counts only the GPU's lines.
# A failure there fails the check too: the emulated run is the CI's view of the same code.
emulated() {
	echo; echo "== the emulated device (RESIN_CUDA=emulate): the same code, every kernel on the CPU"
	if ! command -v "${RESIN_CXX:-g++}" >/dev/null; then
		echo "emu| skipped: no host C++ compiler (${RESIN_CXX:-g++}) for the emulated device here"
		return 0
	fi
	local name dir pattern
	while read -r name dir; do
		case "$dir" in
		core/kernels/cuda) pattern='^TestEmu' ;;
		core/cudart | core/gpurunner) pattern='^TestEmulated' ;;
		models/*) pattern='^TestEmu' ;; # TestEmu* (kernels) and TestEmulated* (layers, runner)
		*) continue ;;
		esac
		echo "emu| == $dir -test.run $pattern"
		(cd "$dir" && timeout 300 "$bin/$name.test" -test.run "$pattern" -test.v -test.count=1 -test.timeout=290s </dev/null 2>&1) | sed 's/^/emu| /'
		[ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
	done <"$bin/packages.txt"
	echo "emu| == resin generate --device cuda-emu (tiny llama, random weights)"
	local t0=$SECONDS
	"$bin/resin" generate --model llama --random-weights cmd/resin/testdata/tiny-llama/config.json --prompt-ids 1,2,3 \
		--device cuda-emu --cache-bytes 16777216 2>&1 | sed 's/^/emu| /'
	[ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
	echo "emu| emulated generate: $((SECONDS - t0)) s on $(nproc) CPUs, kernel compilation included when the cache is fresh"
	echo "emu| == resin bench model --device cuda-emu (tiny llama)"
	"$bin/resin" bench model --model llama --random-weights cmd/resin/testdata/tiny-llama/config.json --device cuda-emu \
		--cache-bytes 16777216 --batch-sizes 1,4 --prompt-len 16 --gen-len 8 --repeat 1 2>&1 | sed 's/^/emu| /'
	[ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
}

# emulatedOnly is --emulated: the build and the emulated device's part with its summary.
emulatedOnly() {
	local start=$SECONDS failed=0
	build || { echo "BUILD FAILED"; return 1; }
	if [ -f .cache/test.env ]; then set -a; . .cache/test.env; set +a; fi
	export RESIN_KERNEL_CACHE=${RESIN_KERNEL_CACHE:-$root/.cache/gpu-kernel-cache}
	emulated
	echo; echo "== summary (emulated device only)"
	echo "  tests: $(grep -c -- '^emu| --- PASS' "$log") passed, $(grep -c -- '^emu| --- FAIL' "$log") failed, $(grep -c -- '^emu| --- SKIP' "$log") skipped"
	grep -- '^emu| --- FAIL' "$log" | sed 's/^emu| /  /'
	echo "-- wall time: $((SECONDS - start)) s on $(nproc) CPUs"
	[ $failed -eq 0 ] && echo "EMULATED CHECK PASSED" || echo "EMULATED CHECK FAILED"
	return $failed
}

if [ "${1:-}" = "--build" ]; then
	build
	exit $?
fi
: >"$log"
if [ "${1:-}" = "--glm" ]; then
	glmOnly 2>&1 | tee -a "$log"
	exit "${PIPESTATUS[0]}"
fi
if [ "${1:-}" = "--v4" ]; then
	v4Only 2>&1 | tee -a "$log"
	exit "${PIPESTATUS[0]}"
fi
if [ "${1:-}" = "--emulated" ]; then
	emulatedOnly 2>&1 | tee -a "$log"
	exit "${PIPESTATUS[0]}"
fi
main 2>&1 | tee -a "$log"
exit "${PIPESTATUS[0]}"
