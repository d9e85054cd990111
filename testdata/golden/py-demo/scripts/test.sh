#!/usr/bin/env bash
# scripts/test.sh: the py-demo runtime's test command: gofmt, go vet, build, and the tests
# (Go and, through them, the Python package's; RESIN_PYTHON names the interpreter, and the
# tests that need it skip, saying why, without one).
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
echo "== go test (Python: ${RESIN_PYTHON:-python3})"
go test -count=1 "$@" ./...
