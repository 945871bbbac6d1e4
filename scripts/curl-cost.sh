#!/usr/bin/env bash
# libcurl's instructions per transfer, the way Backstop drives it but without Backstop (bench/curl-cost.c: one
# reused easy handle, one keep-alive connection to a 1-worker nginx origin), counted by callgrind as the difference
# between 1,200 and 200 transfers, so start-up and the first connection cancel out. Rows: the whole URL per
# transfer (CURLOPT_URL) or a URL handle with only path and query set (CURLOPT_CURLU), each with Backstop's bare
# head and with the realistic head (12 app headers and a 1 KiB bearer token; scripts/lib/realistic.sh).
# docs/performance.md#what-libcurl-costs-per-transfer explains the figures.
#
#   bash scripts/curl-cost.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
for tool in gcc valgrind nginx; do
  command -v $tool >/dev/null || { echo "curl-cost.sh: $tool not found (apt-get install gcc valgrind nginx)" >&2; exit 2; }
done
WORK=$(mktemp -d); PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
PORT=${CURL_COST_PORT:-18760}
source scripts/lib/ab-origin.sh
source scripts/lib/realistic.sh
REALISTIC=0 start_ab_origin "$WORK" "$PORT" $((PORT + 1)) 0 0; PIDS+=("$ORIGIN_PID")
wait_port "$PORT" 10 || { echo "curl-cost.sh: the origin did not start" >&2; exit 1; }
gcc -O2 -o "$WORK/curl-cost" bench/curl-cost.c -lcurl
{
  echo "Host: 127.0.0.1:$PORT"
  echo "User-Agent: LegacyBilling/4.12.7 (Java/17.0.9; Linux amd64) okhttp/4.12.0"
  echo "Accept: application/json, text/plain;q=0.9, */*;q=0.8"
  echo "Accept-Language: en-GB,en;q=0.9,de;q=0.8"
  echo "Content-Type: application/json; charset=utf-8"
  echo "X-Request-Id: 3f2b9c1e-7a4d-4e5f-9b8a-1c2d3e4f5a6b"
  echo "X-Correlation-Id: billing-run-2026-11-25T18:00:00Z-000042"
  echo "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
  echo "X-Forwarded-For: 10.20.30.40"
  echo "X-Tenant: acme-eu-west-1"
  echo "Cache-Control: no-cache"
  echo "Cookie: session=9f8e7d6c5b4a39281706f5e4d3c2b1a0; locale=en_GB; feature_flags=new-invoices,bulk-export,sso-v2; _ga=GA1.2.1234567890.1700000000"
  echo "X-Api-Version: 2024-06-01"
  echo "Via: 1.1 backstop"
  echo "Authorization: Bearer $(realistic_token)"
} > "$WORK/realistic.txt"
echo "Host: 127.0.0.1:$PORT" > "$WORK/bare.txt"
count() {  # MODE N HEADERS: instructions of the whole run
  valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" "$WORK/curl-cost" "$1" "$2" "$PORT" "$3" 2>&1 \
    | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
echo "| way | head | head bytes | instructions per transfer |"
echo "|---|---|---:|---:|"
for head in bare realistic; do
  for mode in URL CURLU; do
    low=$(count $mode 200 "$WORK/$head.txt"); high=$(count $mode 1200 "$WORK/$head.txt")
    printf '| %s | %s | %s | %s |\n' "$mode" "$head" "$(wc -c < "$WORK/$head.txt")" \
      "$(awk -v a="$low" -v b="$high" 'BEGIN { printf "%.1fk", (b - a) / 1000 / 1000 }')"
  done
done
