#!/usr/bin/env bash
# Runs a local blipless node for trying it out (`make run` builds first, then
# calls this): an ingress and a device plane on the embedded store, a demo
# client, and what to type. Ctrl-C (or SIGTERM) stops both daemons.
#
# Everything lives in .run/ in the repository (git-ignored):
#   blipless.toml      the node's config, rewritten on every run
#   runtime/ state/    Unix sockets, and the SQLite store (both mode 700;
#                      runtime/ is a mktemp -d directory instead when the
#                      repository's path is too long for Unix sockets)
#   ingress.log device.log
#   demo-client.json   the demo client's name and secret (mode 600)
#   tls/               when openssl is installed: a private CA made for the
#                      demo (ca.pem) and the HTTPS proxy listener's
#                      certificate for 127.0.0.1 and localhost (mode 700)
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$(pwd)
run_dir="$repo/.run"
config="$run_dir/blipless.toml"
client_file="$run_dir/demo-client.json"
bin="${CARGO_TARGET_DIR:-target}/release"
ctl="$bin/blipless-ctl"
ready_timeout=30   # seconds to wait for /status to answer 200
stop_timeout=5     # seconds between SIGTERM and SIGKILL

say() { printf '%s\n' "$*"; }
fail() { printf 'run-local: %s\n' "$*" >&2; exit 1; }

for binary in blipless-ingress blipless-device blipless-ctl; do
  [ -x "$bin/$binary" ] || fail "$bin/$binary is missing: run \`make run\` (it builds first)"
done
command -v curl >/dev/null 2>&1 || fail "curl is needed: \`make deps\` installs it (as root)"

