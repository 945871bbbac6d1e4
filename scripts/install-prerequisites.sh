#!/usr/bin/env bash
# Installs what building and testing Backstop needs on Debian 12, besides the Swift toolchain (README, "Set up"):
# the one list, used by the README and by CI (.ci/run). Needs root (prefix sudo otherwise); installs only what is
# missing, so a second run does nothing.
#
#   bash scripts/install-prerequisites.sh
#
# libcurl4-openssl-dev: the transport; openssl, curl: test certificates and clients; ca-certificates: TLS;
# publicsuffix: the Public Suffix List that `check` reads for intercepting upstreams; systemd: systemd-analyze
# (scripts/check-systemd.sh); binutils: readelf and strip (scripts/check-runtime-deps.sh, `install -s`);
# postgresql: the fleet token store's tests start throwaway clusters of Debian's server; iproute2: test network
# namespaces; python3 and its requests module: the offline tour's origins and the interception test's Python client;
# prometheus: promtool for deploy/prometheus (23 s to install); chromium: the status page opened in a real browser
# (56 s); the Python OTLP protobuf classes: the tracing tests decode what Backstop exports with them.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
for pkg in libcurl4-openssl-dev openssl ca-certificates curl publicsuffix systemd binutils postgresql iproute2 python3 \
    prometheus chromium; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Python `requests` for whichever python3 is first on PATH (pip reaches a pyenv Python; Debian's package only the
# system one).
python3 -c 'import requests' 2>/dev/null || python3 -m pip install -q requests 2>/dev/null \
    || { apt-get install -y -qq python3-requests >/dev/null; need+=(python3-requests); }
python3 -c 'import opentelemetry.proto.collector.trace.v1.trace_service_pb2' 2>/dev/null \
    || python3 -m pip install -q opentelemetry-proto
echo "prerequisites: ok${need[*]:+ (installed: ${need[*]})}"
