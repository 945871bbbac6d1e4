#!/usr/bin/env bash
# Chaos soak of the daemon (see Sources/BackstopSoak): a faulty origin, a token endpoint that rotates refresh
# tokens, expires access tokens every 4 s and fails 10% of calls, periodic revocations, and concurrent clients
# mixing GET/HEAD/PUT/POST/DELETE with bodies and disconnects. Everything runs on 127.0.0.1.
#
#   bash scripts/soak.sh                     # 5 minutes, 64 clients, debug build
#   bash scripts/soak.sh --duration 30       # the CI-sized run
#   bash scripts/soak.sh --release           # against the release build (scripts/build-release.sh)
#
# Other arguments go to backstop-soak: --seed N, --concurrency N, --json. Exits 1 when a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
build=(swift build)
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --release) build=(bash scripts/build-release.sh) ;;
    *) args+=("$1") ;;
  esac
  shift
done
"${build[@]}" --product backstop >&2
"${build[@]}" --product backstop-soak >&2
bin=$("${build[@]}" --show-bin-path)
ulimit -n 8192 2>/dev/null || true
exec "$bin/backstop-soak" --binary "$bin/backstop" --assert "${args[@]}"
