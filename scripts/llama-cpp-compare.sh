#!/usr/bin/env bash
# scripts/llama-cpp-compare.sh: models/llama on the CPU side by side with llama.cpp as its
# users run it, on the same random-weight checkpoint, same thread count, each of Resin's
# --dtype against the GGUF type it matches: fp32 vs F32, bf16 vs BF16, int8 vs Q8_0.
# Prints prefill and decode tokens/s at each batch size, per round and as medians, the
# ratios resin/llama.cpp, and the decode bound of batch 1: the machine's memory bandwidth
# (measured here) over the bytes of weights a token reads.
#
#   llama.cpp: built from PyPI's llama-cpp-python sdist (its vendored llama.cpp; cmake,
#          the llama-bench and llama-batched-bench targets, GGML_NATIVE) into .cache/llama-cpp
#          once. The checkpoint (transformers' LlamaForCausalLM, random weights, float32
#          safetensors, a synthetic Llama BPE tokenizer) is converted by the vendored
#          convert_hf_to_gguf.py with its gguf-py to F32, BF16 and Q8_0.
#          Batch 1: llama-bench, prefill `-p PROMPT -n 0`, decode `-p 0 -n GEN -d PROMPT`
#          (generating after a context of the prompt's length, as resin's decode does).
#          Batch B > 1: llama-batched-bench -npp PROMPT -ntg GEN -npl B (prompts not shared).
#   resin: `llama bench --dtype D --batch-sizes` on the same safetensors (bf16 and int8
#          converted at load), GOMAXPROCS=THREADS, the BLAS core/blas finds (RESIN_BLAS=own
#          for Resin's own GEMM, which is the default when no library is installed).
#   The sides alternate, ROUNDS times, one dtype at a time (resin, llama.cpp, ...), so both
#   see the same machine: on a shared box the speed drifts by 10-30% over minutes. Both
#   keep activations in fp32; llama.cpp's KV cache is f16 (its default), Resin's fp32.
#
# Environment: THREADS (default: nproc), BATCHES (1,8), PROMPT_LEN (512), GEN_LEN (32),
# REPEAT (3 runs per measurement, llama-bench -r / resin --repeat), ROUNDS (3), DTYPES
# (fp32,bf16,int8; bf16dot is resin's bf16 with RESIN_BF16_DOT=on, prefill on AVX-512 BF16
# dot products, against BF16 again), CONFIG (an HF config.json; default the ~120M llama of
# llama-cpu-bench.sh), LLAMA_CPP_PYTHON (the sdist version, 0.3.36), LLAMA_CMAKE_FLAGS
# (extra cmake flags, e.g. -DGGML_AMX_INT8=OFF where the AMX kernels die), LLAMA_CPP_BUILD
# (a llama.cpp build directory to use instead of .cache/llama-cpp/build: on the 2-core
# Xeon VM of the README's table the native build's AMX Q8_0 kernels segfault, so it names
# a -DGGML_NATIVE=OFF build with the AVX-512, VNNI and BF16 flags), LLAMA_ARGS
# (extra flags for llama-bench and llama-batched-bench, e.g. `--poll 0`: on a loaded
# machine llama.cpp's threads spin at each barrier by default and its decode collapses), VENV
# (.cache/torch-venv: torch, transformers), OUT (.cache/llama-cpp-compare).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
root=$(pwd)
threads=${THREADS:-$(nproc)}
batches=${BATCHES:-1,8}
prompt=${PROMPT_LEN:-512}
gen=${GEN_LEN:-32}
repeat=${REPEAT:-3}
rounds=${ROUNDS:-3}
dtypes=${DTYPES:-fp32,bf16,int8}
version=${LLAMA_CPP_PYTHON:-0.3.36}
venv=${VENV:-$root/.cache/torch-venv}
out=${OUT:-$root/.cache/llama-cpp-compare}
lc=$root/.cache/llama-cpp
mkdir -p "$out" "$lc"
py=$venv/bin/python

if ! "$py" -c 'import torch, transformers, numpy, yaml, tqdm, sentencepiece' 2>/dev/null; then
	echo "== installing CPU torch, transformers and gguf-py's needs into $venv"
	[ -x "$py" ] || python3 -m venv "$venv"
	# CPU torch from its own index where it is reachable, else PyPI's (CUDA) build.
	"$venv/bin/pip" install -q --index-url https://download.pytorch.org/whl/cpu torch || "$venv/bin/pip" install -q torch
	"$venv/bin/pip" install -q transformers numpy pyyaml tqdm sentencepiece # convert_hf_to_gguf.py imports sentencepiece before looking for tokenizer.model
