#!/usr/bin/env bash
# libFuzzer runs of the parsers that face hostile input (Sources/BackstopFuzz): config, retry-hint, token, upgrade-response, request-decoder,
# keychain, request, response-head, http1-response, connect, ca-bundle, path, queued-head, key-file, ... (every folder of fuzz/corpus is a target). Builds backstop-fuzz with -sanitize=fuzzer,address in its own scratch path (.build-fuzz),
# then runs each target for a bounded time, starting from the seeds in fuzz/corpus/<target> (the grown corpus
# stays in .build-fuzz/corpus, out of git). A crash is saved to fuzz/crashes/<target>-*, the run stops, and the
# script exits 1: turn the input into a unit test, fix, re-run.
#
#   bash scripts/fuzz.sh                      # every target, 60 s each
#   bash scripts/fuzz.sh --seconds 300 token  # one target, 5 minutes
#   bash scripts/fuzz.sh --replay             # no fuzzing: replay seeds and saved crashes through a plain build
#
# Prints one line per target: executions, coverage (libFuzzer's "cov" edges and "ft" features), corpus size.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
replay=0
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift ;;
    --replay) replay=1 ;;
    -*) echo "usage: $0 [--seconds N] [--replay] [TARGET ...]   (targets: $(ls fuzz/corpus | tr '\n' ' '))" >&2; exit 2 ;;
    *) [ -d "fuzz/corpus/$1" ] || { echo "$0: no target '$1' (targets: $(ls fuzz/corpus | tr '\n' ' '))" >&2; exit 2; }
       targets+=("$1") ;;
  esac
  shift
done
# Every target has a seed folder; a target without one would never run.
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(ls fuzz/corpus)

if [ "$replay" = 1 ]; then
  swift build --product backstop-fuzz >&2
  bin=$(swift build --show-bin-path)/backstop-fuzz
  for target in "${targets[@]}"; do
    inputs=(fuzz/corpus/"$target")
    for crash in fuzz/crashes/"$target"-*; do [ -e "$crash" ] && inputs+=("$crash"); done
    BACKSTOP_FUZZ_TARGET=$target "$bin" "${inputs[@]}"
  done
  exit 0
fi

scratch=.build-fuzz
# Linked with lld: gold (the default) fails on the sanitizer-instrumented objects with an internal error.
lld=$(dirname "$(readlink -f "$(command -v swift)")")/ld.lld
[ -x "$lld" ] || lld=$(command -v ld.lld) || { echo "fuzz.sh: ld.lld not found (it ships with the Swift toolchain)" >&2; exit 1; }
mkdir -p "$scratch"
printf '{"schemaVersion": "1.0", "linker": {"path": "%s"}}\n' "$lld" >"$scratch/toolset.json"
build=(swift build -c release --scratch-path "$scratch" --product backstop-fuzz --toolset "$scratch/toolset.json"
       -Xswiftc -sanitize=fuzzer,address -Xswiftc -DBACKSTOP_FUZZER)
"${build[@]}" >&2
bin=$("${build[@]}" --show-bin-path)/backstop-fuzz

mkdir -p fuzz/crashes
status=0
printf '| target | seconds | executions | exec/s | cov | ft | corpus | result |\n|---|---|---|---|---|---|---|---|\n'
for target in "${targets[@]}"; do
  corpus=$scratch/corpus/$target
  mkdir -p "$corpus"
  log=$scratch/fuzz-$target.log
  set +e
  # The Swift runtime's backtracer would read memory ASan reports as invalid: let libFuzzer report a trap.
  BACKSTOP_FUZZ_TARGET=$target ASAN_OPTIONS=detect_leaks=0 SWIFT_BACKTRACE=enable=no "$bin" "$corpus" fuzz/corpus/"$target" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
    -artifact_prefix=fuzz/crashes/"$target"- >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  files=$(find "$corpus" -type f | wc -l)
  result=ok
  if [ "$rc" != 0 ]; then
    result="CRASH (see $log)"
    status=1
  fi
  printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$target" "$seconds" "${execs:-?}" "${rate:-?}" \
    "${cov:-?}" "${ft:-?}" "$files" "$result"
done
exit $status
