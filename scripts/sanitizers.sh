#!/usr/bin/env bash
# The test suite under ThreadSanitizer and AddressSanitizer (each in its own scratch path, so the normal
# .build stays untouched). Prints one line per sanitizer: tests run, issues, sanitizer reports, wall time.
#
#   bash scripts/sanitizers.sh              # thread, then address
#   bash scripts/sanitizers.sh address      # one of them
#
# Extra arguments after `--` go to `swift test` (e.g. `-- --filter Retry`). Exits 1 when a run fails or a
# sanitizer reports anything.
set -euo pipefail
cd "$(dirname "$0")/.."

sanitizers=()
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    thread|address) sanitizers+=("$1") ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [thread|address ...] [-- swift test arguments]" >&2; exit 2 ;;
  esac
  shift
done
[ ${#sanitizers[@]} -gt 0 ] || sanitizers=(thread address)

status=0
printf '| sanitizer | tests | result | reports | wall |\n|---|---|---|---|---|\n'
for sanitizer in "${sanitizers[@]}"; do
  scratch=.build-$sanitizer
  mkdir -p "$scratch"
  log=$scratch/sanitizer-test.log
  start=$(date +%s)
  set +e
  # halt_on_error=0 lets a run finish and count every report; the log keeps them whole.
  # Under ThreadSanitizer everything runs several times slower: the 5,000-connection flood then keeps clients
  # waiting in a full accept backlog past the kernel's SYN-ACK retries, and the kernel resets them. That is the
  # kernel's limit, not the daemon's; the flood runs in the plain suite and under AddressSanitizer.
  skip=()
  [ "$sanitizer" = thread ] && skip=(--skip connectionFlood)
  # scripts/tsan-suppressions.txt lists the reports that are the Swift runtime's, each with why.
  TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan-suppressions.txt" \
    ASAN_OPTIONS="detect_leaks=0 halt_on_error=0" \
    swift test --no-parallel --sanitize="$sanitizer" --scratch-path "$scratch" "${skip[@]}" "${extra[@]}" >"$log" 2>&1
  rc=$?
  set -e
  wall=$(( $(date +%s) - start ))
  summary=$(grep -E 'Test run with [0-9]+ tests' "$log" | tail -1 | sed 's/^[^T]*//')
  reports=$(grep -cE '^(WARNING: ThreadSanitizer|==[0-9]+==ERROR: AddressSanitizer|SUMMARY: (Thread|Address)Sanitizer)' "$log" || true)
  result=pass
  if [ "$rc" != 0 ] || [ "$reports" != 0 ]; then
    result="FAIL (exit $rc, see $log)"
    status=1
  fi
  printf '| %s | %s | %s | %s | %ss |\n' "$sanitizer" "${summary:-?}" "$result" "$reports" "$wall"
done
exit $status
