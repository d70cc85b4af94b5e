#!/usr/bin/env bash
# Installs the Debian packages the tests and demos use, when missing.
# Usage: scripts/ensure-packages.sh PACKAGE[:COMMAND] ...
# A package is missing when its command is not on PATH (COMMAND defaults to
# the package name), or, for a COMMAND that is an absolute path (a Python
# module, say), when that file does not exist. As root it runs apt-get; otherwise it prints the command.
set -euo pipefail
missing=()
for spec in "$@"; do
  package=${spec%%:*}
  command=${spec#*:}
  if [[ $command == /* ]]; then
    [ -e "$command" ] || missing+=("$package")
  else
    command -v "$command" >/dev/null 2>&1 || missing+=("$package")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
