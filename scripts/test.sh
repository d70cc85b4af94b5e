#!/usr/bin/env bash
# Runs every test of the workspace and closes with one summary line,
# "summary: N passed, N failed", summed over all of cargo's test binaries.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
passed=$(sed -nE 's/^test result: .* ([0-9]+) passed; ([0-9]+) failed.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
failed=$(sed -nE 's/^test result: .* ([0-9]+) passed; ([0-9]+) failed.*/\2/p' "$log" | awk '{s+=$1} END {print s+0}')
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  # A build error or a crashed test binary: count it, so the line never says 0 failed.
  failed=1
fi
echo "summary: $passed passed, $failed failed"
exit "$status"
