#!/usr/bin/env bash
# Runs one command with a real /dev/kvm inside a Linux guest of QEMU's software emulator (nested SVM), passing back its output and exit status.
#
# Usage: scripts/kvm-nested.sh [--timeout SECONDS] [--mem SIZE] [--share DIR]... [--direct-if-usable DEJA]
#                              [--kvm-deja [--kvm-deja-cache DIR]] [--verbose] -- COMMAND [ARGS...]
#
# The guest is the installed Debian kernel with a small busybox initramfs (cached) that loads the KVM
# modules and then chroots into the host's root filesystem, shared read-only over 9p; the project tree
# (this script's repository), the current directory and every --share DIR are shared writable at the
# same absolute paths, so build/deja, build/tests/... and any output files work unchanged.
# --direct-if-usable DEJA runs COMMAND directly instead when this host's KVM passes deja's usability check
# (`DEJA selftest --kvm-only`): a /dev/kvm that exists but cannot run deja's guests (kvm-pvm) goes nested.
# --kvm-deja loads the kvm-deja modules (kvm-deja/patches, built on this host for the guest kernel by
# scripts/kvm-deja-build.sh, cached in --kvm-deja-cache DIR) instead of the stock kvm.ko / kvm-amd.ko.
# Exit status: COMMAND's status; 124 on timeout; 125 when the nested environment itself fails.
set -euo pipefail

die_env() { echo "kvm-nested: $*" >&2; exit 125; }

timeout_s=600
mem=2G
direct_deja=""
verbose=0
kvm_deja=0
kvm_deja_cache=""
shares=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --timeout) timeout_s="$2"; shift 2 ;;
    --mem) mem="$2"; shift 2 ;;
    --share) shares+=("$(realpath "$2")"); shift 2 ;;
    --direct-if-usable) direct_deja="$2"; shift 2 ;;
    --verbose) verbose=1; shift ;;
    --kvm-deja) kvm_deja=1; shift ;;
    --kvm-deja-cache) kvm_deja_cache="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "kvm-nested: unknown option '$1' (the command goes after --)" >&2; exit 2 ;;
  esac