# .run/ and everything in it belong to whoever runs this, and only they may
# read the state or reach the sockets: created 0700, refused if another user
# owns it or others may write in it.
private_dir() { # DIR: create it 0700, or check that an existing one is ours and not writable by others
  local dir=$1 mode
  if [ ! -e "$dir" ]; then
    (umask 077 && mkdir -p "$dir") || fail "cannot create $dir (is the repository writable by $(id -un)?)"
  fi
  [ -d "$dir" ] && [ ! -L "$dir" ] || fail "$dir is not a directory (or is a symbolic link): remove it"
  [ -O "$dir" ] || fail "$dir belongs to $(stat -c %U "$dir"), not to $(id -un): refusing to use it (remove it, or run as its owner)"
  mode=$(stat -c %a "$dir")
  if (( 8#$mode & 8#022 )); then
    fail "$dir has mode $mode: others may write in it; refusing to use it (chmod 700 it)"
  fi
  chmod 700 "$dir"
}
private_dir "$run_dir"
private_dir "$run_dir/state"

# --- An earlier `make run` still running? -----------------------------------
for name in ingress device; do
  pid_file="$run_dir/$name.pid"
  [ -f "$pid_file" ] || continue
  pid=$(cat "$pid_file")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
     grep -q blipless "/proc/$pid/cmdline" 2>/dev/null; then
    fail "a node from an earlier \`make run\` is still running (blipless-$name, pid $pid): stop it first (Ctrl-C in its terminal, or kill $pid)"
  fi
  rm -f "$pid_file"
done

# --- Runtime directory: Unix socket paths are limited to 107 bytes ----------
# Too long a repository path: a fresh directory of our own from mktemp (never
# a predictable name in a shared /tmp), removed when the node stops.
runtime_dir="$run_dir/runtime"
temporary_runtime=""
if [ ${#runtime_dir} -gt 94 ]; then
  temporary_runtime=$(mktemp -d "${TMPDIR:-/tmp}/blipless-run.XXXXXXXX") ||
    fail "cannot create a runtime directory with mktemp -d"
  runtime_dir=$temporary_runtime
  trap 'rm -rf -- "$temporary_runtime"' EXIT   # until stop_node's trap below takes over
  say "note: $run_dir/runtime is too long for Unix sockets; using $runtime_dir"
  [ ${#runtime_dir} -le 94 ] || fail "$runtime_dir is too long for Unix sockets too: set TMPDIR to a shorter directory"
fi
private_dir "$runtime_dir"

# --- Listen ports: the usual ones, or the next free ones --------------------
port_busy() {
  if command -v ss >/dev/null 2>&1; then
    [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}

taken=" "
pick_port() { # NAME PREFERRED: prints the port to use
  local name=$1 port=$2
  while port_busy "$port" || [[ "$taken" == *" $port "* ]]; do
    port=$((port + 1))
    [ "$port" -le $(($2 + 100)) ] || fail "no free port for $name in $2..$(($2 + 100))"
  done
  [ "$port" = "$2" ] || say "note: port $2 ($name) is taken; using $port" >&2
  printf '%s' "$port"
}
socks_port=$(pick_port socks 1080); taken+="$socks_port "
http_port=$(pick_port http 8080); taken+="$http_port "
status_port=$(pick_port status 9180); taken+="$status_port "
https_port=""
if command -v openssl >/dev/null 2>&1; then
  https_port=$(pick_port https 8443); taken+="$https_port "
fi
socks_addr="127.0.0.1:$socks_port"
http_addr="127.0.0.1:$http_port"
status_url="http://127.0.0.1:$status_port/status"

# --- The HTTPS proxy listener's certificate (when openssl is installed) -------
# A CA of the demo's own, made once, and a certificate it signs for
# 127.0.0.1 and localhost; both made again when the certificate is missing
# or expires within a day. Customers' curl trusts it with --proxy-cacert.
tls_dir="$run_dir/tls"
demo_certificate() {
  local dir=$1
  (
    cd "$dir" &&
    umask 077 &&
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
      -subj "/CN=blipless make run demo CA" -keyout ca.key -out ca.pem &&
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -subj "/CN=localhost" -keyout proxy.key -out proxy.csr &&
    printf 'subjectAltName = DNS:localhost, IP:127.0.0.1\nextendedKeyUsage = serverAuth\n' >proxy.ext &&
    openssl x509 -req -in proxy.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
      -days 825 -extfile proxy.ext -out proxy.pem &&
    rm -f proxy.csr proxy.ext ca.srl
  ) >/dev/null 2>&1
}
if [ -n "$https_port" ]; then
  private_dir "$tls_dir"
  if ! openssl x509 -checkend 86400 -noout -in "$tls_dir/proxy.pem" >/dev/null 2>&1; then
    demo_certificate "$tls_dir" || fail "openssl could not make the demo certificate in $tls_dir"
    say "made a demo CA and the HTTPS proxy's certificate in .run/tls/"
  fi
fi

# --- The config ---------------------------------------------------------------
toml_string() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }
cat >"$config" <<EOF
# Written by scripts/run-local.sh on every \`make run\`: edits here are lost.
# Every key and its default: docs/CONFIG.md.

[node]
runtime_dir = $(toml_string "$runtime_dir")
state_dir = $(toml_string "$run_dir/state")

[listen]
socks = "$socks_addr"
http = "$http_addr"
status = "127.0.0.1:$status_port"
$(if [ -n "$https_port" ]; then
printf 'https = "127.0.0.1:%s"\n\n[tls]\ncertificate = %s\nkey = %s\n' \
  "$https_port" "$(toml_string "$tls_dir/proxy.pem")" "$(toml_string "$tls_dir/proxy.key")"
fi)

[egress]
# Loopback is denied by default; this lets the demo reach the node's own
# status page through the proxy.
allow = ["127.0.0.1/32"]

[drain]
# Short, so that Ctrl-C stops the demo within a few seconds even with a
# tunnel open (the default is 120s).
grace = "3s"
EOF

# --- Start both daemons; stop them on Ctrl-C, SIGTERM or any failure ---------
ingress_pid=""
device_pid=""

stop_node() {
  trap - INT TERM EXIT
  local pids=() pid waited=0
  for pid in $device_pid $ingress_pid; do
    kill -0 "$pid" 2>/dev/null && pids+=("$pid")
  done
  if [ ${#pids[@]} -gt 0 ]; then
    say ""
    say "stopping blipless (SIGTERM to ${pids[*]})..."
    kill -TERM "${pids[@]}" 2>/dev/null || true
    while [ "$waited" -lt $((stop_timeout * 10)) ]; do
      local alive=0
      for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
      [ "$alive" -eq 1 ] || break
      sleep 0.1
      waited=$((waited + 1))
    done
    for pid in "${pids[@]}"; do
      if kill -0 "$pid" 2>/dev/null; then
        say "pid $pid did not stop within ${stop_timeout}s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
      fi
      wait "$pid" 2>/dev/null || true
    done
    say "stopped."
  fi
  rm -f "$run_dir/ingress.pid" "$run_dir/device.pid"
  if [ -n "$temporary_runtime" ]; then
    rm -rf -- "$temporary_runtime"
  fi
}

show_logs() {
  local log
  for log in "$run_dir/ingress.log" "$run_dir/device.log"; do
    [ -s "$log" ] || continue
    printf '\n--- last lines of %s ---\n' "${log#"$repo"/}" >&2
    tail -n 15 "$log" >&2
  done
}

trap 'stop_node; exit 0' INT TERM
trap 'status=$?; [ "$status" -eq 0 ] || show_logs; stop_node; exit "$status"' EXIT

# NO_COLOR: plain log files, without terminal colour codes.
NO_COLOR=1 "$bin/blipless-ingress" --config "$config" >"$run_dir/ingress.log" 2>&1 &
ingress_pid=$!
echo "$ingress_pid" >"$run_dir/ingress.pid"
NO_COLOR=1 "$bin/blipless-device" --config "$config" >"$run_dir/device.log" 2>&1 &
device_pid=$!
echo "$device_pid" >"$run_dir/device.pid"

check_alive() {
  kill -0 "$ingress_pid" 2>/dev/null || fail "blipless-ingress exited (see .run/ingress.log)"
  kill -0 "$device_pid" 2>/dev/null || fail "blipless-device exited (see .run/device.log)"
}

say "starting blipless: ingress pid $ingress_pid, device plane pid $device_pid; waiting for $status_url"
deadline=$((SECONDS + ready_timeout))
until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$status_url" || true)" = 200 ]; do
  check_alive
  [ "$SECONDS" -lt "$deadline" ] ||
    fail "$status_url did not answer 200 within ${ready_timeout}s"
  sleep 0.2
done

# --- The demo client: created once, its secret kept in .run/demo-client.json --
secret=""
if [ -f "$client_file" ]; then
  secret=$(sed -n 's/.*"secret": *"\([A-Za-z0-9_-]*\)".*/\1/p' "$client_file")
fi
clients=$("$ctl" --config "$config" --json client list)
if [[ "$clients" == *'"name": "demo"'* ]]; then
  if [ -z "$secret" ]; then
    say "client demo exists but its secret was not saved; creating it again"
    "$ctl" --config "$config" client remove demo >/dev/null
  fi
else
  secret=""
fi
if [ -z "$secret" ]; then
  (umask 077 && "$ctl" --config "$config" --json client add demo >"$client_file.new")
  mv "$client_file.new" "$client_file"
  chmod 600 "$client_file"
  secret=$(sed -n 's/.*"secret": *"\([A-Za-z0-9_-]*\)".*/\1/p' "$client_file")
  [ -n "$secret" ] || fail "could not read the new client's secret from $client_file"
  say "created client demo (secret saved in .run/demo-client.json)"
else
  say "reusing client demo from .run/demo-client.json"
fi
socks_url="socks5h://demo:$secret@$socks_addr"
http_url="http://demo:$secret@$http_addr"
https_lines=""
if [ -n "$https_port" ]; then
  https_url="https://demo:$secret@127.0.0.1:$https_port"
  https_lines="  HTTPS proxy:   $https_url   (TLS to the proxy; its CA is .run/tls/ca.pem)"
  https_try="  curl -x '$https_url' --proxy-cacert .run/tls/ca.pem $status_url"
else
  https_lines="  (no HTTPS proxy: install openssl and run make run again for one)"
  https_try=""
fi

cat <<EOF

blipless is running: SOCKS5 on $socks_addr, HTTP proxy on $http_addr${https_port:+, HTTPS proxy on 127.0.0.1:$https_port}.

  SOCKS5 proxy:  $socks_url
  HTTP proxy:    $http_url
$https_lines

Try it (the status page works offline; example.com needs internet):
  curl -x '$socks_url' $status_url
  curl -x '$http_url' $status_url
${https_try:+$https_try
}  curl -x '$socks_url' https://example.com/
  curl -x '$http_url' https://example.com/
UDP goes through the same SOCKS5 proxy (UDP ASSOCIATE, e.g. with PySocks):
see "UDP through SOCKS5" in docs/CLIENTS.md.

The node (run from $repo):
  $ctl --config .run/blipless.toml status
  $ctl --config .run/blipless.toml client list
Logs: .run/ingress.log and .run/device.log

Ctrl-C stops both.
EOF

# --- Wait until Ctrl-C -------------------------------------------------------
# The ingress must stay up. The device plane may exit on its own: a second
# blipless-device started beside it (a deploy) makes it drain and exit 0.
while true; do
  kill -0 "$ingress_pid" 2>/dev/null || fail "blipless-ingress exited (see .run/ingress.log)"
  if [ -n "$device_pid" ] && ! kill -0 "$device_pid" 2>/dev/null; then
    status=0
    wait "$device_pid" || status=$?
    say "blipless-device (pid $device_pid) exited with status $status; the ingress keeps running."
    say "(After a deploy that is expected; otherwise see .run/device.log.)"
    device_pid=""
    rm -f "$run_dir/device.pid"
  fi
  sleep 1 &
  wait $! || true
done
