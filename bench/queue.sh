#!/usr/bin/env bash
# Queued delivery (docs/performance.md#queued-delivery): how many requests per second Backstop accepts for queued
# delivery (stored, fsynced, answered 202) and the accept latency, at c=32 with 1 KiB POST bodies, beside direct
# forwarding of the same requests to the same origin; then how fast the stored queue drains to the origin.
# Everything on 127.0.0.1: one nginx origin answering 204, one Backstop with two upstreams (`direct` and
# `queued`, host names direct.test and queued.test), the spool in a temporary directory on the disk this script
# runs from (fsync is real: the figures are this disk's).
#
#   bash bench/queue.sh                         # c=32, 10 s per run
#   options: --conns 32, --duration 10s
#   env: BACKSTOP_BIN (default .build/release/backstop), QUEUE_PORT_BASE (default 19100), SPOOL_DIR (default a new
#        directory under ./.bench-spool), KEEP_WORK=1 (keep configs and logs), ATTACH (a command run in the
#        background while the queued requests are accepted, with BACKSTOP_PID set: e.g.
#        ATTACH='perf record -g -o /tmp/queue.perf -p $BACKSTOP_PID -- sleep 5')
#
# Deliveries run while requests are accepted (`queue.concurrency: 32`): the figures are how many were delivered
# per second meanwhile, and how fast the backlog the accept run left drains (`backstop_queue_depth` to 0).
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS=32; DURATION=10s
while [ $# -gt 0 ]; do
  case $1 in
    --conns) CONNS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "queue.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
for tool in nginx wrk curl python3; do
  command -v "$tool" >/dev/null || { echo "queue.sh: $tool not found (apt-get install nginx wrk curl python3)" >&2; exit 2; }
done
BIN=$(readlink -f "${BACKSTOP_BIN:-.build/release/backstop}" 2>/dev/null || true)
[ -x "$BIN" ] || { echo "queue.sh: no binary at ${BACKSTOP_BIN:-.build/release/backstop} (bash scripts/build-release.sh --product backstop)" >&2; exit 2; }
BASE=${QUEUE_PORT_BASE:-19100}
ORIGIN=$BASE PROXY=$((BASE + 1)) ADMIN=$((BASE + 2))
WORK=$(mktemp -d)
mkdir -p .bench-spool
SPOOL=${SPOOL_DIR:-$(mktemp -d "$PWD/.bench-spool/spool.XXXXXX")}
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP_WORK:-0}" = 1 ]; then echo "queue.sh: kept $WORK and $SPOOL" >&2; else rm -rf "$WORK" "$SPOOL"; fi
}
trap cleanup EXIT
wait_port() {
  for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done
  echo "queue.sh: nothing listens on port $1" >&2; return 1
}

start_origin() {
  cat > "$WORK/origin.conf" <<EOF
worker_processes 1;
pid $WORK/origin.pid;
error_log $WORK/origin.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_buffer_size 16k;
  server { listen 127.0.0.1:$ORIGIN reuseport; location / { return 204; } }
}
EOF
  nginx -c "$WORK/origin.conf" -p "$WORK" -g 'daemon off;' &
  ORIGIN_PID=$!
  PIDS+=("$ORIGIN_PID")
  wait_port "$ORIGIN"
}

cat > "$WORK/backstop.yaml" <<EOF
version: 1
listen: [127.0.0.1:$PROXY]
admin: {listen: 127.0.0.1:$ADMIN}
log: {level: warning, access_log: false}
keychain: {path: $WORK/keychain.bkc, key_file: $WORK/keychain.key}
spool: {dir: $SPOOL}
upstreams:
  - name: direct
    match: {hosts: [direct.test]}
    url: http://127.0.0.1:$ORIGIN
  - name: queued
    match: {hosts: [queued.test]}
    url: http://127.0.0.1:$ORIGIN
    delivery: queue
    queue: {concurrency: 32}
EOF
"$BIN" keychain init --config "$WORK/backstop.yaml" >/dev/null
"$BIN" check --config "$WORK/backstop.yaml" >/dev/null

cat > "$WORK/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = string.rep("e", 1024)
wrk.headers["Content-Type"] = "application/json"
EOF
cat bench/wrk_report.lua >> "$WORK/post.lua"

start_origin
"$BIN" run --config "$WORK/backstop.yaml" 2> "$WORK/backstop.log" &
BACKSTOP_PID=$!
PIDS+=("$BACKSTOP_PID")
wait_port "$PROXY"

run_wrk() {  # HOST → prints "requests/s p50_ms p99_ms non2xx"
  wrk -t2 -c"$CONNS" -d"$DURATION" -s "$WORK/post.lua" -H "Host: $1" "http://127.0.0.1:$PROXY/events" 2>&1 \
    | python3 -c '
import json, sys
for line in sys.stdin:
    if line.startswith("WRKJSON "):
        r = json.loads(line[8:])
        s = r["duration_us"] / 1e6
        print("%.0f %.2f %.2f %d" % (r["requests"] / s, r["p50_us"] / 1e3, r["p99_us"] / 1e3, r["non2xx3xx"]))'
}

depth() {
  curl -s "http://127.0.0.1:$ADMIN/metrics" | awk '/^backstop_queue_depth\{upstream="queued"\}/ {print $2}'
}

echo "queue.sh: c=$CONNS, $DURATION per run, 1 KiB POST bodies, spool on $(df -P "$SPOOL" | awk 'NR==2 {print $1}')"
echo "| path | requests/s | p50 ms | p99 ms | not 2xx |"
echo "| --- | ---: | ---: | ---: | ---: |"
read -r rps p50 p99 bad < <(run_wrk direct.test)
echo "| direct forwarding (answered by the origin) | $rps | $p50 | $p99 | $bad |"
if [ -n "${ATTACH:-}" ]; then BACKSTOP_PID=$BACKSTOP_PID bash -c "sleep 1; $ATTACH" >&2 & fi
read -r rps p50 p99 bad < <(run_wrk queued.test)
echo "| delivery: queue (answered 202 once stored) | $rps | $p50 | $p99 | $bad |"

# Deliveries run alongside the accept run; what it left queued drains now.
delivered() {
  curl -s "http://127.0.0.1:$ADMIN/metrics" \
    | awk '/^backstop_deliveries_total\{/ && /upstream="queued"/ && /result="delivered"/ {print $2}'
}
during=$(delivered); backlog=$(depth); t0=$(date +%s.%N)
for _ in $(seq 1 2400); do [ "$(depth)" = 0 ] && break; sleep 0.05; done
t1=$(date +%s.%N)
python3 - "$during" "$backlog" "$t0" "$t1" "$DURATION" <<'EOF'
import sys
during, backlog = int(float(sys.argv[1] or 0)), int(float(sys.argv[2] or 0))
t0, t1, seconds = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5].rstrip("s"))
print("| deliveries to the origin while accepting | %.0f/s | | | |" % (during / seconds))
print("| the backlog left (%d) drained after the run | %s | | | |" % (backlog, "%.0f/s" % (backlog / (t1 - t0)) if backlog else "-"))
EOF
