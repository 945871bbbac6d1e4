# Sourced by scripts/ab.sh, scripts/instructions.sh, scripts/stale-connections.sh, scripts/syscalls.sh and scripts/listener-cost.sh: the one origin and proxy config they measure against
# (bench/outage.sh uses its wait_port).
#
# start_ab_origin WORK ORIGIN_PORT PROXY_PORT TLS H1
#   Starts a 1-worker nginx origin on 127.0.0.1:ORIGIN_PORT answering a 100-byte body (TLS=1: HTTPS with a CA made
#   for the run, offering h2 and HTTP/1.1 by ALPN, or HTTP/1.1 only with H1=1) and writes WORK/proxy.yaml: Backstop
#   on PROXY_PORT forwarding to it, retrying as the benchmarks do. Sets ORIGIN_PID. Returns 1 when openssl fails.
#   ORIGIN_KEEPALIVE_TIMEOUT: how long the origin keeps an idle connection (nginx's default, 75s, unless set).
#   REALISTIC=1: the upstream injects a 1 KiB bearer token (`auth: static` from a keychain in WORK/keychain; seed it
#   with `seed_realistic_keychain BIN WORK/proxy.yaml` from scripts/lib/realistic.sh before starting a binary).
#   PROXY_HTTP2=true|false: the upstream's `tls.http2` (unset: the default).
#   PROXY_TIMEOUTS="connect: 60s, ...": the upstream's `timeouts` (unset: the defaults).
#   TRACING_ENDPOINT=URL: a `tracing` section exporting every request's spans there (sample_ratio 1).
start_ab_origin() {
  local work=$1 origin=$2 proxy=$3 tls=$4 h1=$5
  local scheme=http listen_flags="" tls_directives="" upstream_tls="" auth="" keychain=""
  mkdir -p "$work/origin"
  if [ "$tls" = 1 ]; then
    source "$(dirname "${BASH_SOURCE[0]}")/origin-cert.sh"
    make_origin_cert "$work" IP:127.0.0.1 || return 1
    scheme=https
    listen_flags="ssl http2"  # h2 offered by ALPN, as most TLS APIs do
    [ "$h1" = 1 ] && listen_flags="ssl"
    tls_directives="ssl_certificate $work/origin.pem; ssl_certificate_key $work/origin.key; ssl_session_cache shared:SSL:10m;"
    upstream_tls=", tls: {ca_file: \"$work/ca.pem\"${PROXY_HTTP2:+, http2: $PROXY_HTTP2}}"
  fi
  if [ "${REALISTIC:-0}" = 1 ]; then
    mkdir -p "$work/keychain"
    keychain="keychain: {path: $work/keychain/keychain.bkc, key_file: $work/keychain/keychain.key}"
    auth=", auth: {type: static, entry: bench/token}"
  fi
  cat > "$work/origin/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $work/origin/nginx.pid; error_log $work/origin/error.log warn;
events { worker_connections 8192; }
http { access_log off; keepalive_requests 1000000; keepalive_timeout ${ORIGIN_KEEPALIVE_TIMEOUT:-75s};
  client_body_temp_path $work/origin/b; proxy_temp_path $work/origin/p; fastcgi_temp_path $work/origin/f;
  uwsgi_temp_path $work/origin/u; scgi_temp_path $work/origin/s;
  server { listen 127.0.0.1:$origin $listen_flags backlog=4096; $tls_directives
    location / { default_type text/plain; return 200 "ab origin 100B body xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; } } }
CONF
  nginx -c "$work/origin/nginx.conf" -p "$work/origin" & ORIGIN_PID=$!
  cat > "$work/proxy.yaml" <<CONF
version: 1
listen: [127.0.0.1:$proxy]
log: {level: warning, access_log: false}
$keychain
${TRACING_ENDPOINT:+tracing: {otlp_endpoint: \"$TRACING_ENDPOINT\", sample_ratio: 1\}}
upstreams: [{name: origin, match: {hosts: [127.0.0.1]}, url: "$scheme://127.0.0.1:$origin", retry: {attempts: 4, on: [connect-failure, 502, 503, 504]}${PROXY_TIMEOUTS:+, timeouts: {$PROXY_TIMEOUTS\}}$upstream_tls$auth}]
CONF
}

# wait_port PORT [SECONDS]: until 127.0.0.1:PORT accepts connections (5 s at most unless given); 1 if it never does.
wait_port() {
  local tries=$(( ${2:-5} * 20 ))
  for _ in $(seq 1 "$tries"); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done
  return 1
}

# start_nginx_proxy WORK ORIGIN_PORT PROXY_PORT SCHEME [LOCATION_DIRECTIVES] [MORE_SERVERS]
#   A 1-worker nginx proxying 127.0.0.1:PROXY_PORT to the origin at SCHEME://127.0.0.1:ORIGIN_PORT (keep-alive
#   upstream), to compare Backstop with (scripts/syscalls.sh, scripts/listener-cost.sh). LOCATION_DIRECTIVES go in its
#   `location /` (a token, TLS verification); MORE_SERVERS are further `server { … }` blocks. Sets NGINX_PROXY_PID (the
#   master; its worker is `pgrep -P`).
start_nginx_proxy() {
  local work=$1 origin=$2 port=$3 scheme=$4 directives=${5:-} servers=${6:-}
  mkdir -p "$work/nginx"
  cat > "$work/nginx/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $work/nginx/nginx.pid; error_log $work/nginx/error.log warn;
events { worker_connections 8192; }
http { access_log off; keepalive_requests 1000000;
  client_body_temp_path $work/nginx/b; proxy_temp_path $work/nginx/p; fastcgi_temp_path $work/nginx/f;
  uwsgi_temp_path $work/nginx/u; scgi_temp_path $work/nginx/s;
  upstream origin { server 127.0.0.1:$origin; keepalive 512; }
  server { listen 127.0.0.1:$port; location / { proxy_pass $scheme://origin; proxy_http_version 1.1;
    proxy_set_header Connection ""; $directives } }
  $servers }
CONF
  nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" & NGINX_PROXY_PID=$!
}
