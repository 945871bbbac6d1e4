# Sourced by bench/peers.sh and bench/outage.sh: the configuration writers both use for the proxies Backstop is
# compared with, so every comparison runs nginx, HAProxy and Envoy set up the same way. Each prints to stdout.

# nginx_head DIR ERROR_LEVEL [ACCESS_LOG]: nginx.conf up to the inside of `http {`: one worker in the foreground,
# its pid, error log and temp files in DIR, keep-alive for 75 s and a million requests. ACCESS_LOG: the access log
# directives (default `access_log off;`). The caller writes the `http` block's servers and closes it.
nginx_head() {
  cat <<CONF
worker_processes 1; daemon off; user root root; pid $1/nginx.pid; error_log $1/error.log $2;
events { worker_connections 8192; }
http {
  ${3:-access_log off;} keepalive_requests 1000000; keepalive_timeout 75s;
  client_body_temp_path $1/b; proxy_temp_path $1/p; fastcgi_temp_path $1/f; uwsgi_temp_path $1/u; scgi_temp_path $1/s;
CONF
}

# haproxy_config PORT SERVER_TIMEOUT RETRY_LINES BACKEND_LINES: one thread, keep-alive, a 1 s connect timeout and
# 3 retries; RETRY_LINES (`retry-on …`, `option redispatch …`) in `defaults`; a frontend on 127.0.0.1:PORT whose
# backend `be` is BACKEND_LINES.
haproxy_config() {
  cat <<CONF
global
  nbthread 1
  maxconn 4000
defaults
  mode http
  option http-keep-alive
  timeout connect 1s
  timeout client 30s
  timeout server $2
  timeout http-keep-alive 75s
  retries 3
$3
frontend fe
  bind 127.0.0.1:$1
  default_backend be
backend be
$4
CONF
}

# envoy_config PORT VHOST_LINE ROUTE CLUSTER_LINES: a listener on 127.0.0.1:PORT (admin on PORT+1000) sending every
# path to one cluster: ROUTE is the route's `route:` value (flow YAML), VHOST_LINE an extra line of the virtual host
# (may be empty), CLUSTER_LINES the cluster's own lines after its `name:` (indented four spaces).
envoy_config() {
  cat <<CONF
admin: { address: { socket_address: { address: 127.0.0.1, port_value: $(($1 + 1000)) } } }
static_resources:
  listeners:
  - name: main
    address: { socket_address: { address: 127.0.0.1, port_value: $1 } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          codec_type: AUTO
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              $2
              routes:
              - match: { prefix: "/" }
                route: $3
          http_filters:
          - name: envoy.filters.http.router
            typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }
  clusters:
  - name: upstream
$4
CONF
}

# backstop_head PORT: the start of a Backstop config listening on 127.0.0.1:PORT, warnings only, no access log.
backstop_head() {
  printf 'version: 1\nlisten: [127.0.0.1:%s]\nlog: {level: warning, access_log: false}\n' "$1"
}
