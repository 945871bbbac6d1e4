#!/usr/bin/env bash
# System calls and context switches per proxied request, by thread, for Backstop binaries and a 1-worker nginx proxy
# in front of the same origin (docs/performance.md#syscalls-and-wake-ups-per-request). perf counts the syscall
# tracepoints of the proxy's threads during a fixed wrk run (keep-alive clients, c=32 unless CONNS is set), after a
# warm-up; the counts are divided by the requests wrk completed. Hold the build lock while it runs (wall clock).
#
#   bash scripts/syscalls.sh BINARY [BINARY ...]              # plain origin, c=32, 5 s
#   IR_TLS=1 [IR_H1=1] IR_REALISTIC=1 CONNS=256 bash scripts/syscalls.sh ...
#   IR_TLS=1 IR_HTTP2=true|false bash scripts/syscalls.sh ... # Backstop's `tls.http2` (unset: the default)
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,10p' "$0"; exit 2; }
for tool in wrk nginx perf; do
  command -v $tool >/dev/null || { echo "syscalls.sh: $tool not found (apt-get install wrk nginx linux-perf)" >&2; exit 2; }
done
CONNS=${CONNS:-32}; DUR=${DUR:-5}; BASE=${IR_PORT_BASE:-18720}
WORK=$(mktemp -d); PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
ORIGIN=$BASE PROXY=$((BASE + 1)) NGINX_PROXY=$((BASE + 2))
HERE=$(dirname "${BASH_SOURCE[0]}")
source "$HERE/lib/ab-origin.sh"
source "$HERE/lib/realistic.sh"
REPORT=$HERE/../bench/wrk_report.lua
export REALISTIC=${IR_REALISTIC:-0} WRK_REALISTIC=${IR_REALISTIC:-0}
export PROXY_HTTP2=${IR_HTTP2:-}
start_ab_origin "$WORK" "$ORIGIN" "$PROXY" "${IR_TLS:-0}" "${IR_H1:-0}" \
  || { echo "syscalls.sh: openssl cannot make the origin certificate" >&2; exit 2; }
PIDS+=("$ORIGIN_PID")
wait_port $ORIGIN 60
EVENTS="syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_poll,syscalls:sys_enter_futex,context-switches"
measure() {  # NAME PID: per-request counts by thread name
  local name=$1 pid=$2
  wrk -t1 -c"$CONNS" -d2s -s "$REPORT" -H "Host: 127.0.0.1:$3" "http://127.0.0.1:$3/" >/dev/null 2>&1
  perf stat --per-thread -x, -e "$EVENTS" -p "$pid" -o "$WORK/perf.csv" -- sleep "$DUR" &
  local perf=$!
  out=$(wrk -t1 -c"$CONNS" -d"${DUR}s" -s "$REPORT" -H "Host: 127.0.0.1:$3" "http://127.0.0.1:$3/")
  wait $perf || true
  reqs=$(printf '%s\n' "$out" | awk '/requests in/ {print $1}')
  python3 - "$WORK/perf.csv" "$reqs" "$name" <<'PY'
import sys, collections, re
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    parts = line.strip().split(",")
    if len(parts) < 4 or not parts[1].replace(".", "").isdigit(): continue
    thread = re.sub(r"-\d+$", "", parts[0]); event = parts[3].split(":")[-1].replace("sys_enter_", "")
    rows[thread][event] = rows[thread].get(event, 0) + float(parts[1])
reqs = int(sys.argv[2]); name = sys.argv[3]
events = ["read", "write", "writev", "sendto", "recvfrom", "epoll_wait", "epoll_ctl", "poll", "futex", "context-switches"]
total = collections.Counter()
for thread, counts in sorted(rows.items()):
    if sum(counts.values()) / reqs < 0.01: continue
    print(f"| {name} | {thread} | " + " | ".join(f"{counts.get(e, 0) / reqs:.2f}" for e in events) + " |")
    total.update(counts)
print(f"| **{name}** | **all** | " + " | ".join(f"**{total.get(e, 0) / reqs:.2f}**" for e in events) + f" | ({reqs} requests)")
PY
}
echo "| proxy | thread | read | write | writev | sendto | recvfrom | epoll_wait | epoll_ctl | poll | futex | context switches |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
# nginx as a proxy, for comparison (proxy_pass with keepalive; the same token injected in the realistic mode).
authz=""; [ "$REALISTIC" = 1 ] && authz="proxy_set_header Authorization \"Bearer $(realistic_token)\";"
scheme=http; ssl=""
if [ "${IR_TLS:-0}" = 1 ]; then scheme=https; ssl="proxy_ssl_trusted_certificate $WORK/ca.pem; proxy_ssl_verify on; proxy_ssl_session_reuse on;"; fi
start_nginx_proxy "$WORK" "$ORIGIN" "$NGINX_PROXY" "$scheme" "$authz $ssl"
PIDS+=("$NGINX_PROXY_PID"); nginx_master=$NGINX_PROXY_PID
wait_port $NGINX_PROXY 10
measure nginx "$(pgrep -P "$nginx_master" | head -1)" $NGINX_PROXY
for given in "$@"; do
  if [ "$REALISTIC" = 1 ]; then rm -f "$WORK"/keychain/*; seed_realistic_keychain "$given" "$WORK/proxy.yaml"; fi
  "$given" run --config "$WORK/proxy.yaml" 2>"$WORK/backstop.log" & pid=$!
  wait_port $PROXY 30
  measure "$(basename "$given")" $pid $PROXY
  kill $pid; wait $pid 2>/dev/null || true
done
