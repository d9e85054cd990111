#!/usr/bin/env bash
# Creates .cache/openai-venv with Python's official `openai` client and `langchain-openai`
# (with pydantic) for cmd/resin's structured-output test, which drives `resin serve` with
# them (response_format json_schema, tool_choice, LangChain's with_structured_output and
# bind_tools). About 140 MB and 20 s on 2 cores. Idempotent (reinstalls when the pinned
# versions change); never fails the run when Python or PyPI is unreachable (the test then
# skips and says why).
set -uo pipefail
root=$(git rev-parse --show-toplevel)
venv="$root/.cache/openai-venv"
pkgs="openai==3.57.0 langchain-openai==1.7.4 langchain-core==1.8.3 pydantic==2.14.4"
py=""
for c in python3.13 python3.12 python3.11 python3; do
	if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
		py=$c
		break
	fi
done
if [ -z "$py" ]; then
	echo "   no Python >= 3.10; the Python openai/langchain test will skip"
	exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
	if ! "$py" -m venv "$venv" >/dev/null 2>&1; then
		echo "   could not create $venv (python3-venv missing?); the Python openai/langchain test will skip"
		rm -rf "$venv"
		exit 0
	fi
fi
stamp="$venv/.resin-openai-stamp"
if [ "$(cat "$stamp" 2>/dev/null)" != "$pkgs" ]; then
	# shellcheck disable=SC2086 # $pkgs is a list of requirement specifiers
	if ! timeout 600 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $pkgs >/dev/null 2>&1; then
		echo "   could not install $pkgs into $venv; the Python openai/langchain test will skip"
		exit 0
	fi
	echo "$pkgs" > "$stamp"
	echo "   installed $pkgs"
fi
echo "RESIN_OPENAI_PYTHON=$venv/bin/python" >> "$root/.cache/test.env"