fi

# llama.cpp from the llama-cpp-python sdist.
src=$lc/llama_cpp_python-$version/vendor/llama.cpp
build=${LLAMA_CPP_BUILD:-$lc/build}
bin=$build/bin
if [ ! -x "$bin/llama-bench" ] || [ ! -x "$bin/llama-batched-bench" ]; then
	if [ ! -f "$src/CMakeLists.txt" ]; then
		echo "== downloading llama-cpp-python $version (sdist) into $lc"
		"$venv/bin/pip" download -q --no-binary :all: --no-deps -d "$lc" "llama-cpp-python==$version"
		tar xzf "$lc/llama_cpp_python-$version.tar.gz" -C "$lc"
	fi
	echo "== building llama.cpp (llama-bench, llama-batched-bench) into $build"
	gen_flag=()
	if command -v ninja >/dev/null; then gen_flag=(-G Ninja); fi
	# shellcheck disable=SC2086 # LLAMA_CMAKE_FLAGS is a list of flags
	cmake -S "$src" -B "$build" "${gen_flag[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
		-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
		${LLAMA_CMAKE_FLAGS:-} > "$lc/cmake.log"
	cmake --build "$build" -j "$(nproc)" --target llama-bench llama-batched-bench > "$lc/build.log"
fi

# The checkpoint: config.json, random float32 weights, a tokenizer convert_hf_to_gguf.py
# takes (the benchmarks feed token ids; its vocabulary is synthetic).
ck=$out/checkpoint
mkdir -p "$ck"
# The llama bench config (scripts/llama-bench-config.json) unless CONFIG names another.
cp "${CONFIG:-$root/scripts/llama-bench-config.json}" "$out/config.json"
if [ ! -f "$ck/model.safetensors" ] || ! cmp -s "$out/config.json" "$ck/config.src.json"; then
	echo "== writing random weights and a tokenizer into $ck"
	rm -f "$out"/*.gguf "$ck/config.src.json"
	cp "$out/config.json" "$ck/config.json"
	"$py" - "$ck" <<'EOF'
import json, sys, torch
from tokenizers import Tokenizer, decoders, models, normalizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
d = sys.argv[1]
cfg = json.load(open(f"{d}/config.json"))
torch.manual_seed(0)
LlamaForCausalLM(LlamaConfig(**cfg)).to(torch.float32).save_pretrained(d, safe_serialization=True)
n = cfg["vocab_size"]
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for b in range(256):
    vocab[f"<0x{b:02X}>"] = len(vocab)
vocab["\u2581"] = len(vocab)
i = 0
while len(vocab) < n:
    vocab[f"\u2581t{i}"] = len(vocab)
    i += 1
tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(d)
EOF
	cp "$out/config.json" "$ck/config.src.json" # the checkpoint is of this config
fi
# Resin reads the same config and weights, without the synthetic tokenizer (its byte
# fallback is not one Resin's tokenizer loads; the benchmark feeds token ids).
mkdir -p "$out/resin"
ln -sf "$ck/config.json" "$ck/model.safetensors" "$out/resin/"
declare -A gguf_type=([fp32]=f32 [bf16]=bf16 [bf16dot]=bf16 [int8]=q8_0)
declare -A gguf_name=([fp32]=F32 [bf16]=BF16 [bf16dot]=BF16 [int8]=Q8_0)
for dt in ${dtypes//,/ }; do
	f=$out/model-${gguf_name[$dt]}.gguf
	if [ ! -f "$f" ]; then
		echo "== converting to GGUF ${gguf_name[$dt]}"
		PYTHONPATH=$src/gguf-py "$py" "$src/convert_hf_to_gguf.py" "$ck" --outtype "${gguf_type[$dt]}" --outfile "$f" > "$out/convert-$dt.log" 2>&1 ||
			{ tail -n 20 "$out/convert-$dt.log"; exit 1; }
	fi
done

# Memory bandwidth: THREADS threads summing a 1 GiB buffer, the best of 5 passes.
cat > "$out/bw.c" <<'EOF'
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(void) {
	size_t n = (size_t)1 << 27; /* 1 GiB of uint64 */
	uint64_t *a = malloc(n * sizeof *a), sink = 0;
	double bestgb = 0;
	#pragma omp parallel for
	for (size_t i = 0; i < n; i++) a[i] = i;
	for (int pass = 0; pass < 5; pass++) {
		struct timespec t0, t1;
		uint64_t s = 0;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		#pragma omp parallel for reduction(+:s)
		for (size_t i = 0; i < n; i++) s += a[i];
		clock_gettime(CLOCK_MONOTONIC, &t1);
		double gb = n * sizeof *a / ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9) / 1e9;
		if (gb > bestgb) bestgb = gb;
		sink += s;
	}
	printf("%.2f %llu\n", bestgb, (unsigned long long)(sink & 1)); /* the sum, so the loop stays */
	return 0;
}
EOF
gcc -O3 -march=native -fopenmp -o "$out/bw" "$out/bw.c"
bw=$(OMP_NUM_THREADS=$threads "$out/bw" | cut -d' ' -f1)

