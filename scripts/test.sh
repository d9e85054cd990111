#!/usr/bin/env bash
# scripts/test.sh: the project's test command (README quick start, .ci/run).
#
# 1. runs every .ci/setup.d/*.sh: each installs, idempotently and into .cache/ only, a tool
#    the tests use (NVRTC/ptxas wheels, the openai npm client, ...) and appends the
#    environment that points at it to .cache/test.env; a setup that cannot reach its
#    registry says so and the tests that need it skip with a message;
# 2. checks gofmt, go vet and CGO_ENABLED=0 go build ./...;
# 3. runs go test ./... (GEMM on the BLAS that setup installed, when it could), reruns the
#    GEMM-sensitive tests (core/kernels/ref, llama parity and conformance) on the gonum
#    fallback with RESIN_BLAS=off, then go test -race on core/engine and core/kvslab (extra
#    arguments are passed on to all of them, e.g. scripts/test.sh -run Pool).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
mkdir -p .cache
: > .cache/test.env
for s in .ci/setup.d/*.sh; do
	[ -e "$s" ] || continue
	echo "== setup: $s"
	bash "$s" || echo "   (setup $s failed; tests that need it will skip)"
done
set -a
# shellcheck disable=SC1091
. .cache/test.env
set +a

echo "== gofmt"
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*'))
if [ -n "$bad" ]; then
	echo "gofmt would change:"; echo "$bad"; exit 1
fi
echo "== go vet"
go vet ./...
echo "== CGO_ENABLED=0 go build"
CGO_ENABLED=0 go build ./...
echo "== go test"
go test -count=1 "$@" ./...
echo "== go test, GEMM on the gonum fallback (RESIN_BLAS=off)"
RESIN_BLAS=off go test -count=1 "$@" ./core/kernels/ref
RESIN_BLAS=off go test -count=1 -run 'TestTransformersParity|TestRunnerConformance' "$@" ./models/llama
echo "== go test -race (engine and slab pool)"
go test -race -count=1 "$@" ./core/engine/... ./core/kvslab/...
