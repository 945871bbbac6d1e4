#!/usr/bin/env bash
# Chaos soak of the daemon (see Sources/BackstopSoak): a faulty origin, a token endpoint that rotates refresh
# tokens, expires access tokens every 4 s and fails 10% of calls, periodic revocations, and concurrent clients
# mixing GET/HEAD/PUT/POST/DELETE with bodies and disconnects. Everything runs on 127.0.0.1.
#
#   bash scripts/soak.sh                     # 5 minutes, 64 clients, debug build
#   bash scripts/soak.sh --duration 30       # the CI-sized run
#   bash scripts/soak.sh --release           # against a release build (--static-swift-stdlib)
#
# Other arguments go to backstop-soak: --seed N, --concurrency N, --json. Exits 1 when a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
flags=()
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --release) flags=(-c release --static-swift-stdlib) ;;
    *) args+=("$1") ;;
  esac
  shift
done
swift build "${flags[@]}" --product backstop >&2
swift build "${flags[@]}" --product backstop-soak >&2
bin=$(swift build "${flags[@]}" --show-bin-path)
ulimit -n 8192 2>/dev/null || true
exec "$bin/backstop-soak" --binary "$bin/backstop" --assert "${args[@]}"
