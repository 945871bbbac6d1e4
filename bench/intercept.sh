#!/usr/bin/env bash
# TLS interception side by side: Backstop, mitmproxy and Squid (ssl_bump) in front of one TLS origin, everything on
# 127.0.0.1. The client (backstop-load, since wrk cannot CONNECT through a proxy) sends `CONNECT api.test:443`,
# verifies the proxy's minted leaf against that proxy's root (SNI api.test), and sends GET / back to back with
# keep-alive on every connection, one request in flight each. Every proxy maps api.test to the origin, verifies the
# origin's certificate against the CA made for the run, and keeps its upstream connections alive. Interleaved
# rounds: in every round each proxy in turn (a different order each round) is started, warmed up for 1 s, loaded
# at each concurrency, and stopped. Prints, per concurrency, the median req/s, p99 and CPU µs per request of the
# proxy's processes (utime+stime of it and its children over the requests completed), and req/s relative to Backstop.
#
#   bash bench/intercept.sh               # 3 rounds x 10 s, c=32 (~3 min with all three proxies)
#   bash bench/intercept.sh --conns "32 256"
#   bash bench/intercept.sh --quick       # 1 round x 3 s
#   options: --rounds N, --duration 10s, --conns "32", --targets "backstop mitmproxy squid" (also: direct, the
#            client straight to the origin over TLS: its CPU column is the origin's)
#   env: BACKSTOP_BIN (default .build/release/backstop), LOAD_BIN (default .build/release/backstop-load),
#        INTERCEPT_PORT_BASE (default 18900; uses BASE..BASE+3), MITMDUMP (default: mitmdump on PATH)
#
# Needs nginx, openssl, curl and the two release binaries (bash scripts/build-release.sh --product
# backstop, and --product backstop-load). mitmproxy (pip install mitmproxy) and Squid with OpenSSL (apt-get install
# squid-openssl) are skipped with a note when missing. Nothing outside a temporary directory is written; every
# process started here is stopped at exit. docs/performance.md explains the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3; DUR=10s; CONNS="32"; TARGETS="backstop mitmproxy squid"
while [ $# -gt 0 ]; do
  case $1 in
    --quick) ROUNDS=1; DUR=3s ;;
    --rounds) ROUNDS=$2; shift ;;
    --duration) DUR=$2; shift ;;
    --conns) CONNS=$2; shift ;;
    --targets) TARGETS=$2; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "intercept.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
for tool in nginx openssl curl python3; do
  command -v "$tool" >/dev/null || { echo "intercept.sh: $tool not found (apt-get install nginx openssl curl python3)" >&2; exit 2; }
done
BIN=$(readlink -f "${BACKSTOP_BIN:-.build/release/backstop}" 2>/dev/null || true)
LOAD=$(readlink -f "${LOAD_BIN:-.build/release/backstop-load}" 2>/dev/null || true)
[ -x "$LOAD" ] || { echo "intercept.sh: no load client at ${LOAD_BIN:-.build/release/backstop-load} (bash scripts/build-release.sh --product backstop-load)" >&2; exit 2; }
MITMDUMP=${MITMDUMP:-$(command -v mitmdump || true)}
SQUID=$(command -v squid || true)
CERTGEN=/usr/lib/squid/security_file_certgen
available=()
for t in $TARGETS; do
  case $t in
    backstop) [ -x "$BIN" ] || { echo "intercept.sh: skipping backstop: no binary at ${BACKSTOP_BIN:-.build/release/backstop} (bash scripts/build-release.sh --product backstop)" >&2; continue; } ;;
    mitmproxy) [ -n "$MITMDUMP" ] && [ -x "$MITMDUMP" ] || { echo "intercept.sh: skipping mitmproxy (pip install mitmproxy)" >&2; continue; } ;;
    squid)
      # ssl_bump needs a Squid built with OpenSSL and its certificate generator (Debian: squid-openssl).
      if [ -z "$SQUID" ] || [ ! -x "$CERTGEN" ] || ! "$SQUID" -v 2>/dev/null | grep -q -- '--with-openssl'; then
        echo "intercept.sh: skipping squid (apt-get install squid-openssl)" >&2; continue
      fi
      # Squid reaches the origin on 127.0.0.1:443 (see setup below).
      if (exec 3<>/dev/tcp/127.0.0.1/443) 2>/dev/null; then
        echo "intercept.sh: skipping squid: 127.0.0.1:443 is taken (the origin listens there for Squid)" >&2; continue
      fi ;;
    direct) ;;
    *) echo "intercept.sh: unknown target $t" >&2; exit 2 ;;
  esac
  available+=("$t")
