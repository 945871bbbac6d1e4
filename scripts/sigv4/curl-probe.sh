#!/usr/bin/env bash
# What libcurl's own CURLOPT_AWS_SIGV4 signs (docs/reference/aws-sigv4.md#why-not-libcurls-curlopt_aws_sigv4):
# builds curl-probe.c against the system libcurl, runs it against a local origin that records each request and
# checks it with botocore, and prints one JSON line per request. Needs gcc, libcurl headers and botocore.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'kill "$origin" 2>/dev/null || true; rm -rf "$work"' EXIT
gcc -O1 -o "$work/probe" "$here/curl-probe.c" -lcurl
port=${PORT:-18777}
PYTHONPATH=$here python3 "$here/curl-probe-origin.py" "$port" >"$work/origin.log" &
origin=$!
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
"$work/probe" "$port"
kill "$origin"; wait "$origin" 2>/dev/null || true
cat "$work/origin.log"
