#!/usr/bin/env bash
# scripts/llama-cpu-bench.sh: models/llama on the CPU side by side with transformers on
# torch's CPU, same config, same random-weight model size, same thread count; prints
# prefill and decode tokens/s of both at each batch size, and resin/torch ratios.
#
#   resin: `llama bench --batch-sizes` (through core/engine: B prompts at once, prefill
#          tokens/s to every first token, decode tokens/s after), with GOMAXPROCS=THREADS;
#          the BLAS core/blas finds (or RESIN_BLAS_LIB, or gonum with RESIN_BLAS=off).
#   torch: LlamaForCausalLM in float32, torch.set_num_threads(THREADS), a prefill forward
#          (logits of the last row only, as resin computes) then greedy decode steps with
#          the KV cache.
#   The two alternate, ROUNDS times and one batch size at a time (resin, torch, resin,
#   torch, ...), so both see the same machine: on a shared box the speed drifts by 10–30%
#   over seconds to minutes. Each round prints both sides and their ratio; the summary is
#   the median over rounds of each side and of the per-round ratios. A pprof CPU profile
#   of the first resin run is written too, with its GEMM and attention shares.
#
# Environment: THREADS (default: nproc), BATCHES (default 1,8), PROMPT_LEN (512),
# GEN_LEN (32), REPEAT (3 runs a side per round, the median printed), ROUNDS (3), CONFIG (an HF config.json; default a
# ~120M llama: hidden 1024, 8 layers, 16 heads / 4 KV heads, intermediate 2816,
# vocab 32000, tied embeddings, fp32), VENV (default .cache/torch-venv, created with CPU
# torch and transformers when missing), OUT (default .cache/llama-cpu-bench).
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
venv=${VENV:-$root/.cache/torch-venv}
out=${OUT:-$root/.cache/llama-cpu-bench}
mkdir -p "$out"

