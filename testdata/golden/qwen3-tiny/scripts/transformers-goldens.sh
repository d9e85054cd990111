#!/usr/bin/env bash
# scripts/transformers-goldens.sh: makes the transformers parity goldens parity_test.go
# compares the qwen3-tiny forward with: reference logits from transformers (torch on the CPU,
# float32) for a fixed token sequence.
#
#   scripts/transformers-goldens.sh                  # config.json shrunk to a few layers, random
#                                                    # weights: testdata/parity/<model_type>-shrunk
#   scripts/transformers-goldens.sh CHECKPOINT_DIR --out testdata/parity
#                                                    # a real checkpoint's logits: testdata/parity/checkpoint
#                                                    # (the weights are not copied; the case names their path)
#   scripts/transformers-goldens.sh --builtin testdata/parity
#                                                    # the dense base's tiny Llama, Qwen2, Qwen3, Mistral cases
#
# Then: go test -run TestTransformersParity -v .
# torch, transformers and safetensors are installed, pinned, into .cache/torch-venv (PyPI's
# torch wheel with its CUDA libraries is several GB; only its CPU path is used).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/.cache/torch-venv
if [ ! -x "$venv/bin/python" ]; then
	mkdir -p "$root/.cache"
	[ -e "$root/.cache/.gitignore" ] || echo '*' > "$root/.cache/.gitignore"
	python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q "torch==2.15.0" "transformers==5.23.0" "safetensors==0.8.0"
if [ $# -eq 0 ]; then
	set -- "$root"
fi
"$venv/bin/python" "$root/scripts/transformers_goldens.py" "$@"
