#!/usr/bin/env bash
# A/B of two backstop binaries on this machine, everything on 127.0.0.1: one nginx origin (1 worker, 100-byte
# body), each binary in turn as a reverse proxy to it, alternating rounds so both see the same machine phases.
# Prints, per binary and concurrency, the median req/s, p99 and CPU µs per request (utime+stime of the proxy
# process over the requests served) — the steadiest figure for a change (docs/performance.md).
#
#   bash scripts/ab.sh OLD_BINARY NEW_BINARY [ROUNDS] [DURATION]     # defaults: 3 rounds, 8s
#   CONNS="32 256" AB_PORT_BASE=18600 bash scripts/ab.sh ...
#   AB_TLS=1 bash scripts/ab.sh ...     # the origin speaks TLS (a CA made for the run; the proxy verifies it)
#   AB_TLS=1 AB_H1=1 bash scripts/ab.sh ...   # ... offering HTTP/1.1 only
#   AB_REALISTIC=1 ...                  # app-like request heads and a 1 KiB bearer token injected (auth: static)
#   AB_HTTP2=true|false ...             # the upstream's `tls.http2` (unset: the default)
#   AB_RAMP=1 ...                       # warm up at the first concurrency only: each later one is measured from the
#                                       # ramp up to it (new upstream connections, TLS handshakes), as bench/peers.sh does
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,15p' "$0"; exit 2; }
A=$(readlink -f "$1"); B=$(readlink -f "$2"); ROUNDS=${3:-3}; DUR=${4:-8s}
CONNS=${CONNS:-"32 256"}; BASE=${AB_PORT_BASE:-18600}
for tool in wrk nginx; do command -v $tool >/dev/null || { echo "ab.sh: $tool not found (apt-get install $tool)" >&2; exit 2; }; done
WORK=$(mktemp -d -t backstop-ab.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
ORIGIN=$BASE PROXY=$((BASE + 1))
source "$(dirname "${BASH_SOURCE[0]}")/lib/ab-origin.sh"
source "$(dirname "${BASH_SOURCE[0]}")/lib/realistic.sh"
export REALISTIC=${AB_REALISTIC:-0} WRK_REALISTIC=${AB_REALISTIC:-0} PROXY_HTTP2=${AB_HTTP2:-}
REPORT=$(dirname "${BASH_SOURCE[0]}")/../bench/wrk_report.lua
start_ab_origin "$WORK" "$ORIGIN" "$PROXY" "${AB_TLS:-0}" "${AB_H1:-0}" \
  || { echo "ab.sh: openssl cannot make the origin certificate" >&2; exit 2; }
PIDS+=("$ORIGIN_PID")
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
wait_port $ORIGIN
TCK=$(getconf CLK_TCK)
echo "| binary | c | round | req/s | p99 | CPU µs/req |" > "$WORK/rounds.md"
for round in $(seq 1 "$ROUNDS"); do
  for which in A B; do
    bin=$A; [ $which = B ] && bin=$B
    if [ "$REALISTIC" = 1 ]; then
      rm -f "$WORK"/keychain/*
      seed_realistic_keychain "$bin" "$WORK/proxy.yaml" || { echo "ab.sh: $bin cannot make the keychain" >&2; exit 2; }
    fi
    "$bin" run --config "$WORK/proxy.yaml" 2>>"$WORK/proxy-$which.log" & pid=$!
    wait_port $PROXY
    warm=1
    for c in $CONNS; do
      [ "$warm" = 1 ] && wrk -t1 -c"$c" -d1s -s "$REPORT" -H "Host: 127.0.0.1:$PROXY" "http://127.0.0.1:$PROXY/" >/dev/null 2>&1
      [ "${AB_RAMP:-0}" = 1 ] && warm=0
      before=$(cpu_ticks $pid)
      out=$(wrk -t1 -c"$c" -d"$DUR" --latency -s "$REPORT" -H "Host: 127.0.0.1:$PROXY" "http://127.0.0.1:$PROXY/")
      after=$(cpu_ticks $pid)
      reqs=$(printf '%s\n' "$out" | awk '/requests in/ {print $1}')
      rps=$(printf '%s\n' "$out" | awk '/Requests\/sec/ {print $2}')
      p99=$(printf '%s\n' "$out" | awk '/ 99%/ {print $2}')
      cpu=$(awk -v t=$((after - before)) -v n="$reqs" -v hz="$TCK" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }')
      echo "| $which | $c | $round | $rps | $p99 | $cpu |" >> "$WORK/rounds.md"
    done
    kill $pid; wait $pid 2>/dev/null || true
  done
done
echo "A = $A"; echo "B = $B"; echo
cat "$WORK/rounds.md"; echo
echo "| binary | c | median req/s | median p99 ms | median CPU µs/req |"
echo "|---|---|---|---|---|"
# wrk prints 850.00us, 19.57ms or 1.02s.
to_ms() { awk '{ v = $1 + 0; if ($1 ~ /us$/) v /= 1000; else if ($1 ~ /[0-9]s$/) v *= 1000; printf "%.2f\n", v }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for which in A B; do for c in $CONNS; do
  rows=$(grep "^| $which | $c |" "$WORK/rounds.md")
  rps=$(printf '%s\n' "$rows" | awk -F'|' '{ print $5 + 0 }' | median)
  p99=$(printf '%s\n' "$rows" | awk -F'|' '{ gsub(/ /, "", $6); print $6 }' | to_ms | median)
  cpu=$(printf '%s\n' "$rows" | awk -F'|' '{ print $7 + 0 }' | median)
  echo "| $which | $c | $rps | $p99 | $cpu |"
done; done
