#!/bin/sh
# Runs the benchmarks against the release binaries and writes docs/BENCHMARKS.md:
# first blipless-bench (it rewrites the whole file), then, as root,
# blipless-bench-wg (WireGuard through network namespaces, beside wireguard-go),
# which rewrites only its section between <!-- wireguard:begin --> and
# <!-- wireguard:end -->. Arguments go to blipless-bench; --quick and --out also
# to blipless-bench-wg. Then, as root, blipless-bench-handoff (ingress handoffs
# under WireGuard traffic) rewrites its section between <!-- handoff:begin -->
# and <!-- handoff:end --> (--quick and --out go to it too). Last, as root,
# blipless-bench-egress (egress through a SOCKS5 upstream and a WireGuard exit
# beside direct, deploys under an exit's stream, failover) rewrites its section
# between <!-- egress:begin --> and <!-- egress:end --> (--quick and --out too).
# blipless-bench-fleet (the store on one Redis, Sentinel and Cluster; no root)
# runs right after blipless-bench and rewrites its section between
# <!-- fleet:begin --> and <!-- fleet:end --> (--quick and --out too), then
# blipless-bench-limits (per-client limits; no root) its section between
# <!-- limits:begin --> and <!-- limits:end -->, then blipless-bench-scale
# (a node with 10,000 and 100,000 clients and WireGuard peers, on SQLite and
# Redis) its section between <!-- scale:begin --> and <!-- scale:end -->, then
# blipless-bench-peers (blipless beside dante, microsocks, tinyproxy, haproxy
# and nginx, installed by `make bench`) its section between <!-- peers:begin -->
# and <!-- peers:end -->; dante needs root (a system user for its RFC 1929
# check), so without root that bench leaves dante out and says so.
# `make bench` builds the binaries first; run from anywhere.
set -eu
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
bench="$target/release/blipless-bench"
bench_wg="$target/release/blipless-bench-wg"
bench_handoff="$target/release/blipless-bench-handoff"
bench_egress="$target/release/blipless-bench-egress"
bench_fleet="$target/release/blipless-bench-fleet"
bench_limits="$target/release/blipless-bench-limits"
bench_scale="$target/release/blipless-bench-scale"
bench_peers="$target/release/blipless-bench-peers"
for binary in "$bench" "$bench_wg" "$bench_handoff" "$bench_egress" "$bench_fleet" "$bench_limits" "$bench_scale" "$bench_peers"; do
    if [ ! -x "$binary" ]; then
        echo "bench.sh: $binary is missing: run \`make bench\` (it builds the release binaries)" >&2
        exit 1
    fi
done
# Compilers or test runs beside the benchmark skew every figure.
if pgrep -x rustc >/dev/null 2>&1 || pgrep -x cargo >/dev/null 2>&1; then
    echo "bench.sh: warning: cargo or rustc is running on this machine; the figures will be disturbed" >&2
fi
out=docs/BENCHMARKS.md
wg_args=""
previous=""
for arg in "$@"; do
    if [ "$previous" = "--out" ]; then out="$arg"; fi
    if [ "$arg" = "--quick" ]; then wg_args="--quick"; fi
    previous="$arg"
