#!/usr/bin/env bash
# Several vCPUs on KVM (issue 23): a 2-vCPU Linux boot and shell session recorded on KVM with kvm-deja replays exactly on KVM and on interp; SMP guests cross both ways; stock KVM warns up front.
#   tests/linux/kvm_smp_rr.sh SOURCE_DIR BUILD_DIR
# Inside the nested harness with the kvm-deja module (PAUSE exits, so a spinning vCPU yields):
#   - tests/linux/linux_test.py --record-replay-smp --shell on KVM: the bundled Linux guest on pc-apic with 2 vCPUs
#     boots ("smp: Brought up 1 node, 2 CPUs"), /scripts/smp is typed into its shell over serial (smp-race's threads
#     on both CPUs), and the recording replays on KVM, every event checked;
#   - smp-ipi and smp-counter recorded on KVM with 2 vCPUs replay on KVM; their exit-sync recordings on interp (made
#     on this host first) replay on KVM;
#   - with DEJA_KVM_DEJA=off (stock KVM) a 2-vCPU recording warns before the guest runs that vCPUs cannot stop at
#     PAUSE, and a plain run still completes.
# Back on this host every KVM trace replays on interp: `replay OK`, the serial output byte-identical.
set -euo pipefail
source_dir="$(realpath "$1")" build="$(realpath "$2")"
guests="$build/guest-tests"
smp_guests=("smp-ipi" "smp-counter increments=20000")

ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

replay_ok() {  # label, trace, expected serial output, deja replay options...
  local label="$1" trace="$2" expected="$3" status=0 start
  shift 3
  start=$(date +%s%N)
  "$build/deja" replay "$@" "$trace" --serial-out "$trace.replayed" 2>"$trace.replay.err" || status=$?
  if [[ $status -ne 1 ]] || ! grep -q "replay OK" "$trace.replay.err"; then
    echo "FAIL: $label: the replay ended with status $status:"; tail -15 "$trace.replay.err"; exit 1
  fi
  cmp -s "$expected" "$trace.replayed" || { echo "FAIL: $label: the replayed serial output differs"; exit 1; }
  echo "ok   $label: $(grep -o "replay OK: [0-9]* events" "$trace.replay.err") in $(ms_since "$start") ms"
}

if [[ "${DEJA_KVM_SMP_INSIDE:-}" != 1 ]]; then
  work="$(mktemp -d /tmp/deja-kvm-smp-rr.XXXXXX)"
  # Kept when the test fails: the traces to find a divergence in.
  trap 'status=$?; if [[ $status -eq 0 ]]; then rm -rf "$work"; else echo "(kept $work)"; fi' EXIT
  # The interp recordings the nested half replays on KVM: exit-synchronous, as KVM replays them, and with a CPU model
  # KVM provides (this host's interp default may be x86-64-v3).
  for spec in "${smp_guests[@]}"; do
    read -r guest append <<<"$spec"
    "$build/deja" record --backend interp --cpu x86-64-v2 --progress exit-sync --machine pc-apic --cpus 2 \
      --schedule-seed 3 \
      ${append:+--append "$append"} -o "$work/$guest-interp.trace" --serial-out "$work/$guest-interp.out" \
      "$guests/$guest.elf" 2>/dev/null || [[ $? -eq 1 ]]
  done
  status=0
  DEJA_KVM_SMP_INSIDE=1 "$source_dir/scripts/kvm-nested.sh" --kvm-deja --kvm-deja-cache "$build/kvm-deja" \
    --timeout 3000 --share "$build" --share "$work" -- "$0" "$source_dir" "$build" "$work" || status=$?
  [[ $status -eq 0 ]] || { echo "FAIL: the nested half ended with status $status"; exit 1; }
  replay_ok "Linux, 2 vCPUs, recorded on KVM: replay on interp" "$work/linux/smp2-seed1.trace" \
    "$work/linux/smp2-seed1.out" --backend interp
  for spec in "${smp_guests[@]}"; do
    read -r guest _ <<<"$spec"
    replay_ok "$guest, 2 vCPUs, recorded on KVM: replay on interp" "$work/$guest-kvm.trace" "$work/$guest-kvm.out" \
      --backend interp
  done
  echo "PASS: 2-vCPU Linux and SMP guests recorded on KVM (kvm-deja) replay on KVM and on interp, interp's on KVM"
  exit 0
