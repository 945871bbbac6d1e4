#!/usr/bin/env bash
# The release build: the one command the README, the Dockerfile, bench/ and `scripts/soak.sh --release` use, so
# every release binary is built the same way (and one build cache serves them all).
#
#   bash scripts/build-release.sh --product backstop          # -> .build/release/backstop
#   bash scripts/build-release.sh --show-bin-path
#
# --static-swift-stdlib: the Swift runtime and Foundation linked in; the image and hosts need only libcurl
#   (scripts/check-runtime-deps.sh), and the daemon is ~5 MiB smaller in memory.
# -enforce-exclusivity=unchecked: no run-time exclusivity checks in any module, SwiftNIO's included, as the Swift
#   standard library itself is built. They cost ~4.5 % of the instructions per proxied request (docs/performance.md,
#   "Release build"). The debug build that the tests, the fuzz replay and CI's soak run keeps every check, so an
#   overlapping access still traps there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec swift build -c release --static-swift-stdlib -Xswiftc -enforce-exclusivity=unchecked "$@"
