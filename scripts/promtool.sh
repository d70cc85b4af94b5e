#!/usr/bin/env bash
# Prints the path of a promtool (Debian's, from package prometheus) without
# installing the package: its postinst would create a user and may start a
# Prometheus server. The .deb is downloaded once and promtool extracted
# under target/tools (tests/tests/contrib.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v promtool >/dev/null 2>&1; then
  command -v promtool
  exit 0
fi
tools="${CARGO_TARGET_DIR:-target}/tools"
promtool="$tools/prometheus/usr/bin/promtool"
if [ ! -x "$promtool" ]; then
  mkdir -p "$tools"
  (cd "$tools" && rm -f prometheus_*.deb && apt-get download prometheus >&2)
  dpkg-deb -x "$tools"/prometheus_*.deb "$tools/prometheus"
  rm -f "$tools"/prometheus_*.deb
fi
realpath "$promtool"
