#!/usr/bin/env bash
# How a proxied request's CPU splits between the listener side and the upstream side, for Backstop and nginx
# (docs/performance.md#the-listener-and-the-upstream-side). Everything on 127.0.0.1, c=32 keep-alive (CONNS to
# change), wrk -t1; per round, in this order:
#   nginx proxy      - a 1-worker nginx proxying to the 1-worker nginx origin (keep-alive upstream)
#   nginx itself     - the same nginx worker answering the origin's 100-byte body itself (`return 200`)
#   Backstop proxy   - BINARY forwarding to the origin (scripts/lib/ab-origin.sh's config)
#   Backstop itself  - BINARY answering a request no upstream matches (403 `no-route`): client read, decode,
#                      admission, answer write, and no upstream side at all
# CPU µs per request is utime + stime of the proxy's process over the requests wrk completed (nginx: the worker),
# with its user-space part (utime) beside it: the kernel's share is about the same for both proxies, the
# user-space share is where they differ (docs/performance.md#reference-counting-per-request).
#
#   bash scripts/listener-cost.sh BINARY [ROUNDS] [DURATION]     # defaults: 3 rounds, 5s
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,13p' "$0"; exit 2; }
BIN=$(readlink -f "$1"); ROUNDS=${2:-3}; DUR=${3:-5s}; CONNS=${CONNS:-32}; BASE=${LC_PORT_BASE:-18830}
for tool in wrk nginx; do command -v $tool >/dev/null || { echo "listener-cost.sh: $tool not found" >&2; exit 2; }; done
WORK=$(mktemp -d -t backstop-lc.XXXX); PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
ORIGIN=$BASE PROXY=$((BASE + 1)) NGINX_PROXY=$((BASE + 2)) NGINX_SELF=$((BASE + 3))
source "$(dirname "${BASH_SOURCE[0]}")/lib/ab-origin.sh"
start_ab_origin "$WORK" "$ORIGIN" "$PROXY" 0 0; PIDS+=("$ORIGIN_PID"); wait_port $ORIGIN 30
start_nginx_proxy "$WORK" "$ORIGIN" "$NGINX_PROXY" http "" "server { listen 127.0.0.1:$NGINX_SELF;
    location / { default_type text/plain;
    return 200 \"ab origin 100B body xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"; } }"
nginx_master=$NGINX_PROXY_PID; PIDS+=($nginx_master)
"$BIN" run --config "$WORK/proxy.yaml" 2>"$WORK/backstop.log" & backstop=$!; PIDS+=($backstop)
wait_port $PROXY 30; wait_port $NGINX_PROXY 10; wait_port $NGINX_SELF 10
nginx_worker=$(pgrep -P "$nginx_master" | head -1)
TCK=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
user_ticks() { awk '{print $14}' "/proc/$1/stat"; }
measure() {  # NAME PID PORT HOST
  wrk -t1 -c"$CONNS" -d1s -H "Host: $4" "http://127.0.0.1:$3/" >/dev/null
  local before after user_before user_after out requests
  before=$(cpu_ticks "$2"); user_before=$(user_ticks "$2")
  out=$(wrk -t1 -c"$CONNS" -d"$DUR" -H "Host: $4" "http://127.0.0.1:$3/")
  after=$(cpu_ticks "$2"); user_after=$(user_ticks "$2")
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  printf '%s|%s|%s|%s\n' "$1" "$(awk '/Requests\/sec/ {print $2}' <<<"$out")" \
    "$(python3 -c "print(f'{($after - $before) * 1e6 / $TCK / $requests:.1f}')")" \
    "$(python3 -c "print(f'{($user_after - $user_before) * 1e6 / $TCK / $requests:.1f}')")" >> "$WORK/rows"
}
for round in $(seq 1 "$ROUNDS"); do
  measure "nginx proxy" "$nginx_worker" $NGINX_PROXY "127.0.0.1:$NGINX_PROXY"
  measure "nginx itself" "$nginx_worker" $NGINX_SELF "127.0.0.1:$NGINX_SELF"
  measure "Backstop proxy" "$backstop" $PROXY 127.0.0.1
  measure "Backstop itself (no-route)" "$backstop" $PROXY nowhere.invalid
done
python3 - "$WORK/rows" <<'PY'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, rps, us, user = line.strip().split("|")
    rows[name].append((float(rps), float(us), float(user)))
print("| what | req/s (median) | CPU µs/request (median) | of which user space | rounds (µs) |")
print("|---|---:|---:|---:|---|")
for name, values in rows.items():
    print(f"| {name} | {statistics.median(v[0] for v in values):,.0f} | {statistics.median(v[1] for v in values):.1f} | "
          f"{statistics.median(v[2] for v in values):.1f} | " + ", ".join(f"{v[1]:.1f}" for v in values) + " |")
us = {name: statistics.median(v[1] for v in values) for name, values in rows.items()}
n, ns, b, bs = us["nginx proxy"], us["nginx itself"], us["Backstop proxy"], us["Backstop itself (no-route)"]
print(f"\nlistener side: Backstop {bs:.1f} µs, nginx {ns:.1f} ({bs / ns:.2f}×); upstream side (proxy − itself): "
      f"Backstop {b - bs:.1f} µs, nginx {n - ns:.1f} ({(b - bs) / (n - ns):.2f}×)")
PY
