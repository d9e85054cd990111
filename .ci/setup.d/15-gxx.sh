#!/usr/bin/env bash
# .ci/setup.d/15-gxx.sh: makes sure a host C++ compiler (g++ >= 11, with its ASan and UBSan
# runtimes) is installed: core/cudart/emu compiles the CUDA kernels with it to run them on
# the emulated device. Installs Debian's g++ with apt-get only when g++ is missing (CI runs
# as root); when it cannot, the emulated tests skip, naming g++. Appends
# RESIN_EMU_SUMMARY to .cache/test.env: the emulated tests write their time and counts
# there (emu.Report) and scripts/test.sh prints it after go test.
set -uo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
mkdir -p "$root/.cache"
: > "$root/.cache/emu-summary.txt"
echo "RESIN_EMU_SUMMARY=$root/.cache/emu-summary.txt" >> "$root/.cache/test.env"
if command -v g++ >/dev/null; then
	echo "   $(g++ --version | head -n1)"
	exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
	echo "   g++ not found and apt-get unavailable (or not root): the emulated CUDA tests will skip"
	exit 0
fi
echo "   installing g++ with apt-get"
export DEBIAN_FRONTEND=noninteractive
if timeout 600 apt-get update -qq && timeout 900 apt-get install -y -qq --no-install-recommends g++ >/dev/null; then
	echo "   $(g++ --version | head -n1)"
else
	echo "   apt-get could not install g++: the emulated CUDA tests will skip"
fi
exit 0
