#!/usr/bin/env bash
# Requests sent on upstream connections the upstream has just closed (docs/reference/behaviour.md#stale-upstream-connections):
# for each binary, a fresh daemon in front of a 1-worker nginx origin on 127.0.0.1 whose keep-alive timeout is 5 s
# opens 256 upstream connections under wrk -c256, idles 7 s (the origin closes them all), then takes wrk -c256
# again. Prints how many of those requests got a non-2xx answer (a 502 for a request the upstream never saw).
#
#   bash scripts/stale-connections.sh BINARY [BINARY ...]         # TLS origin offering HTTP/1.1 only
#   STALE_TLS=0 bash scripts/stale-connections.sh BINARY          # plain HTTP origin
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,9p' "$0"; exit 2; }
for tool in wrk nginx; do command -v $tool >/dev/null || { echo "stale-connections.sh: $tool not found (apt-get install $tool)" >&2; exit 2; }; done
BASE=${STALE_PORT_BASE:-18850}; ORIGIN=$BASE PROXY=$((BASE + 1))
WORK=$(mktemp -d -t backstop-stale.XXXX); PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib/ab-origin.sh"
ORIGIN_KEEPALIVE_TIMEOUT=5s start_ab_origin "$WORK" "$ORIGIN" "$PROXY" "${STALE_TLS:-1}" 1 \
  || { echo "stale-connections.sh: openssl cannot make the origin certificate" >&2; exit 2; }
PIDS+=("$ORIGIN_PID")
wait_port $ORIGIN
run_wrk() { wrk -t1 -c256 -d3s -s "$(dirname "${BASH_SOURCE[0]}")/../bench/wrk_report.lua" -H "Host: 127.0.0.1:$PROXY" "http://127.0.0.1:$PROXY/"; }
echo "| binary | requests after the idle period | non-2xx |"
echo "|---|---:|---:|"
for bin in "$@"; do
  "$bin" run --config "$WORK/proxy.yaml" 2>>"$WORK/proxy.log" & pid=$!
  wait_port $PROXY
  run_wrk >/dev/null
  sleep 7
  line=$(run_wrk | grep WRKJSON)
  kill $pid; wait $pid 2>/dev/null || true
  python3 -c 'import json, sys; d = json.loads(sys.argv[2].split(" ", 1)[1]); print("| %s | %d | %d |" % (sys.argv[1], d["requests"], d["non2xx3xx"]))' "$bin" "$line"
done
