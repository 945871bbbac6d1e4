#!/usr/bin/env bash
# Backstop benchmark on one machine, everything on 127.0.0.1. Run from the repository root:
#
#   bash bench/run.sh            # full run (~4.5 min): Markdown table on stdout, progress on stderr
#   bash bench/run.sh --quick    # smoke run (~1 min): 1 round, 3 s per wrk run
#   bash bench/run.sh --json     # one JSON object on stdout instead of the table
#   bash bench/run.sh --strict   # exit 1 when a target is missed
#
# Scenarios:
#  1. happy path: nginx origin (1 worker, 100-byte `return 200`) direct vs Backstop vs Backstop injecting a
#     static bearer token vs Backstop in front of the same origin over TLS (a CA made for the run, verified), once
#     offering h2 and once HTTP/1.1 only; wrk -t1 at c=32 and c=256, interleaved rounds; req/s, p50/p99,
#     Backstop CPU per request (utime+stime from /proc/PID/stat) and RSS idle / under load.
#  2. 1,000 idle keep-alive client connections (bench/idle_clients.py): Backstop RSS.
#  3. a 64 MiB response streamed through Backstop with curl (fast and rate-limited client): MiB/s, peak RSS.
#  4. retry storm: bench/flaky_origin.py answers 503 with probability 0.5 and 1.0; the default retry budget (docs/reference/config.md)
#     (ratio 0.2, min_per_second 10), attempts 4: origin attempts per client request and client success rate.
#  5. only with TLS_SOAK_MIN=N: a fresh Backstop in front of the h2 TLS origin under wrk -c64 for one minute of
#     warm-up and N measured minutes; RSS after each minute, and the growth from the first to the last (target:
#     none beyond 1 MiB). `TLS_SOAK_MIN=10 bash bench/run.sh --quick` is the 10-minute memory run.
#
# Env: BACKSTOP_BIN (default .build/release/backstop, built if missing), BENCH_PORT_BASE (18380; uses
#      BASE..BASE+13), TLS_SOAK_MIN (0), OUT (results folder; default a new /tmp/backstop-bench.* that is kept), ROUNDS, DUR.
# Needs wrk, nginx, curl (installed with apt-get when missing) and python3. Every process started here is
# stopped by its PID on exit.
set -euo pipefail

JSON=0 QUICK=0 STRICT=0
for arg in "$@"; do
  case $arg in
    --json) JSON=1 ;;
    --quick) QUICK=1 ;;
    --strict) STRICT=1 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done

