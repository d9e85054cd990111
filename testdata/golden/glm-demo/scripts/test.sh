#!/usr/bin/env bash
# scripts/test.sh: the glm-demo runtime's test command: gofmt, go vet, build, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== gofmt"
bad=$(gofmt -l $(find . -name '*.go' -not -path './third_party/*'))
if [ -n "$bad" ]; then
	echo "gofmt would change:"; echo "$bad"; exit 1
fi
echo "== go vet"
go vet ./...
echo "== CGO_ENABLED=0 go build"
CGO_ENABLED=0 go build ./...
echo "== go test"
go test -count=1 "$@" ./...
