#!/usr/bin/env bash
# Creates .cache/runner-venv with numpy and the resin-runner package (python/) for the
# out-of-process runner tests (core/wire): the Python codec against the golden fixtures and
# the end-to-end runs of `python -m resin_runner.llama`. Idempotent (reinstalls the package
# when python/ changed); never fails the run when Python or PyPI is unreachable (the tests
# then skip and say why).
set -uo pipefail
root=$(git rev-parse --show-toplevel)
venv="$root/.cache/runner-venv"
py=""
for c in python3.13 python3.12 python3.11 python3; do
	if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
		py=$c
		break
	fi
done
if [ -z "$py" ]; then
	echo "   no Python >= 3.11; the Python runner tests will skip"
	exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
	if ! "$py" -m venv "$venv" >/dev/null 2>&1; then
		echo "   could not create $venv (python3-venv missing?); the Python runner tests will skip"
		rm -rf "$venv"
		exit 0
	fi
fi
stamp="$venv/.resin-runner-stamp"
# The hash skips what pip writes into python/ (build/, *.egg-info), which would otherwise
# change it on the run after each install.
want=$(cd "$root" && find python \( -name build -o -name '*.egg-info' -o -name __pycache__ \) -prune -o -type f \( -name '*.py' -o -name 'pyproject.toml' \) -print0 | sort -z | xargs -0 cat | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
	if ! timeout 600 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check numpy "$root/python" >/dev/null 2>&1; then
		echo "   could not install numpy and ./python into $venv; the Python runner tests will skip"
		exit 0
	fi
	echo "$want" > "$stamp"
	echo "   installed resin-runner into $venv"
fi
echo "RESIN_RUNNER_PYTHON=$venv/bin/python" >> "$root/.cache/test.env"
