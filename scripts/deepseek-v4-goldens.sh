#!/usr/bin/env bash
# scripts/deepseek-v4-goldens.sh: makes models/deepseek-v4-flash's goldens with transformers
# 5.23.0 on torch's CPU path (float32, eager attention):
#
#   testdata/config_cases.json   what DeepseekV4Config makes of legacy and current config.json
#                                forms (TestConfigCases)
#   testdata/parity/<case>/      tiny checkpoints in the three tensor name forms with the
#                                logits of every position and the MTP head's (TestTransformersParity, TestPagedStateParity)
#
# Usage: scripts/deepseek-v4-goldens.sh [--out DIR] [--only-config]
# Then:  go test ./models/deepseek-v4-flash -run 'TestConfigCases|TestTransformersParity|TestPagedStateParity' -v
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
exec "$venv/bin/python" "$root/scripts/deepseek-v4-goldens.py" "$@"
