#!/usr/bin/env bash
# make deb: blipless_<version>-1_<arch>.deb with cargo-deb (docs/INSTALL.md).
# <version> is the crate version and, built from a git checkout, the commit's
# date and hash (0.1.0+git20261205081500.2c2a9b09b1c4), so that each commit's
# package upgrades the one before; the binaries are built with that name in
# BLIPLESS_VERSION, so --version, /metrics and deploy records say it too.
# With --no-build (the tests) the package has the crate version alone.
#   scripts/deb.sh [--profile release|dev] [--output DIR] [--no-build]
# Builds the three binaries, stages what the package holds that the
# repository does not have as files (the units with /usr/bin paths, man
# pages, completions), and runs cargo deb --no-build. The package's layout
# is [package.metadata.deb] in ingress/Cargo.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
output=target/debian
build=yes
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --output) output="$2"; shift 2 ;;
    # The tests package the binaries make test built (tests/tests/deb.rs).
    --no-build) build=no; shift ;;
    *) echo "usage: $0 [--profile release|dev] [--output DIR] [--no-build]" >&2; exit 2 ;;
  esac
done
cargo=${CARGO:-cargo}
if ! "$cargo" deb --version >/dev/null 2>&1; then
  echo "installing cargo-deb (once)" >&2
  # Pinned: the tests package a dev build, which later versions may refuse.
  "$cargo" install cargo-deb --version 3.8.0 --locked
fi
# By package, not --workspace: the tests crate's fault-injection feature
# must not reach a binary that ships.
crate_version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
version_args=()
if [ "$build" = yes ]; then
  upstream=$crate_version
  # In UTC: the version must order as the commits do whatever the build
  # machine's time zone.
  if stamp=$(TZ=UTC0 git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S 2>/dev/null) \
    && commit=$(git rev-parse --short=12 HEAD 2>/dev/null); then
    upstream="$crate_version+git$stamp.$commit"
  fi
  export BLIPLESS_VERSION=$upstream
  version_args=(--deb-version "$upstream-1")
  "$cargo" build --profile "$profile" -p blipless-ingress -p blipless-device -p blipless-ctl
fi
bin_dir=target/$([ "$profile" = dev ] && echo debug || echo "$profile")
stage=.deb-staging
rm -rf "$stage"
mkdir -p "$stage/systemd"
for unit in blipless-ingress blipless-device; do
  sed 's#/usr/local/bin/#/usr/bin/#g' "systemd/$unit.service" >"$stage/systemd/$unit.service"
done
# The packaged device plane follows the host setup unit.
sed -i 's#^After=network-online.target blipless-ingress.service#After=network-online.target blipless-ingress.service blipless-net.service#; s#^Wants=network-online.target blipless-ingress.service#Wants=network-online.target blipless-ingress.service blipless-net.service#' \
  "$stage/systemd/blipless-device.service"
# Both lines changed (a comment names the unit too).
grep -q '^After=.*blipless-net.service' "$stage/systemd/blipless-device.service"
grep -q '^Wants=.*blipless-net.service' "$stage/systemd/blipless-device.service"
"$bin_dir/blipless-ingress" --write-docs "$stage/docs"
"$bin_dir/blipless-device" --write-docs "$stage/docs"
"$bin_dir/blipless-ctl" config docs "$stage/docs"
gzip -9n "$stage"/docs/man1/*.1
# bash-completion loads a command's completion from a file named after it.
for file in "$stage"/docs/completions/bash/*.bash; do mv "$file" "${file%.bash}"; done
mkdir -p "$output"
"$cargo" deb -p blipless-ingress --no-build --profile "$profile" --output "$output" "${version_args[@]}"
