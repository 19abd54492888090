#!/bin/bash
# Checks `deja selftest` through the binary, on this host (host DEJA GUESTS) or inside the nested-KVM guest
# (nested DEJA GUESTS HARNESS BUILD_DIR): first the KVM usability check, then the PMU check.
# - Usability: where the environment is known, the right check fails: no /dev/kvm here -> "/dev/kvm opens";
#   a kvm-pvm /dev/kvm (/sys/module/kvm_pvm) -> "guest code runs natively" (emulated CPL0) and "SSE executes";
#   inside the nested harness every check passes and `deja run` without --backend picks KVM. Where KVM is
#   unusable, `deja run --backend kvm` is refused (status 2) naming the reason and `deja run` runs on interp.
# - PMU (only where KVM is usable): exit 0 must mean every check passed and "available (pmu ...)"; exit 10 must
#   mean exactly one FAILED check with a reason, every later check skipped, and "unavailable".
set -u
mode=$1 deja=$2 guests=$3
out=$(mktemp) runout=$(mktemp) && trap 'rm -f "$out" "$runout"' EXIT
fail() { echo "selftest_test ($mode): $*" >&2; exit 1; }
case $mode in
  host|nested) ;;
  *) echo "usage: $0 host DEJA GUESTS | nested DEJA GUESTS HARNESS BUILD_DIR" >&2; exit 2 ;;
esac
harness_args=("${@:4}")
run_here() { if [ "$mode" = host ]; then "$@" >"$runout" 2>&1; else "${harness_args[0]}" --timeout 600 --share "${harness_args[1]}" -- "$@" >"$runout" 2>&1; fi; }

# One nested boot runs everything the nested half needs: the selftest, then a run without --backend.
if [ "$mode" = nested ]; then
  script=$(mktemp "${harness_args[1]}/selftest-nested.XXXXXX.sh")
  trap 'rm -f "$out" "$runout" "$script"' EXIT
  cat >"$script" <<INNER
#!/bin/bash
"$deja" selftest; echo "selftest-status=\$?"
"$deja" run --stats "$guests/hello.elf"; echo "run-status=\$?"
INNER
  chmod +x "$script"
  run_here "$script"
  cat "$runout"
  status=$(grep -o 'selftest-status=[0-9]*' "$runout" | cut -d= -f2)
  sed -n '1,/selftest-status=/p' "$runout" >"$out"
  grep -q 'run-status=1' "$runout" || fail "hello did not run to success without --backend"
  grep -q 'using the software CPU' "$runout" && fail "deja fell back to the software CPU inside the nested harness"
  grep -q 'deja: backend kvm' "$runout" || fail "deja run without --backend did not pick KVM"
  grep -q "^deja: note: using KVM (--backend kvm): this host's KVM passed deja's usability check" "$runout" ||
    fail "deja run without --backend must say in one line that it uses KVM and why"
else
  "$deja" selftest >"$out" 2>&1; status=$?
  cat "$out"
fi

grep -q '^/dev/kvm opens ' "$out" || fail "no '/dev/kvm opens' check in the output"
grep -Eq '^KVM for deja: (usable|UNUSABLE).*\(checked in [0-9.]+ ms\)' "$out" || fail "no usability verdict with its time"

if [ "$mode" = host ] && [ ! -e /dev/kvm ]; then
  grep -q '^/dev/kvm opens  *FAILED: /dev/kvm does not exist' "$out" || fail "no /dev/kvm here: '/dev/kvm opens' must fail"
elif [ "$mode" = host ] && [ -e /sys/module/kvm_pvm ]; then
  grep -q '^guest code runs natively  *FAILED: guest kernel code is emulated' "$out" ||
    fail "kvm-pvm here: 'guest code runs natively' must fail, naming the emulation"
  grep -q '^SSE executes  *FAILED: SSE stops with an emulation failure' "$out" ||
    fail "kvm-pvm here: 'SSE executes' must fail with the emulation failure"
elif [ "$mode" = nested ]; then
  [ "$(grep -c ' FAILED' <(sed -n '/^\/dev\/kvm opens/,/^KVM for deja/p' "$out"))" -eq 0 ] ||
    fail "every usability check must pass inside the nested harness"
fi

if grep -q '^KVM for deja: UNUSABLE' "$out"; then
  [ "$status" -eq 10 ] || fail "KVM unusable but selftest exit status $status, expected 10"
  grep -q 'precise interrupt timing' "$out" && fail "the PMU checks ran although KVM is unusable"
  [ "$mode" = host ] || exit 0
  "$deja" run --backend kvm "$guests/hello.elf" >"$runout" 2>&1; s=$?
  [ "$s" -eq 2 ] || { cat "$runout"; fail "deja run --backend kvm exited $s on an unusable KVM, expected 2"; }
  grep -q 'deja: --backend kvm: .*use --backend interp' "$runout" || { cat "$runout"; fail "the refusal names no reason"; }
  "$deja" run "$guests/hello.elf" >"$runout" 2>&1; s=$?
  [ "$s" -eq 1 ] || { cat "$runout"; fail "deja run without --backend exited $s, expected the guest's 1"; }
  [ "$(grep -c '^deja: note: using the software CPU (--backend interp): ' "$runout")" -eq 1 ] ||
    { cat "$runout"; fail "deja run must say in one line why it uses the software CPU"; }
  exit 0
fi

# KVM is usable: the PMU half.
pmu=$(sed -n '/^KVM for deja/,$p' "$out")
failed=$(grep -c ' FAILED: .' <<<"$pmu")
if [ "$status" -eq 0 ]; then
  [ "$failed" -eq 0 ] || fail "exit 0 but a check FAILED"
  grep -q 'available (pmu [a-z0-9-]* raw 0x[0-9a-f]* skid [0-9]*)' <<<"$pmu" || fail "exit 0 without naming the counter"
  [ "$mode" = nested ] && fail "the nested guest has no PMU, yet selftest passed"
  exit 0
fi
[ "$status" -eq 10 ] || fail "exit status $status, expected 0 or 10"
[ "$failed" -eq 1 ] || fail "exit 10 needs exactly one FAILED PMU check with a reason, found $failed"
grep -q '^precise interrupt timing on KVM: unavailable' <<<"$pmu" || fail "no 'unavailable' verdict"
awk '/ FAILED: /{seen=1; next} seen && /^precise/{exit} seen && !/ skipped/{bad=1} END{exit bad}' <<<"$pmu" ||
  fail "a check after the failed one was not skipped"
if [ "$mode" = nested ]; then
  # QEMU's emulated CPU is not in the table; were it, opening the counter would fail for lack of a PMU.
  grep -Eq '^(CPU microarchitecture  *FAILED: .*(not supported|not in deja.s PMU table)|counter opens  *FAILED: perf_event_open .*failed)' <<<"$pmu" ||
    fail "the nested guest must fail at the CPU table or at opening the counter, with the reason"
fi
exit 0