cache_bytes=$("$py" - "$ck/config.json" "$batches" "$prompt" "$gen" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
per_token = c["num_hidden_layers"] * 2 * c.get("num_key_value_heads", c["num_attention_heads"]) * hd * 4
b = max(int(x) for x in sys.argv[2].split(","))
ctx = min(c.get("max_position_embeddings", 4096), 4096)
print(per_token * (b * (int(sys.argv[3]) + int(sys.argv[4]) + 64) + ctx))
EOF
)
maxb=$(tr ',' '\n' <<< "$batches" | sort -n | tail -n1)

echo "== machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load $(cut -d' ' -f1-3 /proc/loadavg), threads $threads, memory read $bw GB/s ($threads threads), $(go version | cut -d' ' -f3)"
echo "== config: $(tr -d ' \n' < "$ck/config.json" | head -c 400)"
echo "== llama.cpp: llama-cpp-python $version's vendored llama.cpp ($(cd "$src" && git describe --always 2>/dev/null || sed -n 's/.*ggml commit: *//p' "$lc/cmake.log" 2>/dev/null | head -n1)), $bin"
go build -o "$out/llama" ./models/llama/cmd/llama
res=$out/results.tsv
: > "$res" # round dtype batch side prefill decode

resin_run() { # dtype round
	local dt=$1 dot=
	if [ "$dt" = bf16dot ]; then dt=bf16 dot=on; fi
	RESIN_BF16_DOT=$dot GOMAXPROCS=$threads "$out/llama" bench --model "$out/resin" --dtype "$dt" --cache-bytes "$cache_bytes" \
		--max-batch-tokens $((prompt * maxb + 64)) --batch-sizes "$batches" --prompt-len "$prompt" --gen-len "$gen" --repeat "$repeat" 2>&1 |
		tee "$out/resin-$1-$2.log" | awk -v r="$2" -v dt="$1" '/^note: CPU weights/ { sub(/^note: CPU weights /, ""); print "  resin " $0 > "/dev/stderr" }
			/batch [0-9]+ +prefill/ { printf "%s\t%s\t%s\tresin\t%s\t%s\n", r, dt, $2, $4, $7 }'
}

