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
# The runner conformance suites on the emulated GPU (deepseek-v4-flash, glm-5-flash, TP=2
# llama) take 3-12 minutes each on 2 CPUs and run only with RESIN_EMU_CONFORMANCE=1.
# Each stage prints its time ("== go test (312 s)"). A test binary may run for
# RESIN_TEST_TIMEOUT (default 30m; go test's own default, 10m, leaves little room for
# cmd/resin-new, which builds scaffolds, on a cold build cache and 2 cores).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; esac
cd "$(dirname "$0")/.."
timeout=${RESIN_TEST_TIMEOUT:-30m}
stage_name="" stage_t0=$SECONDS
# stage NAME: prints the time of the stage before, then starts NAME ("" ends the last).
stage() {
	if [ -n "$stage_name" ]; then echo "== $stage_name ($((SECONDS - stage_t0)) s)"; fi
	stage_name=$1 stage_t0=$SECONDS
	if [ -n "$1" ]; then echo "== $1"; fi
}
trap 'rc=$?; if [ $rc -ne 0 ] && [ -n "$stage_name" ]; then echo "== $stage_name FAILED ($((SECONDS - stage_t0)) s; $SECONDS s in all)"; fi' EXIT
mkdir -p .cache
: > .cache/test.env
for s in .ci/setup.d/*.sh; do
	[ -e "$s" ] || continue
	stage "setup: $s"
	bash "$s" || echo "   (setup $s failed; tests that need it will skip)"
done
set -a
# shellcheck disable=SC1091
. .cache/test.env
set +a

stage "gofmt"
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*'))
if [ -n "$bad" ]; then
	echo "gofmt would change:"; echo "$bad"; exit 1
fi
stage "go vet"
go vet ./...
stage "CGO_ENABLED=0 go build"
CGO_ENABLED=0 go build ./...
stage "go test"
go test -count=1 -timeout "$timeout" "$@" ./...
# The emulated CUDA device's time and counts (written by the tests through emu.Report).
if [ -s "${RESIN_EMU_SUMMARY:-}" ]; then sed 's/^/   /' "$RESIN_EMU_SUMMARY"; fi
stage "go test, GEMM on the gonum fallback (RESIN_BLAS=off)"
RESIN_BLAS=off go test -count=1 -timeout "$timeout" "$@" ./core/kernels/ref
RESIN_BLAS=off go test -count=1 -timeout "$timeout" -run 'TestTransformersParity|TestRunnerConformance' "$@" ./models/llama
stage "go test -race (engine and slab pool)"
go test -race -count=1 -timeout "$timeout" "$@" ./core/engine/... ./core/kvslab/...
stage ""
echo "== all stages passed ($SECONDS s)"
