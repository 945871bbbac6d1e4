#!/usr/bin/env bash
# Instructions per proxied request of one or more Backstop binaries, counted by callgrind (deterministic enough to
# see a 1-2 % change that wall-clock A/Bs lose in noise; docs/performance.md#measuring-a-change). Each binary runs
# under valgrind in front of one nginx origin on 127.0.0.1; after a warm-up, counting is switched on for a fixed
# window of one wrk run, and the instructions of every thread of the proxy are divided by the requests it admitted
# in that window.
#
#   bash scripts/instructions.sh BINARY [BINARY ...]        # c=8, 10 s measured each after 5 s (IR_WARM=N)
#   CONNS=32 DUR=10s bash scripts/instructions.sh OLD NEW
#   IR_TLS=1 bash scripts/instructions.sh ...                # TLS origin offering h2 (CA made for the run)
#   IR_TLS=1 IR_H1=1 bash scripts/instructions.sh ...        # ... offering HTTP/1.1 only
#   IR_TLS=1 IR_HTTP2=false bash scripts/instructions.sh ... # origin offering h2, Backstop set to `tls.http2: false`
#   IR_REALISTIC=1 bash scripts/instructions.sh ...          # app-like request heads (12 headers, ~700 bytes) and a
#                                                            # 1 KiB bearer token injected (auth: static)
#   IR_TRACING=1 bash scripts/instructions.sh ...            # tracing on at sample_ratio 1, spans exported to
#                                                            # scripts/otlp-receiver.py (needs opentelemetry-proto)
#   KEEP_PROFILES=DIR IR_DUMP_INSTR=1 bash scripts/instructions.sh ...  # keep the profiles, costs and calls per
#                                                            # instruction address (scripts/callsites.py reads them)
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,18p' "$0"; exit 2; }
for tool in wrk nginx valgrind callgrind_control strip; do
  command -v $tool >/dev/null || { echo "instructions.sh: $tool not found (apt-get install wrk nginx valgrind)" >&2; exit 2; }
done
CONNS=${CONNS:-8}; DUR=${DUR:-10s}; WARM=${IR_WARM:-5}; BASE=${IR_PORT_BASE:-18700}
WORK=$(mktemp -d); PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
ORIGIN=$BASE PROXY=$((BASE + 1)) COLLECTOR=$((BASE + 2))
if [ "${IR_TRACING:-0}" = 1 ]; then
  python3 "$(dirname "${BASH_SOURCE[0]}")/otlp-receiver.py" $COLLECTOR >/dev/null & PIDS+=("$!")
  export TRACING_ENDPOINT=http://127.0.0.1:$COLLECTOR
fi
source "$(dirname "${BASH_SOURCE[0]}")/lib/ab-origin.sh"
source "$(dirname "${BASH_SOURCE[0]}")/lib/realistic.sh"
REPORT=$(dirname "${BASH_SOURCE[0]}")/../bench/wrk_report.lua
export REALISTIC=${IR_REALISTIC:-0} WRK_REALISTIC=${IR_REALISTIC:-0}
export PROXY_HTTP2=${IR_HTTP2:-}
# Under valgrind a proxy runs ~50x slower: at high concurrency the first TLS handshakes outlast the 2 s connect
# timeout, and the endpoint would be ejected (every later answer an error). Timeouts sized for valgrind.
export PROXY_TIMEOUTS="connect: 60s, per_try: 120s, total: 300s"
start_ab_origin "$WORK" "$ORIGIN" "$PROXY" "${IR_TLS:-0}" "${IR_H1:-0}" \
  || { echo "instructions.sh: openssl cannot make the origin certificate" >&2; exit 2; }