# The llama bench config (scripts/llama-bench-config.json) unless CONFIG names another.
cp "${CONFIG:-$root/scripts/llama-bench-config.json}" "$out/config.json"
rm -f "$out"/*.safetensors # random weights on both sides

if ! "$venv/bin/python" -c 'import torch, transformers' 2>/dev/null; then
	echo "== installing CPU torch and transformers into $venv"
	python3 -m venv "$venv"
	"$venv/bin/pip" install -q --index-url https://download.pytorch.org/whl/cpu torch
	"$venv/bin/pip" install -q transformers
fi

# KV cache: layers × 2 × kv_heads × head_dim × 4 bytes per token, for the largest batch's
# tokens plus one sequence of the context the engine sizes for (at most 4096 tokens).
cache_bytes=$("$venv/bin/python" - "$out/config.json" "$batches" "$prompt" "$gen" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
per_token = c["num_hidden_layers"] * 2 * c.get("num_key_value_heads", c["num_attention_heads"]) * hd * 4
b = max(int(x) for x in sys.argv[2].split(","))
ctx = min(c.get("max_position_embeddings", 4096), 4096)
print(per_token * (b * (int(sys.argv[3]) + int(sys.argv[4]) + 64) + ctx))
EOF
)

# The BLAS .ci/setup.d/20-openblas.sh installs into .cache/, when RESIN_BLAS_LIB names none.
if [ -z "${RESIN_BLAS_LIB:-}" ] && [ -f "$root/.cache/test.env" ]; then
	lib=$(sed -n 's/^RESIN_BLAS_LIB=//p' "$root/.cache/test.env" | tail -n1)
	if [ -n "$lib" ] && [ -f "$lib" ]; then export RESIN_BLAS_LIB=$lib; fi
fi
if [ -z "${RESIN_BLAS_LIB:-}" ]; then
	lib=$(ls "$root"/.cache/openblas/scipy_openblas32/lib/libscipy_openblas*.so 2>/dev/null | head -n1 || true)
	if [ -n "$lib" ]; then export RESIN_BLAS_LIB=$lib; fi
fi

echo "== machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load $(cut -d' ' -f1-3 /proc/loadavg), threads $threads, $(go version | cut -d' ' -f3)"
echo "== config: $(tr -d ' \n' < "$out/config.json" | head -c 400)"
go build -o "$out/llama" ./models/llama/cmd/llama
cat > "$out/torch_bench.py" <<'EOF'
import json, statistics, sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM

cfg_path, batches, prompt, gen, repeat, threads, seed = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = LlamaConfig(**json.load(open(cfg_path)))
model = LlamaForCausalLM(cfg).to(torch.float32).eval()
print(f"torch: prefill and decode apart, {prompt} prompt + {gen} generated tokens per sequence, median of {repeat}, threads {torch.get_num_threads()}")

def run(b, salt):
    g = torch.Generator().manual_seed(salt)
    ids = torch.randint(0, cfg.vocab_size, (b, prompt), generator=g)
    with torch.inference_mode():
        t0 = time.perf_counter()
        o = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        nxt = o.logits[:, -1].argmax(-1, keepdim=True)
        t1 = time.perf_counter()
        pkv = o.past_key_values
        for _ in range(gen - 1):
            o = model(input_ids=nxt, past_key_values=pkv, use_cache=True)
            pkv = o.past_key_values
            nxt = o.logits[:, -1].argmax(-1, keepdim=True)
        t2 = time.perf_counter()
    return b * prompt / (t1 - t0), b * (gen - 1) / (t2 - t1)

salt = seed
for b in (int(x) for x in batches.split(",")):
    pre, dec = [], []
    for _ in range(repeat):
        p, d = run(b, salt)
        salt += 1
        pre.append(p)
        dec.append(d)
    print(f"  batch {b}  prefill {statistics.median(pre):.1f} tokens/s  decode {statistics.median(dec):.1f} tokens/s")
EOF

echo "== resin (models/llama) $( [ "${RESIN_BLAS:-}" = off ] && echo "RESIN_BLAS=off: gonum" || echo "BLAS: ${RESIN_BLAS_LIB:-searched}")"
echo "== torch $("$venv/bin/python" -c 'import torch, transformers; print(torch.__version__, "transformers", transformers.__version__)')"
rm -f "$out"/resin.*.txt "$out"/torch.*.txt
for round in $(seq 1 "$rounds"); do
	echo "== round $round of $rounds (load $(cut -d' ' -f1 /proc/loadavg))"
	: > "$out/resin.$round.txt"
	: > "$out/torch.$round.txt"
	# One batch size at a time, resin then torch, so the two runs compared are seconds apart.
	for b in ${batches//,/ }; do
		profile=()
		if [ "$round" = 1 ] && [ "$b" = "${batches%%,*}" ]; then profile=(--cpuprofile "$out/cpu.prof"); fi
		GOMAXPROCS=$threads "$out/llama" bench --model "$out" --cache-bytes "$cache_bytes" --max-batch-tokens $((prompt * 8 + 64)) \
			--batch-sizes "$b" --prompt-len "$prompt" --gen-len "$gen" --repeat "$repeat" "${profile[@]}" 2>&1 |
			grep -v '^note:' | grep 'batch [0-9]' | sed 's/^/  resin /' | tee -a "$out/resin.$round.txt"
		"$venv/bin/python" "$out/torch_bench.py" "$out/config.json" "$b" "$prompt" "$gen" "$repeat" "$threads" $((round * 1000 + b)) |
			grep 'batch [0-9]' | sed 's/^/  torch /' | tee -a "$out/torch.$round.txt"
	done
	awk '/batch [0-9]+  prefill/ { key = FILENAME ~ /resin/ ? "r" : "t"; v[key, $3, "p"] = $5; v[key, $3, "d"] = $8; bs[$3] = 1 }
		END { for (b in bs) printf "  ratio batch %s  prefill %.2fx  decode %.2fx\n", b, v["r", b, "p"] / v["t", b, "p"], v["r", b, "d"] / v["t", b, "d"] }' \
		"$out/resin.$round.txt" "$out/torch.$round.txt" | sort -n -k3
done

echo "== summary: median over $rounds rounds (tokens/s; ratio: the median of the rounds' resin/torch)"
awk '
	function median(list,   n, a, i, j, t) {
		n = split(list, a, " ")
		for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	/batch [0-9]+  prefill/ {
		key = FILENAME ~ /resin/ ? "r" : "t"
		n = split(FILENAME, parts, "."); round = parts[n - 1]
		v[key, $3, "p", round] = $5; v[key, $3, "d", round] = $8; bs[$3] = 1; rs[round] = 1
	}
	END {
		for (b in bs) {
			rp = rd = tp = td = qp = qd = ""
			for (r in rs) {
				rp = rp " " v["r", b, "p", r]; rd = rd " " v["r", b, "d", r]
				tp = tp " " v["t", b, "p", r]; td = td " " v["t", b, "d", r]
				qp = qp " " v["r", b, "p", r] / v["t", b, "p", r]; qd = qd " " v["r", b, "d", r] / v["t", b, "d", r]
			}
			printf "  batch %s  prefill resin %.1f torch %.1f  %.2fx   decode resin %.1f torch %.1f  %.2fx\n", b, median(rp), median(tp), median(qp), median(rd), median(td), median(qd)
		}
	}' "$out"/resin.*.txt "$out"/torch.*.txt | sort -n -k2

echo "== resin profile ($out/cpu.prof, round 1, batch ${batches%%,*}): shares of the sampled CPU time (the whole run: loading, prefill, decode)"
# share FOCUS [IGNORE]: the part of all samples whose stack holds a function matching the
# regexp FOCUS (and none matching IGNORE).
share() {
	go tool pprof -top -nodefraction 0 -edgefraction 0 -focus "$1" ${2:+-ignore "$2"} "$out/llama" "$out/cpu.prof" 2>/dev/null |
		sed -n 's/.*accounting for [^,]*, \([0-9.]*%\) of .*/\1/p' | head -n1
}
go tool pprof -top -nodecount 25 "$out/llama" "$out/cpu.prof" 2>/dev/null > "$out/profile.txt" || true
attn='ref\.PagedAttentionBatch$|ref\.\(\*attnJob\)\.run$|ref\.\(\*softmaxRows\)\.run$'
gemm='ref\.gemm$|ref\.\(\*gemmTask\)\.run$|ref\.\(\*skinnyTask\)\.run$' # a GEMM's blocks run on the pool's workers too
echo "  $(grep -m1 'Total samples' "$out/profile.txt" | sed 's/^ *//')"
echo "  GEMM: $(share "$gemm") on Go threads (the calls, attention's own GEMMs included) + $(share 'runtime\._ExternalCode$') in threads of the BLAS's own (RESIN_BLAS_THREADS > 1)"
echo "  attention: $(share "$attn" "$gemm") without its GEMMs, $(share "$attn") with them (on Go threads)"
echo "  model loading (random weights) $(share 'cli\.load$')"
echo "  SiLU-mul $(share 'ref\.SiLUMul$'), RMSNorm $(share 'ref\.RMSNorm$'), RoPE $(share 'RoPENeoX$'); the forward's caller thread $(share 'llama\.\(\*Model\)\.Forward$')"
echo "  (top functions in $out/profile.txt; RESIN_BLAS=off profiles gonum's GEMM as Go code)"
