#!/usr/bin/env bash
# scripts/dspark-goldens.sh: makes core/dspark's goldens: tiny random DeepSpec drafters (vanilla,
# gated and rnn Markov heads, confidence head with and without the Markov embedding, and a
# drafter with neither), saved as save_pretrained writes them, and what DeepSpec's drafting
# code (ported minimally in scripts/dspark_goldens.py) proposes for given target features.
#
#   scripts/dspark-goldens.sh            # into core/dspark/testdata
#
# Then: go test ./core/dspark -run TestGolden -v
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
"$venv/bin/python" "$root/scripts/dspark_goldens.py" "${1:-$root/core/dspark/testdata}"