PIDS+=("$ORIGIN_PID")
wait_port $ORIGIN 60
# Requests counted: the calls callgrind saw to the one function every request head goes through once
# (`ProxyHandler.admit`), so the count and the instructions cover the same instants exactly.
REQUEST_FUNCTION=14BackstopServer12ProxyHandlerC5admityyAA17ClientRequestHeadVF
calls_to() {  # FILE...: calls of REQUEST_FUNCTION (cfn= names are compressed: "(id) name" once, then "(id)")
  awk -v want="$REQUEST_FUNCTION" '
    /^c?fn=\(/ { line = substr($0, index($0, "=") + 1); id = line; sub(/\).*/, ")", id)
                  if (index(line, ") ")) names[id] = substr(line, index(line, ") ") + 2)
                  if ($0 ~ /^cfn=/) callee = names[id] }
    /^calls=/   { if (index(callee, want)) { split(substr($0, 7), c, " "); n += c[1] } }
    END         { print n + 0 }' "$@"
}
[ "${IR_TRACING:-0}" = 1 ] && { wait_port $COLLECTOR 30 || { echo "instructions.sh: the OTLP receiver did not start" >&2; exit 2; }; }
echo "| binary | c | requests counted | instructions | instructions per request |"
echo "|---|---:|---:|---:|---:|"
n=0
for given in "$@"; do
  # valgrind 3.19 cannot read the DWARF 5 the Swift toolchain writes: count a stripped copy.
  n=$((n + 1)); bin="$WORK/backstop-$n"; strip --strip-debug -o "$bin" "$(readlink -f "$given")"
  if [ "$REALISTIC" = 1 ]; then
    rm -f "$WORK"/keychain/*
    seed_realistic_keychain "$bin" "$WORK/proxy.yaml" || { echo "instructions.sh: $given cannot make the keychain" >&2; exit 2; }
  fi
  valgrind --tool=callgrind --instr-atstart=no $([ "${IR_DUMP_INSTR:-0}" = 1 ] && echo --dump-instr=yes) \
    --callgrind-out-file="$WORK/cg.%p" "$bin" run --config "$WORK/proxy.yaml" \
    2>"$WORK/valgrind.log" & pid=$!
  wait_port $PROXY 60  # valgrind starts slowly
  # One wrk run: its connections are made during the warm-up, so the counted window holds requests only (two runs
  # counted the second one's connects and the first one's closes: ~7k per request at c=32, more at c=256).
  wrk -t1 -c"$CONNS" --timeout 60s -d$((WARM + ${DUR%s} + 3))s -s "$REPORT" -H "Host: 127.0.0.1:$PROXY" \
    "http://127.0.0.1:$PROXY/" > "$WORK/wrk.out" 2>&1 & wrk_pid=$!
  sleep "$WARM"
  callgrind_control -z $pid >/dev/null; callgrind_control -i on $pid >/dev/null
  sleep "${DUR%s}"
  callgrind_control -i off $pid >/dev/null; callgrind_control -d $pid >/dev/null
  wait $wrk_pid || true
  out=$(cat "$WORK/wrk.out")
  reqs=$(calls_to "$WORK"/cg.$pid.*)
  [ "$reqs" -gt 0 ] || { echo "instructions.sh: no call to $REQUEST_FUNCTION counted: renamed or inlined?" >&2; exit 1; }
  # A run whose answers were errors measured the error path: say so rather than print a figure that looks good.
  bad=$(printf '%s\n' "$out" | sed -n 's/.*"non2xx3xx":\([0-9]*\).*/\1/p')
  [ "${bad:-0}" = 0 ] || { echo "instructions.sh: $given answered $bad requests with an error status" >&2; grep -v "^==" "$WORK/valgrind.log" | cut -c1-300 | sort | uniq -c | sort -rn | head -5 >&2; }
  kill $pid; wait $pid 2>/dev/null || true
  total=0
  for f in "$WORK"/cg.$pid*; do
    ir=$(awk '/^totals:/ {print $2}' "$f" | head -1)
    total=$((total + ${ir:-0}))
  done
  [ -n "${KEEP_PROFILES:-}" ] && cp "$WORK"/cg.$pid.* "$KEEP_PROFILES/$(basename "$given").callgrind" 2>/dev/null; rm -f "$WORK"/cg.$pid*
  printf '| %s | %s | %s | %s | %s |\n' "$given" "$CONNS" "$reqs" "$total" "$(awk -v t=$total -v n=$reqs 'BEGIN { printf "%.0f", t / n }')"
done