ROOT=$(pwd)
BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ "$QUICK" = 1 ]; then ROUNDS=${ROUNDS:-1}; DUR=${DUR:-3s}; WARM=1s; MODE=quick
else ROUNDS=${ROUNDS:-3}; DUR=${DUR:-10s}; WARM=2s; MODE=full; fi
CONNS="32 256"
BASE=${BENCH_PORT_BASE:-18380}
P_ORIGIN=$BASE P_PLAIN=$((BASE + 1)) P_BEARER=$((BASE + 2)) P_IDLE=$((BASE + 3)) P_STREAM=$((BASE + 4))
P_TLS_H2=$((BASE + 5)) P_TLS_H1=$((BASE + 6)) P_ORIGIN_H2=$((BASE + 7)) P_ORIGIN_H1=$((BASE + 8))
P_FLAKY=$((BASE + 10)) P_RETRY=$((BASE + 11)) P_RETRY_ADMIN=$((BASE + 12)) P_TLS_SOAK=$((BASE + 13))
TLS_SOAK_MIN=${TLS_SOAK_MIN:-0}
HOST_HEADER="Host: origin.test"
BIG_BYTES=$((64 * 1024 * 1024))

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------- tools
need_apt=()
command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)
command -v nginx >/dev/null 2>&1 || need_apt+=(nginx)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
if [ "${#need_apt[@]}" -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 || die "missing ${need_apt[*]} and no apt-get: install them first"
  log "installing ${need_apt[*]} with apt-get (no service is started)"
  export DEBIAN_FRONTEND=noninteractive
  created_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then  # exit 101 keeps postinst scripts from starting nginx
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; created_policy=1
  fi
  apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${need_apt[@]}" >&2 || {
    [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d; die "apt-get install ${need_apt[*]} failed"; }
  if [ "$created_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
command -v python3 >/dev/null 2>&1 || die "python3 is needed"

BACKSTOP=${BACKSTOP_BIN:-$ROOT/.build/release/backstop}
if [ ! -x "$BACKSTOP" ]; then
  [ -n "${BACKSTOP_BIN:-}" ] && die "BACKSTOP_BIN=$BACKSTOP is not executable"
  [ -f "$ROOT/Package.swift" ] || die "run from the repository root, or set BACKSTOP_BIN"
  log "building backstop (release)"
  # The lock only serializes builds with other users of this tree; without flock, build directly.
  if command -v flock >/dev/null 2>&1; then
    flock /tmp/backstop-build.lock bash "$ROOT/scripts/build-release.sh" --product backstop >&2
  else
    bash "$ROOT/scripts/build-release.sh" --product backstop >&2
  fi
fi

ulimit -n 8192 2>/dev/null || ulimit -n 4096 2>/dev/null || true   # 1,000 clients + upstream conns
HZ=$(getconf CLK_TCK)
OUT=${OUT:-$(mktemp -d -t backstop-bench.XXXXXX)}
mkdir -p "$OUT"; chmod 755 "$OUT"   # nginx workers read the rendered config and the big file
: > "$OUT/happy.jsonl"; : > "$OUT/stream.jsonl"; : > "$OUT/retry.jsonl"; : > "$OUT/commands.txt"
REPORT=(python3 "$BENCH/report.py")

# ---------------------------------------------------------------- process bookkeeping
declare -A PID=()
STARTED=()
WRK_PID=""   # the wrk run in the background of one_run, if any

stop_pid() {  # TERM, then KILL after 5 s
  local p=$1 i
  kill -TERM "$p" 2>/dev/null || return 0
  for i in $(seq 1 50); do
    kill -0 "$p" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
}
stop() {  # stop NAME
  local p=${PID[$1]:-}
  if [ -n "$p" ]; then stop_pid "$p"; fi
  unset "PID[$1]"
}
cleanup() {
  local p
  if [ -n "$WRK_PID" ]; then stop_pid "$WRK_PID"; fi
  for p in "${STARTED[@]:-}"; do
    if [ -n "$p" ]; then stop_pid "$p"; fi
  done
  rm -f "$OUT/big.bin"   # 64 MiB, not worth keeping
  rm -rf "$OUT/bearer/keychain.key"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

quote() {  # shell-quote one word for the command listing
  case $1 in
    *[!A-Za-z0-9_./:=@%+,-]*|'') printf "'%s'" "${1//\'/\'\\\'\'}" ;;
    *) printf '%s' "$1" ;;
  esac
}
note_cmd() {  # remember a command line once, in order of first use
  local line="" w
  for w in "$@"; do line+="$(quote "$w") "; done
  line=${line% }
  grep -qxF -- "$line" "$OUT/commands.txt" || printf '%s\n' "$line" >> "$OUT/commands.txt"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {  # until 127.0.0.1:$1 accepts and process $2 still runs (10 s at most)
  local i
  for i in $(seq 1 100); do
    kill -0 "$2" 2>/dev/null || return 1
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# start NAME PORT CMD... : run in the background, log to $OUT/NAME.log, wait for PORT
start() {
  local name=$1 port=$2; shift 2
  port_free "$port" || die "port $port is already in use (set BENCH_PORT_BASE)"
  note_cmd "$@"
  "$@" > "$OUT/$name.log" 2>&1 &
  PID[$name]=$!
  STARTED+=("$!")
  wait_port "$port" "$!" || { tail -20 "$OUT/$name.log" >&2; die "$name did not start on port $port"; }
}

status_kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
cpu_ticks() {  # utime+stime of a process and its direct children (nginx master + worker)
  local s=0 p
  for p in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null || true); do
    [ -r "/proc/$p/stat" ] || continue
    s=$((s + $(awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$p/stat")))
  done
  echo "$s"
}

# ---------------------------------------------------------------- configs
write_config() {  # write_config FILE LISTEN UPSTREAM_URL [extra upstream YAML lines via stdin]
  local file=$1 listen=$2 url=$3
  {
    echo "version: 1"
    echo "listen: [127.0.0.1:$listen]"
    echo "log: {level: warning, access_log: false}"
    cat   # optional top-level sections (keychain, admin) before upstreams
    echo "upstreams:"
    echo "  - name: origin"
    echo "    match: {hosts: [origin.test]}"
    echo "    url: $url"
  } > "$file"
}
retry_happy() {
  cat <<'EOF'
    retry:
      attempts: 4
      on: [connect-failure, 502, 503, 504]
EOF
}

ORIGIN_URL="http://127.0.0.1:$P_ORIGIN"
write_config "$OUT/plain.yaml" "$P_PLAIN" "$ORIGIN_URL" < /dev/null
retry_happy >> "$OUT/plain.yaml"

mkdir -p "$OUT/bearer"
write_config "$OUT/bearer.yaml" "$P_BEARER" "$ORIGIN_URL" <<EOF
keychain:
  path: $OUT/bearer/keychain.bkc
  key_file: $OUT/bearer/keychain.key
EOF
{ retry_happy; echo "    auth: {type: static, entry: bench/token, header: Authorization, scheme: Bearer}"; } \
  >> "$OUT/bearer.yaml"
rm -f "$OUT/bearer/keychain.bkc" "$OUT/bearer/keychain.key"
note_cmd "$BACKSTOP" keychain init --config "$OUT/bearer.yaml"
"$BACKSTOP" keychain init --config "$OUT/bearer.yaml" > "$OUT/keychain.log" 2>&1 \
  || { cat "$OUT/keychain.log" >&2; die "keychain init failed"; }
printf "printf tok | %s keychain set bench/token --config %s\n" "$(quote "$BACKSTOP")" "$(quote "$OUT/bearer.yaml")" \
  >> "$OUT/commands.txt"
printf 'tok' | "$BACKSTOP" keychain set bench/token --config "$OUT/bearer.yaml" >> "$OUT/keychain.log" 2>&1 \
  || { cat "$OUT/keychain.log" >&2; die "keychain set failed"; }

# The TLS origin's CA and certificate (127.0.0.1), made for this run.
mkdir -p "$OUT/origin"
source "$BENCH/../scripts/lib/origin-cert.sh"
make_origin_cert "$OUT/origin" IP:127.0.0.1 || die "openssl cannot make the origin certificate"
for variant in h2 h1; do
  port=$P_TLS_H2 origin=$P_ORIGIN_H2
  [ $variant = h1 ] && port=$P_TLS_H1 origin=$P_ORIGIN_H1
  write_config "$OUT/tls-$variant.yaml" "$port" "https://127.0.0.1:$origin" < /dev/null
  { retry_happy; echo "    tls: {ca_file: $OUT/origin/ca.pem}"; } >> "$OUT/tls-$variant.yaml"
done

for f in plain bearer tls-h2 tls-h1; do
  "$BACKSTOP" check --config "$OUT/$f.yaml" > "$OUT/check-$f.log" 2>&1 \
    || { cat "$OUT/check-$f.log" >&2; die "backstop check $f.yaml failed"; }
done

head -c "$BIG_BYTES" /dev/zero > "$OUT/big.bin"
sed -e "s#@LISTEN@#$P_ORIGIN#g" -e "s#@TLS_H2@#$P_ORIGIN_H2#g" -e "s#@TLS_H1@#$P_ORIGIN_H1#g" \
  -e "s#@RUNDIR@#$OUT/origin#g" -e "s#@BIGFILE@#$OUT/big.bin#g" \
  "$BENCH/origin.nginx.conf.in" > "$OUT/origin/nginx.conf"

python3 - "$OUT/meta.json" <<EOF
import json, os, sys
json.dump({
  "mode": "$MODE", "date_utc": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "nproc": $(nproc),
  "loadavg_before": "$(cut -d' ' -f1-3 /proc/loadavg)", "rounds": $ROUNDS, "dur": "$DUR", "conns": "$CONNS",
  "backstop": "$BACKSTOP", "backstop_version": "$("$BACKSTOP" version 2>/dev/null | awk '{print $NF}')",
  "wrk": "$(wrk -v 2>&1 | sed -n 1p | awk '{print $2}')", "nginx": "$(nginx -v 2>&1 | cut -d/ -f2)",
  "out": "$OUT", "ports": {"origin": $P_ORIGIN, "backstop": $P_PLAIN, "backstop_bearer": $P_BEARER,
  "idle": $P_IDLE, "stream": $P_STREAM, "flaky": $P_FLAKY, "retry": $P_RETRY}}, open(sys.argv[1], "w"))
EOF
log "results folder: $OUT"

# ---------------------------------------------------------------- 1. happy path
log "1. happy path: origin :$P_ORIGIN, backstop :$P_PLAIN, backstop-bearer :$P_BEARER"
start origin "$P_ORIGIN" nginx -p "$OUT/origin" -c "$OUT/origin/nginx.conf" -e "$OUT/origin/error.log"
start backstop "$P_PLAIN" "$BACKSTOP" run --config "$OUT/plain.yaml"
start backstop-bearer "$P_BEARER" "$BACKSTOP" run --config "$OUT/bearer.yaml"
start backstop-tls-h2 "$P_TLS_H2" "$BACKSTOP" run --config "$OUT/tls-h2.yaml"
start backstop-tls-h1 "$P_TLS_H1" "$BACKSTOP" run --config "$OUT/tls-h1.yaml"
declare -A PORT=([direct]=$P_ORIGIN [backstop]=$P_PLAIN [backstop-bearer]=$P_BEARER [backstop-tls-h2]=$P_TLS_H2
                 [backstop-tls-h1]=$P_TLS_H1)
declare -A IDLE_RSS=() IDLE_ANON=()
TARGETS=(direct backstop backstop-bearer backstop-tls-h2 backstop-tls-h1)

for t in "${TARGETS[@]}"; do
  args=(curl -s -o "$OUT/body.$t" -w '%{http_code}' --max-time 10 -H "$HOST_HEADER" "http://127.0.0.1:${PORT[$t]}/")
  note_cmd "${args[@]}"
  code=$("${args[@]}" || true)
  [ "$code" = 200 ] || die "sanity $t: HTTP $code"
  if [ "$t" != direct ]; then
    IDLE_RSS[$t]=$(status_kb "${PID[$t]}" VmRSS); IDLE_ANON[$t]=$(status_kb "${PID[$t]}" RssAnon)
  fi
  log "sanity $t: HTTP $code, $(wc -c < "$OUT/body.$t") bytes${IDLE_RSS[$t]:+, idle RSS ${IDLE_RSS[$t]} KiB}"
done
auth=$(curl -s --max-time 10 -H "$HOST_HEADER" "http://127.0.0.1:$P_BEARER/echo-auth" || true)
[ "$auth" = "Bearer tok" ] || die "bearer upstream did not inject the token (origin saw '$auth')"
auth=$(curl -s --max-time 10 -H "$HOST_HEADER" "http://127.0.0.1:$P_PLAIN/echo-auth" || true)
[ -z "$auth" ] || die "plain upstream sent an Authorization header"

# one_run ROUND CONNS TARGET DURATION RECORD
one_run() {
  local round=$1 c=$2 t=$3 dur=$4 rec=$5 p="" c0=0 c1=0 o0 o1 peak=0 r wpid i out
  out="$OUT/wrk/r${round}_c${c}_$t.txt"
  mkdir -p "$OUT/wrk"
  [ "$t" = direct ] || p=${PID[$t]}
  local args=(wrk -t1 -c"$c" -d"$dur" --latency -s "$BENCH/wrk_report.lua" -H "$HOST_HEADER"
              "http://127.0.0.1:${PORT[$t]}/")
  note_cmd "${args[@]}"
  if [ -n "$p" ]; then c0=$(cpu_ticks "$p"); fi
  o0=$(cpu_ticks "${PID[origin]}")
  "${args[@]}" > "$out" 2>&1 &
  wpid=$!; WRK_PID=$wpid
  for i in $(seq 1 600); do   # one RSS sample a second, bounded well beyond any -d
    kill -0 "$wpid" 2>/dev/null || break
    sleep 1
    if [ -n "$p" ]; then
      r=$(status_kb "$p" VmRSS)
      if [ "${r:-0}" -gt "$peak" ]; then peak=$r; fi
    fi
  done
  wait "$wpid" || true
  WRK_PID=""
  o1=$(cpu_ticks "${PID[origin]}")
  [ "$rec" = 1 ] || return 0
  grep -q '^WRKJSON ' "$out" || { log "no wrk summary for $t c=$c round $round"; cat "$out" >&2; return 0; }
  if [ -n "$p" ]; then
    c1=$(cpu_ticks "$p")
    "${REPORT[@]}" record "$OUT/happy.jsonl" round="$round" conns="$c" target="$t" wrk="$out" hz="$HZ" \
      cpu_ticks=$((c1 - c0)) origin_ticks=$((o1 - o0)) rss_idle_kb="${IDLE_RSS[$t]}" rss_idle_anon_kb="${IDLE_ANON[$t]}" \
      rss_end_kb="$(status_kb "$p" VmRSS)" rss_max_kb="$peak" hwm_kb="$(status_kb "$p" VmHWM)"
  else
    "${REPORT[@]}" record "$OUT/happy.jsonl" round="$round" conns="$c" target="$t" wrk="$out" hz="$HZ" \
      origin_ticks=$((o1 - o0))
  fi
  log "r$round c=$c $t: $(sed -n 's/^Requests\/sec: *//p' "$out") req/s"
}

log "warm-up ($WARM each, not recorded)"
for t in "${TARGETS[@]}"; do one_run 0 32 "$t" "$WARM" 0; done
n=${#TARGETS[@]}
for round in $(seq 1 "$ROUNDS"); do
  for c in $CONNS; do
    for i in $(seq 0 $((n - 1))); do   # rotate the order so no target always runs first
      one_run "$round" "$c" "${TARGETS[$(( (i + round - 1) % n ))]}" "$DUR" 1
      sleep 1
    done
  done
done
stop backstop; stop backstop-bearer; stop backstop-tls-h2; stop backstop-tls-h1

# ---------------------------------------------------------------- 2. idle connections
log "2. 1,000 idle keep-alive connections to a fresh backstop :$P_IDLE"
write_config "$OUT/idle.yaml" "$P_IDLE" "$ORIGIN_URL" < /dev/null
retry_happy >> "$OUT/idle.yaml"
start backstop-idle "$P_IDLE" "$BACKSTOP" run --config "$OUT/idle.yaml"
sleep 0.5
args=(python3 "$BENCH/idle_clients.py" "$P_IDLE" 1000 "${PID[backstop-idle]}" origin.test 3)
note_cmd "${args[@]}"
"${args[@]}" > "$OUT/idle.json" 2> "$OUT/idle_clients.log" || { cat "$OUT/idle_clients.log" >&2; die "idle_clients.py failed"; }
kill -0 "${PID[backstop-idle]}" 2>/dev/null || die "backstop exited during the idle-connection test"
log "idle: $(cat "$OUT/idle.json")"
stop backstop-idle

# ---------------------------------------------------------------- 3. 64 MiB response
for rate in "" 32M; do
  log "3. 64 MiB response through a fresh backstop :$P_STREAM${rate:+, client limited to $rate/s}"
  write_config "$OUT/stream.yaml" "$P_STREAM" "$ORIGIN_URL" < /dev/null
  retry_happy >> "$OUT/stream.yaml"
  start backstop-stream "$P_STREAM" "$BACKSTOP" run --config "$OUT/stream.yaml"
  sleep 0.5
  hwm0=$(status_kb "${PID[backstop-stream]}" VmHWM)
  args=(curl -s -o /dev/null -w '%{http_code} %{size_download} %{speed_download}\n' --max-time 120)
  if [ -n "$rate" ]; then args+=(--limit-rate "$rate"); fi
  args+=(-H "$HOST_HEADER" "http://127.0.0.1:$P_STREAM/big")
  note_cmd "${args[@]}"
  read -r code size speed < <("${args[@]}" || echo "000 0 0")
  "${REPORT[@]}" record "$OUT/stream.jsonl" limit_rate="\"$rate\"" code="$code" size="$size" speed_Bps="$speed" \
    expected_size="$BIG_BYTES" hwm_before_kb="$hwm0" hwm_kb="$(status_kb "${PID[backstop-stream]}" VmHWM)"
  log "stream: HTTP $code, $size bytes, $speed B/s, VmHWM $(status_kb "${PID[backstop-stream]}" VmHWM) KiB"
  stop backstop-stream
done

# ---------------------------------------------------------------- 5. long TLS run (opt-in)
if [ "$TLS_SOAK_MIN" -gt 0 ]; then
  log "5. $TLS_SOAK_MIN minutes (+1 warm-up) at c=64 through a fresh backstop :$P_TLS_SOAK to the h2 TLS origin"
  sed "s#127.0.0.1:$P_TLS_H2]#127.0.0.1:$P_TLS_SOAK]#" "$OUT/tls-h2.yaml" > "$OUT/tls-soak.yaml"
  start backstop-tls-soak "$P_TLS_SOAK" "$BACKSTOP" run --config "$OUT/tls-soak.yaml"
  : > "$OUT/tls-soak.tsv"
  for minute in $(seq 0 "$TLS_SOAK_MIN"); do
    out="$OUT/wrk/tls_soak_$minute.txt"
    args=(wrk -t1 -c64 -d60s -H "$HOST_HEADER" "http://127.0.0.1:$P_TLS_SOAK/")
    [ "$minute" = 0 ] && note_cmd "${args[@]}"
    "${args[@]}" > "$out" 2>&1 || true
    kill -0 "${PID[backstop-tls-soak]}" 2>/dev/null || die "backstop exited during the long TLS run"
    rss=$(status_kb "${PID[backstop-tls-soak]}" VmRSS)
    printf '%s\t%s\t%s\t%s\n' "$minute" "$rss" "$(sed -n 's/^Requests\/sec: *//p' "$out")" \
      "$(awk '/Non-2xx|Socket errors/' "$out" | tr -s ' ' | tr '\n' ';')" >> "$OUT/tls-soak.tsv"
    log "tls soak minute $minute: RSS $rss KiB, $(sed -n 's/^Requests\/sec: *//p' "$out") req/s"
  done
  stop backstop-tls-soak
fi
stop origin

# ---------------------------------------------------------------- 4. retry storm
RETRY_DUR=$DUR
for p in 0.5 1.0; do
  log "4. retry storm: flaky origin :$P_FLAKY with p(503)=$p, fresh backstop :$P_RETRY"
  start flaky "$P_FLAKY" python3 "$BENCH/flaky_origin.py" "$P_FLAKY" "$p" 42
  write_config "$OUT/retry.yaml" "$P_RETRY" "http://127.0.0.1:$P_FLAKY" <<EOF
admin: {listen: 127.0.0.1:$P_RETRY_ADMIN}
EOF
  cat >> "$OUT/retry.yaml" <<'EOF'
    retry:
      attempts: 4
      on: [connect-failure, 502, 503, 504]
      backoff: {base: 10ms}
      budget: {ratio: 0.2, min_per_second: 10}
EOF
  start backstop-retry "$P_RETRY" "$BACKSTOP" run --config "$OUT/retry.yaml"
  stats0=$(curl -s --max-time 5 "http://127.0.0.1:$P_FLAKY/__stats")
  out="$OUT/wrk/retry_p$p.txt"
  args=(wrk -t1 -c8 -d"$RETRY_DUR" --latency -s "$BENCH/wrk_report.lua" -H "$HOST_HEADER"
        "http://127.0.0.1:$P_RETRY/")
  note_cmd "${args[@]}"
  "${args[@]}" > "$out" 2>&1 || true
  sleep 0.5   # let retries still in flight reach the origin
  stats1=$(curl -s --max-time 5 "http://127.0.0.1:$P_FLAKY/__stats")
  note_cmd curl -s "http://127.0.0.1:$P_RETRY_ADMIN/metrics"
  exhausted=$(curl -s --max-time 5 "http://127.0.0.1:$P_RETRY_ADMIN/metrics" \
    | awk '/^backstop_retry_budget_exhausted_total/ {s += $NF} END {print s + 0}')
  grep -q '^WRKJSON ' "$out" || { cat "$out" >&2; die "no wrk summary for the retry storm p=$p"; }
  "${REPORT[@]}" record "$OUT/retry.jsonl" p="$p" wrk="$out" stats_before="$stats0" stats_after="$stats1" \
    ratio=0.2 min_per_second=10 conns=8 budget_exhausted="$exhausted"
  log "storm p=$p: origin $stats0 -> $stats1, budget exhausted $exhausted"
  stop backstop-retry; stop flaky
done

# ---------------------------------------------------------------- report
python3 - "$OUT/meta.json" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); m["loadavg_after"] = sys.argv[2]; json.dump(m, open(sys.argv[1], "w"))
EOF
if [ "$JSON" = 1 ]; then "${REPORT[@]}" summary "$OUT" --json; else "${REPORT[@]}" summary "$OUT"; fi
if [ "$TLS_SOAK_MIN" -gt 0 ] && [ "$JSON" != 1 ]; then
  echo
  echo "### Long TLS run: RSS after each minute at c=64 (minute 0 is the warm-up)"
  echo
  echo "| minute | RSS KiB | req/s | errors |"
  echo "|---:|---:|---:|---|"
  awk -F'\t' '{printf "| %s | %s | %s | %s |\n", $1, $2, $3, ($4 == "" ? "none" : $4)}' "$OUT/tls-soak.tsv"
  awk -F'\t' 'NR == 2 {first = $2} {last = $2} END {
    growth = last - first
    printf "\nRSS growth from minute 1 to minute %d: %+d KiB (target: at most 1024) — %s\n", NR - 1, growth,
      (growth <= 1024 ? "met" : "MISSED") }' "$OUT/tls-soak.tsv"
fi
log "done; configs and raw outputs: $OUT"
if [ "$STRICT" = 1 ]; then
  failed=$("${REPORT[@]}" summary "$OUT" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["targets_failed"])')
  [ "$failed" = 0 ] || exit 1
fi