llamacpp_run() { # dtype round
	local f=$out/model-${gguf_name[$1]}.gguf b
	for b in ${batches//,/ }; do
		if [ "$b" = 1 ]; then
			local p d
			p=$("$bin/llama-bench" -m "$f" -t "$threads" ${LLAMA_ARGS:-} -p "$prompt" -n 0 -r "$repeat" -o jsonl 2>>"$out/llama.cpp-$1-$2.log" |
				"$py" -c 'import json,sys; print([json.loads(l)["avg_ts"] for l in sys.stdin if l.startswith("{")][-1])')
			d=$("$bin/llama-bench" -m "$f" -t "$threads" ${LLAMA_ARGS:-} -p 0 -n "$gen" -d "$prompt" -r "$repeat" -o jsonl 2>>"$out/llama.cpp-$1-$2.log" |
				"$py" -c 'import json,sys; print([json.loads(l)["avg_ts"] for l in sys.stdin if l.startswith("{")][-1])')
			printf "%s\t%s\t%s\tllama.cpp\t%s\t%s\n" "$2" "$1" "$b" "$p" "$d"
		else
			"$bin/llama-batched-bench" -m "$f" -t "$threads" ${LLAMA_ARGS:-} -c $((b * (prompt + gen) + 64)) -b 2048 -ub 512 \
				-npp "$prompt" -ntg "$gen" -npl "$b" --output-format jsonl 2>>"$out/llama.cpp-$1-$2.log" |
				"$py" -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
r = rows[-1]
print("%s\t%s\t%d\tllama.cpp\t%.1f\t%.1f" % (sys.argv[1], sys.argv[2], r["pl"], r["speed_pp"], r["speed_tg"]))' "$2" "$1"
		fi
	done
}

for round in $(seq 1 "$rounds"); do
	echo "== round $round of $rounds (load $(cut -d' ' -f1 /proc/loadavg))"
	for dt in ${dtypes//,/ }; do
		resin_run "$dt" "$round" | tee -a "$res" > /dev/null
		llamacpp_run "$dt" "$round" | tee -a "$res" > /dev/null
		awk -F'\t' -v r="$round" -v dt="$dt" -v g="${gguf_name[$dt]}" '
			function ratio(a, b) { return b > 0 ? sprintf("%.2fx", a / b) : "n/a" }
			$1 == r && $2 == dt { v[$4, $3, "p"] = $5; v[$4, $3, "d"] = $6; bs[$3] = 1 }
			END { for (b in bs) printf "  %-4s vs %-4s batch %s  prefill resin %7.1f llama.cpp %7.1f  %s   decode resin %6.1f llama.cpp %6.1f  %s\n",
				dt, g, b, v["resin", b, "p"], v["llama.cpp", b, "p"], ratio(v["resin", b, "p"], v["llama.cpp", b, "p"]),
				v["resin", b, "d"], v["llama.cpp", b, "d"], ratio(v["resin", b, "d"], v["llama.cpp", b, "d"]) }' "$res" | sort -k5n
	done
done

echo "== summary: median over $rounds rounds (tokens/s; ratio: the median of the rounds' resin/llama.cpp); decode bound at batch 1 = $bw GB/s / weight bytes per token"
"$py" - "$res" "$ck/config.json" "$bw" "$dtypes" <<'EOF'
import json, statistics, sys
from collections import defaultdict
res, cfg, bw, dtypes = sys.argv[1], json.load(open(sys.argv[2])), float(sys.argv[3]), sys.argv[4].split(",")
v = defaultdict(dict)  # (dtype, batch, side, "p"|"d") -> {round: value}
for line in open(res):
    r, dt, b, side, p, d = line.split("\t")
    v[dt, int(b), side, "p"][r], v[dt, int(b), side, "d"][r] = float(p), float(d)
h, inter, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
qd, kvd = cfg["num_attention_heads"] * hd, cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * hd
params = L * (h * (qd + 2 * kvd) + qd * h + 3 * h * inter) + V * h  # projections and head: what a decode step streams
per = {"fp32": 4, "bf16": 2, "bf16dot": 2, "int8": 36 / 32}  # resin int8: a float32 scale per 32 (Q8_0: 34/32)
name = {"fp32": "F32", "bf16": "BF16", "bf16dot": "BF16", "int8": "Q8_0"}
for dt in dtypes:
    bs = sorted({b for (d, b, _, _) in v if d == dt})
    bound = bw * 1e9 / (params * per[dt])
    for b in bs:
        out = []
        for k, what in (("p", "prefill"), ("d", "decode")):
            rs, ls = v[dt, b, "resin", k], v[dt, b, "llama.cpp", k]
            common = sorted(set(rs) & set(ls))
            ratio = statistics.median(rs[r] / ls[r] for r in common) if common else float("nan")
            out.append(f"{what} resin {statistics.median(rs.values()):7.1f} llama.cpp {statistics.median(ls.values()):7.1f}  {ratio:.2f}x")
        line = f"  {dt:7} vs {name[dt]:4} batch {b}  " + "   ".join(out)
        if b == 1:
            rd, ld = statistics.median(v[dt, 1, "resin", "d"].values()), statistics.median(v[dt, 1, "llama.cpp", "d"].values())
            line += f"   bound {bound:.1f} tok/s ({params * per[dt] / 1e6:.0f} MB a token): resin {100 * rd / bound:.0f}%, llama.cpp {100 * ld / bound:.0f}%"
        print(line)
EOF