done
[ "${#available[@]}" -gt 0 ] || { echo "intercept.sh: no target to run" >&2; exit 2; }

WORK=$(mktemp -d -t backstop-intercept.XXXX)
chmod 755 "$WORK"   # nginx and squid drop privileges and read their files from here
BASE=${INTERCEPT_PORT_BASE:-18900}
ORIGIN=$BASE
declare -A PORT=([backstop]=$((BASE + 1)) [mitmproxy]=$((BASE + 2)) [squid]=$((BASE + 3)))
declare -A CLIENT_CA=()
ORIGIN_PID=""; PROXY_PID=""

descendants() {  # a process and all its descendants
  local p
  echo "$1"
  for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do descendants "$p"; done
}
stop_pid() {  # TERM the process and its descendants, KILL what is left after 5 s
  local pids p i
  pids=$(descendants "$1")
  kill -TERM $pids 2>/dev/null || true
  for i in $(seq 1 50); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
  wait "$1" 2>/dev/null || true
}
cleanup() {
  if [ -n "$PROXY_PID" ]; then stop_pid "$PROXY_PID"; fi
  if [ -n "$ORIGIN_PID" ]; then stop_pid "$ORIGIN_PID"; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ulimit -n 20000 2>/dev/null || true

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {  # until 127.0.0.1:$1 accepts while process $2 runs (20 s at most)
  local i
  for i in $(seq 1 200); do
    kill -0 "$2" 2>/dev/null || return 1
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
for p in "$ORIGIN" "${PORT[@]}"; do
  port_free "$p" || { echo "intercept.sh: port $p is in use (set INTERCEPT_PORT_BASE)" >&2; exit 1; }
done

# The run's CA and the origin's certificate (ECDSA P-256) for localhost, api.test and 127.0.0.1: Backstop and
# mitmproxy reach the origin as https://localhost:ORIGIN, Squid as https://api.test (127.0.0.1:443).
source scripts/lib/origin-cert.sh
make_origin_cert "$WORK" DNS:localhost,DNS:api.test,IP:127.0.0.1 localhost \
  || { echo "intercept.sh: openssl cannot make the origin certificate" >&2; exit 1; }
CLIENT_CA[direct]=$WORK/ca.pem

# The origin: 1-worker nginx, TLS (HTTP/1.1 only, so every proxy speaks HTTP/1.1 upstream), keep-alive, a 100-byte
# body; a second listener on 127.0.0.1:443 (same server, same worker) when Squid runs.
mkdir -p "$WORK/origin"; chmod 777 "$WORK/origin"
LISTEN_443=""
[[ " ${available[*]} " == *" squid "* ]] && LISTEN_443="listen 127.0.0.1:443 ssl backlog=4096;"
cat > "$WORK/origin/nginx.conf" <<CONF
worker_processes 1; daemon off; user root root; pid $WORK/origin/nginx.pid; error_log $WORK/origin/error.log warn;
events { worker_connections 8192; }
http {
  access_log off; keepalive_requests 1000000; keepalive_timeout 75s;
  client_body_temp_path $WORK/origin/b; proxy_temp_path $WORK/origin/p; fastcgi_temp_path $WORK/origin/f;
  uwsgi_temp_path $WORK/origin/u; scgi_temp_path $WORK/origin/s;
  ssl_certificate $WORK/origin.pem; ssl_certificate_key $WORK/origin.key; ssl_protocols TLSv1.2 TLSv1.3;
  ssl_session_cache shared:SSL:10m;
  server { listen 127.0.0.1:$ORIGIN ssl backlog=4096; $LISTEN_443
    location / { default_type text/plain; return 200 "intercept origin 100-byte body xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; } } }
CONF
nginx -p "$WORK/origin" -c "$WORK/origin/nginx.conf" -e "$WORK/origin/error.log" > "$WORK/origin/out" 2>&1 &
ORIGIN_PID=$!
wait_port "$ORIGIN" "$ORIGIN_PID" || { echo "intercept.sh: the origin did not start:" >&2; cat "$WORK/origin/out" "$WORK/origin/error.log" >&2; exit 1; }

# One-time set-up of each proxy's own root CA (what its clients trust).
setup() {
  local dir=$WORK/$1
  mkdir -p "$dir"
  case $1 in
    backstop)
      cat > "$dir/backstop.yaml" <<CONF
version: 1
listen: [127.0.0.1:${PORT[backstop]}]
log: {level: warning, access_log: false}
keychain: {path: $dir/keychain.bkc, key_file: $dir/keychain.key}
intercept: {}
upstreams:
  - {name: api, match: {hosts: [api.test]}, url: "https://localhost:$ORIGIN", tls: {ca_file: "$WORK/ca.pem"},
     intercept: true}
CONF
      "$BIN" ca init --config "$dir/backstop.yaml" > "$dir/ca-init.out" 2>&1 || { cat "$dir/ca-init.out" >&2; return 1; }
      "$BIN" ca export --config "$dir/backstop.yaml" > "$dir/root.pem"
      CLIENT_CA[backstop]=$dir/root.pem ;;
    mitmproxy)
      # mitmproxy writes its CA into its confdir on first start (start() waits for it).
      mkdir -p "$dir/conf"
      CLIENT_CA[mitmproxy]=$dir/conf/mitmproxy-ca-cert.pem ;;
    squid)
      openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=squid bench CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
      chmod 644 "$dir/ca.key" "$dir/ca.pem"
      "$CERTGEN" -c -s "$dir/ssl_db" -M 4MB > "$dir/certgen.out" 2>&1 || { cat "$dir/certgen.out" >&2; return 1; }
      mkdir -p "$dir/run"
      chown -R proxy:proxy "$dir/ssl_db" "$dir/run" 2>/dev/null || chmod -R 777 "$dir/ssl_db" "$dir/run"
      # No cache, no logs but errors, one process (plus the certificate generator helper), nothing outside $dir.
      # Squid forwards to api.test directly, found in its own hosts file (127.0.0.1), on port 443: the origin's
      # second listener. (Through a cache_peer, which could map the port, Squid 5 sends every bumped request with
      # Connection: close and opens a TLS connection per request.) The origin is verified against the run's CA
      # under the name api.test; server connections are persistent. DNS only to 127.0.0.1: no lookup leaves.
      echo "127.0.0.1 api.test" > "$dir/hosts"
      cat > "$dir/squid.conf" <<CONF
workers 1
http_port 127.0.0.1:${PORT[squid]} ssl-bump generate-host-certificates=on dynamic_cert_mem_cache_size=4MB tls-cert=$dir/ca.pem tls-key=$dir/ca.key
sslcrtd_program $CERTGEN -s $dir/ssl_db -M 4MB
sslcrtd_children 2 startup=1 idle=1
ssl_bump bump all
tls_outgoing_options cafile=$WORK/ca.pem
hosts_file $dir/hosts
http_access allow localhost
http_access deny all
cache deny all
cache_mem 0 MB
max_filedescriptors 20000
client_persistent_connections on
server_persistent_connections on
pconn_timeout 120 seconds
access_log none
cache_store_log none
cache_log $dir/run/cache.log
debug_options ALL,1
logfile_rotate 0
pid_filename $dir/run/squid.pid
coredump_dir $dir/run
icp_port 0
htcp_port 0
pinger_enable off
digest_generation off
netdb_filename none
dns_nameservers 127.0.0.1
shutdown_lifetime 1 seconds
CONF
      chmod 644 "$dir/hosts" "$dir/squid.conf"
      CLIENT_CA[squid]=$dir/ca.pem ;;
    direct) ;;
  esac
}

# start NAME: starts the proxy in the background (PROXY_PID) and waits until it listens.
start() {
  local name=$1 dir=$WORK/$1 port=${PORT[$1]:-}
  case $name in
    backstop)
      "$BIN" run --config "$dir/backstop.yaml" > "$dir/out" 2>&1 & ;;
    mitmproxy)
      # Regular proxy mode with its own CA in confdir; upstream certificates verified against the run's CA.
      # connection_strategy=lazy: no upstream connection at CONNECT time (api.test does not resolve); map-remote
      # then rewrites each request's https://api.test/ to https://localhost:ORIGIN/ before mitmproxy connects (SNI
      # and verified name localhost); one upstream connection per client connection, kept alive.
      "$MITMDUMP" --mode "regular@$port" --listen-host 127.0.0.1 --set confdir="$dir/conf" \
        --set ssl_verify_upstream_trusted_ca="$WORK/ca.pem" --set connection_strategy=lazy \
        --map-remote "|//api.test(:443)?/|//localhost:$ORIGIN/" \
        --set termlog_verbosity=error --set flow_detail=0 --set http2=false \
        > "$dir/out" 2>&1 & ;;
    squid)
      rm -f "$dir/run/squid.pid"
      "$SQUID" -N -f "$dir/squid.conf" > "$dir/out" 2>&1 & ;;
    direct) return 0 ;;
  esac
  PROXY_PID=$!
  if ! wait_port "$port" "$PROXY_PID"; then
    echo "intercept.sh: $name did not listen on $port; its output:" >&2
    cat "$dir/out" "$dir/run/cache.log" 2>/dev/null >&2 || true
    exit 1
  fi
  if [ "$name" = mitmproxy ]; then
    local i
    for i in $(seq 1 100); do [ -s "${CLIENT_CA[mitmproxy]}" ] && break; sleep 0.1; done
  fi
}
stop() {
  if [ -n "$PROXY_PID" ]; then stop_pid "$PROXY_PID"; fi
  PROXY_PID=""
}