done
[[ $# -gt 0 ]] || { echo "kvm-nested: no command given (usage: $0 [options] -- COMMAND...)" >&2; exit 2; }
[[ "$timeout_s" =~ ^[0-9]+$ ]] || { echo "kvm-nested: --timeout '$timeout_s' is not a number of seconds" >&2; exit 2; }

# A host /dev/kvm runs whatever kvm module the host has loaded; --kvm-deja needs the guest to load ours.
if [[ -n $direct_deja && $kvm_deja == 0 ]] && "$direct_deja" selftest --kvm-only >/dev/null 2>&1; then
  exec "$@"
fi

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
project_root="$(cd "$script_dir/.." && pwd)"

# --- the kernel: the newest /boot/vmlinuz-* whose modules include KVM (override: DEJA_NESTED_KERNEL=path).
kernel="${DEJA_NESTED_KERNEL:-}"
if [[ -z "$kernel" ]]; then
  for candidate in $(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V -r); do
    version="${candidate#/boot/vmlinuz-}"
    if [[ -f "/usr/lib/modules/$version/kernel/arch/x86/kvm/kvm.ko" || -f "/usr/lib/modules/$version/kernel/arch/x86/kvm/kvm.ko.xz" ]]; then
      kernel="$candidate"; break
    fi
  done
fi
[[ -n "$kernel" && -r "$kernel" ]] || die_env "no readable /boot/vmlinuz-* with KVM modules in /usr/lib/modules (install linux-image-amd64)"
kversion="${DEJA_NESTED_KERNEL_VERSION:-${kernel#/boot/vmlinuz-}}"
moddir="/usr/lib/modules/$kversion"
[[ -f "$moddir/modules.dep" ]] || die_env "$moddir/modules.dep missing: cannot resolve the modules of kernel $kversion"
busybox="$(command -v busybox || true)"
[[ -x /bin/busybox ]] && busybox=/bin/busybox
[[ -n "$busybox" ]] || die_env "busybox not found (install busybox-static)"
if ldd "$busybox" >/dev/null 2>&1; then die_env "$busybox is dynamically linked; the initramfs needs busybox-static"; fi
command -v qemu-system-x86_64 >/dev/null || die_env "qemu-system-x86_64 not found (install qemu-system-x86)"
command -v cpio >/dev/null || die_env "cpio not found"

# --- kvm-deja: build (or reuse) the patched modules for the guest kernel, on this host (TCG would take ages).
deja_modules=""
if [[ $kvm_deja == 1 ]]; then
  build_args=(--kernel "$kversion")
  [[ -n "$kvm_deja_cache" ]] && build_args+=(--out "$kvm_deja_cache")
  deja_modules="$("$script_dir/kvm-deja-build.sh" "${build_args[@]}" | tail -1)" ||
    die_env "building the kvm-deja modules for kernel $kversion failed (see above)"
  [[ -f "$deja_modules/kvm.ko" && -f "$deja_modules/kvm-amd.ko" ]] || die_env "no kvm-deja modules in '$deja_modules'"
fi

# --- the initramfs, cached by a hash of everything that goes into it.
cache_root="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/deja"
wanted_modules=(kvm-amd kvm-intel virtio_pci 9pnet_virtio 9p)
key="$( { cat "$0" "$script_dir/nested/init.sh"; echo "$kernel $kversion ${wanted_modules[*]}";
          sha256sum "$busybox" "$moddir/modules.dep";
          if [[ -n "$deja_modules" ]]; then sha256sum "$deja_modules"/*.ko; fi; } | sha256sum | cut -c1-16)"
initrd="$cache_root/nested-initrd-$key.cpio.gz"

resolve_modules() {  # prints module paths (relative to $moddir), dependencies first, each once
  declare -A seen=()
  visit() {
    local name="$1" line path deps dep
    line="$(grep -E "/${name//[-_]/[-_]}\.ko(\.xz|\.zst|\.gz)?:" "$moddir/modules.dep" | head -1)" ||
      { echo "kvm-nested: module $name not in $moddir/modules.dep" >&2; return 1; }
    path="${line%%:*}"
    [[ -n "${seen[$path]:-}" ]] && return 0
    seen[$path]=1
    deps="${line#*:}"
    # modules.dep lists dependencies so that loading them right-to-left works (what modprobe does).
    local reversed=()
    for dep in $deps; do reversed=("$dep" "${reversed[@]}"); done
    for dep in "${reversed[@]}"; do
      visit "$(basename "${dep%%.ko*}")" || return 1
    done
    echo "$path"
  }
  local module
  for module in "$@"; do visit "$module" || return 1; done
}

if [[ ! -s "$initrd" ]]; then
  mkdir -p "$cache_root"
  staging="$(mktemp -d "$cache_root/staging.XXXXXX")"
  trap 'rm -rf "$staging"' EXIT
  mkdir -p "$staging"/{bin,proc,sys,dev,tmp,lib/modules}
  cp "$busybox" "$staging/bin/busybox"
  cp "$script_dir/nested/init.sh" "$staging/init"
  chmod 755 "$staging/init"
  module_list="$(resolve_modules "${wanted_modules[@]}")" || die_env "cannot resolve the KVM/9p modules of kernel $kversion"
  : > "$staging/modules.order"
  for path in $module_list; do
    name="$(basename "$path")"
    stem="${name%%.ko*}"
    if [[ -n "$deja_modules" && -f "$deja_modules/$stem.ko" ]]; then
      # The kvm-deja build of kvm / kvm-amd / kvm-intel replaces the stock module of the same name.
      cp "$deja_modules/$stem.ko" "$staging/lib/modules/$stem.ko"
      echo "$stem.ko" >> "$staging/modules.order"
      continue
    fi
    case "$name" in
      *.ko.xz) xz -dc "$moddir/$path" > "$staging/lib/modules/${name%.xz}"; name="${name%.xz}" ;;
      *.ko.zst) zstd -qdc "$moddir/$path" > "$staging/lib/modules/${name%.zst}"; name="${name%.zst}" ;;
      *.ko.gz) gzip -dc "$moddir/$path" > "$staging/lib/modules/${name%.gz}"; name="${name%.gz}" ;;
      *) cp "$moddir/$path" "$staging/lib/modules/$name" ;;
    esac
    echo "$name" >> "$staging/modules.order"
  done
  (cd "$staging" && find . | cpio -o -H newc --quiet | gzip -1) > "$initrd.tmp.$$"
  mv "$initrd.tmp.$$" "$initrd"
  rm -rf "$staging"
  trap - EXIT
fi

# --- one run: a host directory for the command script and its output, shared writable.
outdir="$(mktemp -d /tmp/deja-nested.XXXXXX)"
cleanup() { rm -rf "$outdir"; }
trap cleanup EXIT

cwd="$(pwd -P)"
shares=("$outdir" "$project_root" "${shares[@]}")
case "$cwd/" in "$project_root"/*) ;; *) shares+=("$cwd") ;; esac
for share in "${shares[@]}"; do
  [[ "$share" =~ ^/[A-Za-z0-9._/+-]*$ ]] || die_env "cannot share '$share': only paths of [A-Za-z0-9._/+-] pass the kernel command line"
done
# Overlapping shares would shadow each other in mount order; the outdir and cwd come from mktemp/pwd, so
# the order above (output, project, extra) mounts parents before children in the common cases.

{
  echo "# generated by kvm-nested.sh"
  for var in PATH HOME LANG LC_ALL TERM USER $(compgen -e | grep -E '^(DEJA_|GTEST_)' || true); do
    [[ -n "${!var+x}" ]] && printf 'export %s=%q\n' "$var" "${!var}"
  done
  # --kvm-deja: where the loaded modules came from (tests reload them with scripts/kvm-deja-install.sh).
  [[ -n "$deja_modules" ]] && printf 'export DEJA_KVM_DEJA_MODULES=%q\n' "$deja_modules"
  # Tests that meet an imprecision of QEMU's software SVM (docs/kvm-deja.md) need to know they run under it.
  echo "export DEJA_NESTED_TCG=1"
  printf 'cd %q || exit 125\n' "$cwd"
  printf 'exec'; printf ' %q' "$@"; printf '\n'
} > "$outdir/command.sh"

qemu_args=(
  -accel tcg -cpu max -m "$mem" -smp 1
  -kernel "$kernel" -initrd "$initrd"
  -append "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init mitigations=off tsc=reliable no_timer_check i8042.noaux i8042.nokbd deja.kvmdeja=$kvm_deja deja.out=$outdir deja.shares=$(IFS=,; echo "${shares[*]}")"
  -nodefaults -display none -monitor none -serial "file:$outdir/console.log" -no-reboot
  -virtfs "local,path=/,mount_tag=deja_root,security_model=none,readonly=on,multidevs=remap"
)
index=0
for share in "${shares[@]}"; do
  qemu_args+=(-virtfs "local,path=$share,mount_tag=deja_share$index,security_model=none,multidevs=remap")
  index=$((index + 1))
done

start=$(date +%s.%N)
set +e
timeout -k 10 "$timeout_s" qemu-system-x86_64 "${qemu_args[@]}" </dev/null >"$outdir/qemu.log" 2>&1
qemu_status=$?
set -e
elapsed=$(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo "?")

console="$outdir/console.log"
[[ $verbose == 1 ]] && { echo "--- nested console ---"; cat "$console"; echo "--- (${elapsed}s) ---"; } >&2
[[ -f "$outdir/stdout" ]] && cat "$outdir/stdout"
[[ -f "$outdir/stderr" ]] && cat "$outdir/stderr" >&2

if [[ $qemu_status == 124 || $qemu_status == 137 ]]; then
  echo "kvm-nested: timed out after ${timeout_s}s (raise --timeout); last console lines:" >&2
  tail -n 20 "$console" >&2 || true
  exit 124
fi
if grep -q DEJA-NESTED-NO-KVM "$console" 2>/dev/null; then
  tail -n 20 "$console" >&2
  die_env "/dev/kvm did not appear in the nested guest (kernel $kversion)"
fi
if [[ $kvm_deja == 1 ]] && grep -q DEJA-NESTED-KVM-DEJA-MISSING "$console" 2>/dev/null; then
  tail -n 20 "$console" >&2
  die_env "--kvm-deja: the kvm-deja module did not load in the nested guest (kernel $kversion)"
fi
status="$(grep -a -o 'DEJA-NESTED-EXIT-STATUS=[0-9]*' "$console" 2>/dev/null | tail -1 | cut -d= -f2 || true)"
if [[ -z "$status" ]]; then
  echo "kvm-nested: the nested guest did not report an exit status (qemu exit $qemu_status); console and qemu output:" >&2
  tail -n 30 "$console" >&2 || true
  tail -n 10 "$outdir/qemu.log" >&2 || true
  exit 125
fi
exit "$status"
