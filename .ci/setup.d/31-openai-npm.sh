#!/usr/bin/env bash
# Installs the official `openai` npm client (v6: v7 needs Node 22, this machine has 20)
# under .cache/node-openai for core/serve's end-to-end test, which drives `resin serve`
# with it. Idempotent; never fails the run when the registry is unreachable (the test
# then skips and says why).
set -uo pipefail
root=$(git rev-parse --show-toplevel)
dir="$root/.cache/node-openai"
version=6.49.0
if ! command -v node >/dev/null 2>&1; then
	echo "   node is not installed; the openai end-to-end test will skip"
	exit 0
fi
if [ "$(node -p "try{require('$dir/node_modules/openai/package.json').version}catch(e){''}" 2>/dev/null)" != "$version" ]; then
	mkdir -p "$dir"
	[ -f "$dir/package.json" ] || echo '{"name":"resin-openai-e2e","private":true}' > "$dir/package.json"
	if ! timeout 300 npm install --silent --no-audit --no-fund --prefix "$dir" "openai@$version" >/dev/null 2>&1; then
		echo "   could not install openai@$version from npm; the openai end-to-end test will skip"
		exit 0
	fi
	echo "   installed openai@$version"
fi
echo "RESIN_OPENAI_NODE_MODULES=$dir/node_modules" >> "$root/.cache/test.env"
