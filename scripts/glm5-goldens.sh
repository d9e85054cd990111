#!/usr/bin/env bash
# scripts/glm5-goldens.sh: makes models/glm-5-flash's goldens with transformers 5.23.0 on
# torch's CPU path (eager attention and experts; float32 weights, float64 reference logits):
#
#   testdata/config_cases.json   what Glm5NextConfig / Glm5NextTextConfig make of nested,
#                                flat and legacy config.json forms (TestConfigCases)
#   testdata/parity/<case>/      tiny perturbed checkpoints (module or checkpoint-side tensor
#                                names; one in bf16) with the logits of every position
#                                (TestTransformersParity, TestPagedTextParity, TestMixedBatchStates),
#                                their MTP layer's logits (TestMTPParity) and, for the bf16
#                                case, transformers' own bf16 logits (TestBF16Parity)
#
# Usage: scripts/glm5-goldens.sh [--out DIR] [--only-config]
# Then:  go test ./models/glm-5-flash -run 'TestConfigCases|TestTransformersParity|TestPagedTextParity|TestMTPParity|TestBF16Parity' -v
# torch, transformers and safetensors are installed, pinned, into .cache/torch-venv.
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
exec "$venv/bin/python" "$root/scripts/glm5-goldens.py" "$@"
