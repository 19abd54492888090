#!/usr/bin/env bash
# Linux record/replay on KVM (issue 13): the workload recorded on KVM with kvm-deja replays exactly on KVM and on interp; a stock-KVM recording's replay reports where it diverges.
#   tests/linux/kvm_deja_rr.sh SOURCE_DIR BUILD_DIR [DOWNLOAD_MIB]
# Inside the nested harness with the kvm-deja module: tests/linux/linux_test.py --record-replay-workload on KVM (boot,
# shell session over serial, virtio disk write/sync/read back, hwrng, an HTTP download through slirp, tsc-spin;
# a state digest every 4096 events, a quarter of the default, so the replays compare the whole state more often;
# replayed on KVM, every event checked); then the same boot recorded with the module's exits turned off
# (DEJA_KVM_DEJA=off, i.e. stock KVM), whose replay must fail with status 6 naming the event. Back on this host the
# KVM trace is replayed on interp: `replay OK` and the serial output byte-identical.
set -euo pipefail
source_dir="$(realpath "$1")" build="$(realpath "$2")" mib="${3:-2}"

if [[ "${DEJA_KVM_RR_INSIDE:-}" != 1 ]]; then
  work="$(mktemp -d /tmp/deja-kvm-deja-rr.XXXXXX)"
  trap 'rm -rf "$work"' EXIT
  status=0
  DEJA_KVM_RR_INSIDE=1 "$source_dir/scripts/kvm-nested.sh" --kvm-deja --kvm-deja-cache "$build/kvm-deja" \
    --timeout 2400 --share "$build" --share "$work" -- "$0" "$source_dir" "$build" "$mib" "$work" || status=$?
  [[ $status -eq 0 ]] || { echo "FAIL: the nested half ended with status $status"; exit 1; }
  set +e
  "$build/deja" replay --backend interp "$work/workload.trace" --serial-out "$work/interp.out" 2>"$work/interp.err"
  status=$?
  set -e
  tail -1 "$work/interp.err"
  if [[ $status -ne 1 ]] || ! grep -q "replay OK" "$work/interp.err"; then
    # Say where, and whether the reference executor agrees (a fast-path defect) or not (a model difference).
    grep -A12 "replay diverged" "$work/interp.err" | head -30
    set +e
    "$build/deja" replay --backend interp --interp-mode reference "$work/workload.trace" --serial-out /dev/null \
      2>"$work/interp-reference.err"
    echo "the reference executor's replay: status $?: $(grep -m1 "replay OK\|replay diverged" "$work/interp-reference.err")"
    echo "FAIL: the KVM trace's replay on interp ended with status $status"
    exit 1
  fi
  cmp "$work/workload-recorded.out" "$work/interp.out" ||
    { echo "FAIL: interp's replayed serial output differs from the KVM recording's"; exit 1; }
  echo "PASS: recorded on KVM (kvm-deja), replayed exactly on KVM and on interp; stock KVM's divergence reported"
  exit 0
fi

# Inside the nested guest: $4 is the shared directory the outer half reads afterwards.
work="$4"
python3 "$source_dir/tests/linux/linux_test.py" --deja "$build/deja" --backend kvm --guest-dir "$build/guest-linux" \
  --record-replay-workload --download-mib "$mib" --digest-every 4096 --keep "$work"

# Stock KVM: the TSC is read live, so the recording says up front it cannot be exact, and its replay must stop at
# the first event that disagrees, never claim success.
export DEJA_LINUX_GUEST_DIR="$build/guest-linux"
set +e
DEJA_KVM_DEJA=off "$build/deja" record --backend kvm --linux --append deja.script=ready -o "$work/stock.trace" \
  --serial-out /dev/null 2>"$work/stock-record.err"
DEJA_KVM_DEJA=off "$build/deja" replay "$work/stock.trace" --serial-out /dev/null 2>"$work/stock-replay.err"
status=$?
set -e
grep -q "warning: RDTSC is not trapped" "$work/stock-record.err" ||
  { echo "FAIL: recording on stock KVM did not warn up front:"; cat "$work/stock-record.err"; exit 1; }
events="$("$build/deja" inspect "$work/stock.trace" | awk '$1 == "events" {print $2; exit}')"
where="$(grep -m1 -o "replay diverged at event [0-9]*" "$work/stock-replay.err" || true)"
[[ $status -eq 6 && -n "$where" ]] ||
  { echo "FAIL: the stock-KVM replay ended with status $status:"; tail -5 "$work/stock-replay.err"; exit 1; }
echo "stock KVM: $where of ${events:-?} recorded; status 6"
