#!/bin/sh
# Runs the benchmarks against the release binaries and writes docs/BENCHMARKS.md.
# `make bench` builds the binaries first; run from anywhere.
set -eu
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
bench="$target/release/blipless-bench"
if [ ! -x "$bench" ]; then
    echo "bench.sh: $bench is missing: run \`make bench\` (it builds the release binaries)" >&2
    exit 1
fi
# Compilers or test runs beside the benchmark skew every figure.
if pgrep -x rustc >/dev/null 2>&1 || pgrep -x cargo >/dev/null 2>&1; then
    echo "bench.sh: warning: cargo or rustc is running on this machine; the figures will be disturbed" >&2
fi
# The harness finds target/release binaries with this.
# Daemons log at the production level while measured.
BLIPLESS_TEST_LOG=info BLIPLESS_PROFILE=release exec "$bench" --out docs/BENCHMARKS.md "$@"
