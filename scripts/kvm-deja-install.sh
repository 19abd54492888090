#!/usr/bin/env bash
# Loads the kvm-deja modules in place of the running kernel's stock kvm modules (or, with --uninstall, restores the stock ones); refuses while any VM is running.
#
# Usage: scripts/kvm-deja-install.sh [--modules DIR] [--cache DIR] [-- MODULE_PARAMS...]
#        scripts/kvm-deja-install.sh --uninstall
#        scripts/kvm-deja-install.sh --status
#
#   --modules DIR   load kvm.ko / kvm-amd.ko / kvm-intel.ko from DIR (default: build them for `uname -r` with
#                   scripts/kvm-deja-build.sh, cached in --cache DIR)
#   MODULE_PARAMS   passed to kvm.ko, e.g. deja_rdtsc=0 deja_rdtscp=1 (every intercept is allowed by default)
#
# Needs root. Nothing is written to /lib/modules: the change lasts until the next reboot or --uninstall.
# Exit status: 0 done; 1 refused or failed (the message says why; stock KVM is reloaded if loading ours failed).
set -euo pipefail

die() { echo "kvm-deja-install: $*" >&2; exit 1; }
say() { echo "kvm-deja-install: $*" >&2; }

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mode=install
modules=""
cache=""
params=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --uninstall) mode=uninstall; shift ;;
    --status) mode=status; shift ;;
    --modules) modules="$2"; shift 2 ;;
    --cache) cache="$2"; shift 2 ;;
    --) shift; params=("$@"); break ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "kvm-deja-install: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for p in "${params[@]}"; do
  [[ "$p" =~ ^deja_(rdtsc|rdtscp|rdrand|rdseed)=[01YNyn]$ ]] ||
    die "unknown module parameter '$p' (kvm-deja has deja_rdtsc, deja_rdtscp, deja_rdrand, deja_rdseed = 0 or 1)"
done

kdeja_loaded() { [[ -e /sys/module/kvm/parameters/deja_rdtsc ]]; }

if [[ $mode == status ]]; then
  if kdeja_loaded; then
    echo "kvm-deja is loaded: $(for p in rdtsc rdtscp rdrand rdseed; do printf 'deja_%s=%s ' $p "$(cat /sys/module/kvm/parameters/deja_$p)"; done)"
  elif [[ -d /sys/module/kvm ]]; then
    echo "stock kvm is loaded"
  else
    echo "kvm is not loaded"
  fi
  exit 0
fi

[[ "$(id -u)" == 0 ]] || die "needs root (loading kernel modules)"
for tool in insmod rmmod modprobe modinfo; do command -v $tool >/dev/null || die "$tool not found (install kmod)"; done

vendor=""
if grep -qw svm /proc/cpuinfo; then vendor=kvm_amd; elif grep -qw vmx /proc/cpuinfo; then vendor=kvm_intel; fi
[[ -n "$vendor" ]] || die "this CPU has neither SVM nor VMX (/proc/cpuinfo): KVM cannot run here"

# A running VM holds references: every open /dev/kvm (and VM/vCPU fd) pins kvm and the vendor module.
# Replacing the modules under it is impossible (rmmod fails) and would kill the VM if forced, so refuse.
# A module's refcount also counts the modules linked against it (kvm_amd holds one on kvm), listed in holders/.
refuse_if_busy() {
  local m count holders
  for m in kvm kvm_amd kvm_intel; do
    [[ -r /sys/module/$m/refcnt ]] || continue
    holders="$(ls /sys/module/$m/holders 2>/dev/null | wc -l)"
    count=$(( $(cat /sys/module/$m/refcnt) - holders ))
    if [[ "$count" -gt 0 ]]; then
      local users=""
      command -v fuser >/dev/null && users="$(fuser /dev/kvm 2>/dev/null | tr -s ' ' || true)"
      die "refusing: module $m is in use (refcount $count${users:+; /dev/kvm is open by PIDs$users}): stop every VM (QEMU, deja, libvirt, ...) first"
    fi
  done
}

unload_kvm() {
  local m
  for m in kvm_amd kvm_intel kvm; do
    if [[ -d /sys/module/$m ]]; then rmmod "$m" || die "rmmod $m failed (is a VM starting right now?)"; fi
  done
}

if [[ $mode == uninstall ]]; then
  if ! kdeja_loaded; then
    say "kvm-deja is not loaded; nothing to restore"
    exit 0
  fi
  refuse_if_busy
  unload_kvm
  modprobe "$vendor" || die "modprobe $vendor (the stock module) failed"
  say "stock KVM restored ($(modinfo -F filename "$vendor"))"
  exit 0
fi

kversion="$(uname -r)"
if [[ -z "$modules" ]]; then
  build_args=(--kernel "$kversion")
  [[ -n "$cache" ]] && build_args+=(--out "$cache")
  modules="$("$script_dir/kvm-deja-build.sh" "${build_args[@]}" | tail -1)" || die "building the modules for $kversion failed"
fi
vendor_ko="$modules/${vendor//_/-}.ko"
[[ -f "$modules/kvm.ko" && -f "$vendor_ko" ]] || die "$modules lacks kvm.ko or $(basename "$vendor_ko")"
for ko in "$modules/kvm.ko" "$vendor_ko"; do
  magic="$(modinfo -F vermagic "$ko")"
  [[ "$magic" == "$kversion "* ]] || die "$ko was built for '$magic', the running kernel is $kversion: rebuild with scripts/kvm-deja-build.sh"
done
modinfo -F parm "$modules/kvm.ko" | grep -q '^deja_rdtsc:' || die "$modules/kvm.ko is not a kvm-deja build (no deja_rdtsc parameter)"

refuse_if_busy
unload_kvm
# Dependencies the stock modules pull in (irqbypass; ccp for kvm-amd) come from the installed kernel.
for dep in $(modinfo -F depends "$modules/kvm.ko" "$vendor_ko" | tr ',' '\n' | grep -v '^kvm$' | sort -u); do
  modprobe "$dep" || die "modprobe $dep (needed by kvm-deja) failed"
done
restore_stock() { rmmod "$vendor" 2>/dev/null || true; rmmod kvm 2>/dev/null || true; modprobe "$vendor" || true; }
if ! out="$(insmod "$modules/kvm.ko" "${params[@]}" 2>&1)"; then
  restore_stock
  hint=""
  [[ "$out" == *"Key was rejected"* || "$out" == *"Required key not available"* ]] &&
    hint=" (this kernel only loads signed modules, e.g. under Secure Boot lockdown: sign kvm-deja with a key it trusts)"
  die "insmod $modules/kvm.ko failed: $out$hint; stock KVM reloaded"
fi
if ! out="$(insmod "$vendor_ko" 2>&1)"; then
  restore_stock
  die "insmod $vendor_ko failed: $out; stock KVM reloaded"
fi
kdeja_loaded || { restore_stock; die "kvm.ko loaded but has no deja_rdtsc parameter; stock KVM reloaded"; }
say "kvm-deja loaded from $modules for $kversion ($vendor): $("$0" --status)"