fi

# Inside the nested guest: $3 is the shared directory the outer half reads afterwards.
work="$3"
# lpj: the delay-loop calibration's result for the CPU model's TSC (2 GHz, HZ 250), so that an AP does not calibrate:
# calibrate_delay_converge() spins on jiffies with neither an exit nor a PAUSE, and exit-synchronous progress cannot
# preempt such a spin (docs/smp.md, "On KVM").
lpj="lpj=8000000"
mkdir -p "$work/linux"
# The peer of the figures: the same workload (boot, then /scripts/smp from the command line), neither recorded nor
# replayed.
start=$(date +%s%N)
DEJA_LINUX_GUEST_DIR="$build/guest-linux" "$build/deja" run --backend kvm --linux --machine pc-apic --cpus 2 \
  --schedule-seed 1 --append "deja.script=smp $lpj" --serial-out "$work/plain.out" 2>/dev/null || true
grep -q "smp-race: 2 threads" "$work/plain.out" || { echo "FAIL: the plain 2-vCPU run did not run smp-race"; exit 1; }
echo "ok   plain run on KVM, 2 vCPUs, boot and /scripts/smp: $(ms_since "$start") ms"
python3 "$source_dir/tests/linux/linux_test.py" --deja "$build/deja" --backend kvm --guest-dir "$build/guest-linux" \
  --record-replay-smp --shell --append "$lpj" --cpus 2 --schedule-seed 1 --timeout 2400 --keep "$work/linux"
for spec in "${smp_guests[@]}"; do
  read -r guest append <<<"$spec"
  status=0
  "$build/deja" record --backend kvm --mem 16M --machine pc-apic --cpus 2 --schedule-seed 3 \
    ${append:+--append "$append"} -o "$work/$guest-kvm.trace" --serial-out "$work/$guest-kvm.out" \
    "$guests/$guest.elf" 2>"$work/$guest-kvm.err" || status=$?
  [[ $status -eq 1 ]] ||
    { echo "FAIL: recording $guest on KVM ended with status $status:"; cat "$work/$guest-kvm.err"; exit 1; }
  replay_ok "$guest, 2 vCPUs, recorded on KVM: replay on KVM" "$work/$guest-kvm.trace" "$work/$guest-kvm.out"
  replay_ok "$guest, 2 vCPUs, recorded on interp: replay on KVM" "$work/$guest-interp.trace" "$work/$guest-interp.out" \
    --backend kvm
done

# Stock KVM: no PAUSE exits. The recording says so before the guest runs; a plain run switches at host-time kicks.
status=0
DEJA_KVM_DEJA=off "$build/deja" record --backend kvm --mem 16M --machine pc-apic --cpus 2 -o "$work/stock.trace" \
  --serial-out /dev/null "$guests/smp-ipi.elf" 2>"$work/stock-record.err" || status=$?
grep -q "warning: this host's KVM cannot stop a vCPU at PAUSE" "$work/stock-record.err" ||
  { echo "FAIL: a 2-vCPU recording on stock KVM did not warn (status $status):"; cat "$work/stock-record.err"; exit 1; }
status=0
DEJA_KVM_DEJA=off "$build/deja" run --backend kvm --mem 16M --machine pc-apic --cpus 2 --serial-out "$work/stock.out" \
  "$guests/smp-ipi.elf" 2>/dev/null || status=$?
[[ $status -eq 1 ]] && grep -q "all delivered" "$work/stock.out" ||
  { echo "FAIL: smp-ipi with 2 vCPUs on stock KVM ended with status $status"; exit 1; }
echo "ok   stock KVM: the 2-vCPU recording warns up front; a plain run delivers every IPI"