done
# The harness finds target/release binaries with this.
# Daemons log at the production level while measured.
export BLIPLESS_TEST_LOG=info BLIPLESS_PROFILE=release
# The main bench rewrites the whole file: keep the WireGuard, handoff and egress sections
# to put back if their benches cannot run.
saved="$(mktemp)"
saved_handoff="$(mktemp)"
saved_egress="$(mktemp)"
saved_fleet="$(mktemp)"
saved_limits="$(mktemp)"
saved_scale="$(mktemp)"
saved_peers="$(mktemp)"
trap 'rm -f "$saved" "$saved_handoff" "$saved_egress" "$saved_fleet" "$saved_limits" "$saved_scale" "$saved_peers"' EXIT
if [ -f "$out" ]; then
    sed -n '/<!-- wireguard:begin -->/,/<!-- wireguard:end -->/p' "$out" >"$saved"
    sed -n '/<!-- handoff:begin -->/,/<!-- handoff:end -->/p' "$out" >"$saved_handoff"
    sed -n '/<!-- egress:begin -->/,/<!-- egress:end -->/p' "$out" >"$saved_egress"
    sed -n '/<!-- fleet:begin -->/,/<!-- fleet:end -->/p' "$out" >"$saved_fleet"
    sed -n '/<!-- limits:begin -->/,/<!-- limits:end -->/p' "$out" >"$saved_limits"
    sed -n '/<!-- scale:begin -->/,/<!-- scale:end -->/p' "$out" >"$saved_scale"
    sed -n '/<!-- peers:begin -->/,/<!-- peers:end -->/p' "$out" >"$saved_peers"
fi
restore() {
    if [ -s "$saved" ]; then
        printf '\n' >>"$out"
        cat "$saved" >>"$out"
        echo "bench.sh: kept the previous WireGuard section of $out" >&2
    fi
}
restore_handoff() {
    if [ -s "$saved_handoff" ]; then
        printf '\n' >>"$out"
        cat "$saved_handoff" >>"$out"
        echo "bench.sh: kept the previous handoff section of $out" >&2
    fi
}
restore_egress() {
    if [ -s "$saved_egress" ]; then
        printf '\n' >>"$out"
        cat "$saved_egress" >>"$out"
        echo "bench.sh: kept the previous egress section of $out" >&2
    fi
}
"$bench" --out docs/BENCHMARKS.md "$@"
# shellcheck disable=SC2086 # wg_args is empty or one word
if ! "$bench_fleet" --out "$out" $wg_args; then
    if [ -s "$saved_fleet" ]; then
        printf '\n' >>"$out"
        cat "$saved_fleet" >>"$out"
        echo "bench.sh: kept the previous fleet section of $out" >&2
    fi
    exit 1
fi
# shellcheck disable=SC2086 # wg_args is empty or one word
if ! "$bench_limits" --out "$out" $wg_args; then
    if [ -s "$saved_limits" ]; then
        printf '\n' >>"$out"
        cat "$saved_limits" >>"$out"
        echo "bench.sh: kept the previous limits section of $out" >&2
    fi
    exit 1
fi
# shellcheck disable=SC2086 # wg_args is empty or one word
if ! "$bench_scale" --out "$out" $wg_args; then
    if [ -s "$saved_scale" ]; then
        printf '\n' >>"$out"
        cat "$saved_scale" >>"$out"
        echo "bench.sh: kept the previous scale section of $out" >&2
    fi
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "bench.sh: dante in the peers bench needs root (a system user for its RFC 1929 check): it is left out; run \`sudo make bench\` for it" >&2
fi
# shellcheck disable=SC2086 # wg_args is empty or one word
if ! "$bench_peers" --out "$out" $wg_args; then
    if [ -s "$saved_peers" ]; then
        printf '\n' >>"$out"
        cat "$saved_peers" >>"$out"
        echo "bench.sh: kept the previous peers section of $out" >&2
    fi
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "bench.sh: the WireGuard bench needs root (network namespaces, TUN, nftables): run \`sudo make bench\`" >&2
    restore
    restore_handoff
    restore_egress
    exit 0
fi
# shellcheck disable=SC2086 # wg_args is empty or one word
if ! "$bench_wg" --out "$out" $wg_args; then
    restore
    restore_handoff
    restore_egress
    exit 1
fi
# shellcheck disable=SC2086 # wg_args is empty or one word
if ! "$bench_handoff" --out "$out" $wg_args; then
    restore_handoff
    restore_egress
    exit 1
fi
# shellcheck disable=SC2086 # wg_args is empty or one word
if ! "$bench_egress" --out "$out" $wg_args; then
    restore_egress
    exit 1
fi