ticks() {  # utime+stime (clock ticks) of a process and all its descendants
  local sum=0 p
  for p in $(descendants "$1"); do
    [ -r "/proc/$p/stat" ] && sum=$((sum + $(awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$p/stat" 2>/dev/null || echo 0)))
  done
  echo "$sum"
}

load() {  # load NAME CONNS DURATION: one backstop-load run, its JSON line on stdout
  if [ "$1" = direct ]; then
    "$LOAD" --url "https://localhost:$ORIGIN/" --ca "${CLIENT_CA[direct]}" --conns "$2" --duration "$3"
  else
    "$LOAD" --connect api.test:443 --proxy "127.0.0.1:${PORT[$1]}" --ca "${CLIENT_CA[$1]}" --conns "$2" --duration "$3"
  fi
}

# Set-up and a check of every target: curl through it must get the origin's body with the proxy's root trusted.
usable=()
for t in "${available[@]}"; do
  setup "$t" || { echo "intercept.sh: skipping $t: its set-up failed" >&2; continue; }
  start "$t"
  if [ "$t" = direct ]; then
    body=$(curl -s --max-time 10 --cacert "${CLIENT_CA[direct]}" "https://localhost:$ORIGIN/" || true)
  else
    body=$(curl -s --max-time 10 --proxy "http://127.0.0.1:${PORT[$t]}" --cacert "${CLIENT_CA[$t]}" https://api.test/ || true)
  fi
  stop
  if [[ $body != "intercept origin 100-byte body"* ]]; then
    echo "intercept.sh: skipping $t: curl through it got '${body:0:200}'; its output:" >&2
    cat "$WORK/$t/out" "$WORK/$t/run/cache.log" 2>/dev/null | tail -20 >&2 || true
    continue
  fi
  usable+=("$t")
done
[ "${#usable[@]}" -gt 0 ] || { echo "intercept.sh: no target passed its check" >&2; exit 1; }

HZ=$(getconf CLK_TCK)
RESULTS=$WORK/results.tsv
: > "$RESULTS"
first_conns=${CONNS%% *}
echo "# intercept: ${usable[*]}; ${ROUNDS} round(s) x $DUR, c = $CONNS, $(nproc) cores, $(date -u +%FT%TZ)" >&2
versions=""
for t in "${usable[@]}"; do
  case $t in
    mitmproxy) versions+="$("$MITMDUMP" --version 2>/dev/null | head -1); " ;;
    squid) versions+="$("$SQUID" -v 2>/dev/null | head -1); " ;;
  esac
done
[ -z "$versions" ] || echo "# ${versions%; }" >&2
n=${#usable[@]}
for round in $(seq 1 "$ROUNDS"); do
  for i in $(seq 0 $((n - 1))); do
    t=${usable[$(( (i + round - 1) % n ))]}  # a different order every round
    start "$t"
    load "$t" "$first_conns" 1s > /dev/null 2>&1 || true  # warm-up: leaf minted, caches and pools filled
    pid=${PROXY_PID:-$ORIGIN_PID}                          # direct: the origin's CPU
    for c in $CONNS; do
      before=$(ticks "$pid")
      json=$(load "$t" "$c" "$DUR" 2> "$WORK/load.err" | tail -1 || true)
      after=$(ticks "$pid")
      if [[ $json != "{"* ]]; then
        echo "intercept.sh: no result from backstop-load for $t at c=$c:" >&2; cat "$WORK/load.err" >&2
        continue
      fi
      if grep -q error "$WORK/load.err"; then sed 's/^/  /' "$WORK/load.err" | head -3 >&2; fi
      printf '%s\t%s\t%s\t%s\t%s\n' "$t" "$c" "$round" "$((after - before))" "$json" >> "$RESULTS"
      echo "  round $round c=$c $t: $json" >&2
      sleep 1
    done
    stop
  done
done
python3 - "$RESULTS" "$HZ" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    target, conns, _, ticks, blob = line.rstrip("\n").split("\t")
    d = json.loads(blob)
    cpu = int(ticks) / int(sys.argv[2]) * 1e6 / max(d["requests"], 1)
    rows.setdefault((int(conns), target), []).append((d["rps"], d["p99_ms"], cpu, d["errors"]))
for conns in sorted({c for c, _ in rows}):
    print(f"\n### c={conns}\n")
    print("| target | req/s (median) | p99 ms | CPU µs/req | req/s ÷ backstop | errors |")
    print("|---|---:|---:|---:|---:|---:|")
    med = {t: [statistics.median(x[i] for x in v) for i in range(3)] + [sum(x[3] for x in v)]
           for (c, t), v in rows.items() if c == conns}
    base = med.get("backstop", [None])[0]
    for target, (rate, p99, cpu, errors) in med.items():
        ratio = f"{rate / base:.2f}" if base else "–"
        # `direct` is the client against the origin itself: its CPU column is the origin's, not a proxy's.
        print(f"| {target} | {rate:.0f} | {p99:.2f} | {cpu:.1f} | {ratio} | {errors} |")
EOF
