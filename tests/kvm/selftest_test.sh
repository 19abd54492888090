#!/bin/bash
# Checks `deja selftest` through the binary: on this host (host DEJA) or inside the nested-KVM guest (nested DEJA HARNESS BUILD_DIR).
# Exit 0 must mean every check passed and "available (pmu ...)"; exit 10 must mean exactly one FAILED check with a
# reason, every later check skipped, and "unavailable". Where the environment is known (no /dev/kvm here; no PMU
# in the nested guest), the failing check must be the one that environment lacks.
set -u
mode=$1 deja=$2
out=$(mktemp) && trap 'rm -f "$out"' EXIT
case $mode in
  host) "$deja" selftest >"$out" 2>&1; status=$? ;;
  nested) "$3" --timeout 600 --share "$4" -- "$deja" selftest >"$out" 2>&1; status=$? ;;
  *) echo "usage: $0 host DEJA | nested DEJA HARNESS BUILD_DIR" >&2; exit 2 ;;
esac
cat "$out"
fail() { echo "selftest_test ($mode): $*" >&2; exit 1; }

grep -q '^/dev/kvm usable ' "$out" || fail "no '/dev/kvm usable' check in the output"
failed=$(grep -c ' FAILED: .' "$out")
if [ "$status" -eq 0 ]; then
  [ "$failed" -eq 0 ] || fail "exit 0 but a check FAILED"
  grep -q 'available (pmu [a-z0-9-]* raw 0x[0-9a-f]* skid [0-9]*)' "$out" || fail "exit 0 without naming the counter"
  [ "$mode" = nested ] && fail "the nested guest has no PMU, yet selftest passed"
  exit 0
fi
[ "$status" -eq 10 ] || fail "exit status $status, expected 0 or 10"
[ "$failed" -eq 1 ] || fail "exit 10 needs exactly one FAILED check with a reason, found $failed"
grep -q '^precise interrupt timing on KVM: unavailable' "$out" || fail "no 'unavailable' verdict"
# Every check after the failed one is skipped.
awk '/ FAILED: /{seen=1; next} seen && /^precise/{exit} seen && !/ skipped/{bad=1} END{exit bad}' "$out" ||
  fail "a check after the failed one was not skipped"

if [ ! -e /dev/kvm ] && [ "$mode" = host ]; then
  grep -q '^/dev/kvm usable  *FAILED: /dev/kvm does not exist' "$out" || fail "expected check (a) to fail here"
fi
if [ "$mode" = nested ]; then
  grep -q '^/dev/kvm usable  *ok' "$out" || fail "the nested guest has /dev/kvm; check (a) must pass there"
  # QEMU's emulated CPU is not in the table; were it, opening the counter would fail for lack of a PMU.
  grep -Eq '^(CPU microarchitecture  *FAILED: .*(not supported|not in deja.s PMU table)|counter opens  *FAILED: perf_event_open .*failed)' "$out" ||
    fail "the nested guest must fail at the CPU table or at opening the counter, with the reason"
fi
exit 0
