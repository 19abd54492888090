#!/usr/bin/env bash
# Builds the kvm-deja modules (kvm.ko, kvm-amd.ko, kvm-intel.ko with kvm-deja/patches applied) for one kernel version from the distribution's linux-source and linux-headers packages.
#
# Usage: scripts/kvm-deja-build.sh [--kernel VERSION] [--out DIR] [--source TARBALL] [--jobs N] [--force]
#
#   --kernel VERSION  kernel release to build for (default: the running one, `uname -r`); its headers must be in
#                     /usr/src/linux-headers-VERSION or /lib/modules/VERSION/build (Debian: linux-headers-VERSION)
#   --out DIR         cache directory (default: $XDG_CACHE_HOME/deja/kvm-deja); the modules go to
#                     DIR/VERSION-KEY/, KEY hashing the patches, this script, the source tarball and the headers,
#                     so an unchanged input reuses the previous build
#   --source TARBALL  kernel source tarball (default: /usr/src/linux-source-MAJOR.MINOR.tar.xz, Debian's
#                     linux-source-MAJOR.MINOR package; scripts/setup.sh installs the one matching the kernel image)
#
# Prints the directory holding the three modules as the last line of stdout. Fails (status 1) with a message
# naming the missing package or the mismatch when the sources, headers or the vermagic of the result are wrong.
set -euo pipefail

die() { echo "kvm-deja-build: $*" >&2; exit 1; }

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
project_root="$(cd "$script_dir/.." && pwd)"
deja_dir="$project_root/kvm-deja"

kversion="$(uname -r)"
out="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/deja/kvm-deja"
tarball=""
jobs="$(nproc)"
force=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --kernel) kversion="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --source) tarball="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "kvm-deja-build: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

[[ "$kversion" =~ ^([0-9]+)\.([0-9]+) ]] || die "kernel version '$kversion' does not start with MAJOR.MINOR"
series="${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
# The patches are written against Linux 6.1's KVM; another series would need its own patch set.
[[ "$series" == "6.1" ]] ||
  die "kernel $kversion is Linux $series; kvm-deja/patches are for Linux 6.1 (Debian 12) only"

headers=""
for candidate in "/lib/modules/$kversion/build" "/usr/src/linux-headers-$kversion"; do
  if [[ -f "$candidate/Makefile" && -f "$candidate/Module.symvers" ]]; then headers="$candidate"; break; fi
done
[[ -n "$headers" ]] || die "no kernel headers for $kversion (looked in /lib/modules/$kversion/build and /usr/src/linux-headers-$kversion): install linux-headers-$kversion (scripts/setup.sh does)"

[[ -n "$tarball" ]] || tarball="/usr/src/linux-source-$series.tar.xz"
[[ -r "$tarball" ]] || die "kernel source $tarball not found: install linux-source-$series (scripts/setup.sh does)"
command -v patch >/dev/null || die "patch(1) not found (install patch)"
command -v modinfo >/dev/null || die "modinfo not found (install kmod)"
shopt -s nullglob
patches=("$deja_dir"/patches/*.patch)
shopt -u nullglob
[[ ${#patches[@]} -gt 0 ]] || die "no patches in $deja_dir/patches"

# The cache key: everything the result depends on. The tarball is keyed by name, size and mtime (hashing its
# 140 MB would cost more than the check saves); the headers by their Module.symvers and kernel config.
key="$( { cat "$0" "$deja_dir/Kbuild" "${patches[@]}"; echo "$kversion"; stat -L -c '%n %s %Y' "$tarball";
          sha256sum "$headers/Module.symvers" "$headers/.config" 2>/dev/null; } | sha256sum | cut -c1-16)"
dest="$out/$kversion-$key"
mkdir -p "$out"

# One build at a time per cache (a CTest run and a benchmark may ask at once).
exec 9>"$out/.lock"
flock 9

if [[ $force == 0 && -f "$dest/kvm.ko" && -f "$dest/kvm-amd.ko" && -f "$dest/kvm-intel.ko" && -f "$dest/BUILD-INFO" ]]; then
  echo "kvm-deja-build: using the cached build in $dest" >&2
  echo "$dest"
  exit 0
fi

start=$(date +%s)
work="$(mktemp -d "$out/work.XXXXXX")"
trap 'rm -rf "$work"' EXIT
src="$work/src"
mkdir -p "$src"
echo "kvm-deja-build: extracting arch/x86/kvm and virt/kvm from $tarball" >&2
top="$(tar -tJf "$tarball" 2>/dev/null | head -1 | cut -d/ -f1)" || true
[[ -n "$top" ]] || die "cannot list $tarball (is it a kernel source tarball?)"
tar -xJf "$tarball" -C "$work" "$top/arch/x86/kvm" "$top/virt/kvm" "$top/Makefile" ||
  die "$tarball lacks arch/x86/kvm or virt/kvm"
mv "$work/$top"/* "$src"/
src_version="$(awk '/^VERSION =/{v=$3} /^PATCHLEVEL =/{p=$3} /^SUBLEVEL =/{s=$3} END{print v"."p"."s}' "$src/Makefile")"
[[ "$src_version" == "$series".* ]] || die "$tarball is Linux $src_version, not $series"
headers_version="$(sed -n 's/^# Linux\/x86 \([0-9.]*\).*/\1/p' "$headers/.config" 2>/dev/null | head -1)"
if [[ -n "$headers_version" && "$headers_version" != "$src_version" ]]; then
  echo "kvm-deja-build: note: the source is Linux $src_version, the headers are for $headers_version" >&2
fi

echo "kvm-deja-build: applying ${#patches[@]} patches" >&2
for p in "${patches[@]}"; do
  patch -d "$src" -p1 --batch --forward --quiet < "$p" >"$work/patch.log" 2>&1 ||
    { cat "$work/patch.log" >&2; die "$(basename "$p") does not apply to $tarball (Linux $src_version)"; }
done
cp "$deja_dir/Kbuild" "$src/arch/x86/kvm/Kbuild"
mkdir -p "$src/include/trace"

echo "kvm-deja-build: building against $headers with -j$jobs" >&2
if ! make -C "$headers" M="$src/arch/x86/kvm" -j"$jobs" modules >"$work/build.log" 2>&1; then
  grep -E "error|Error" "$work/build.log" | head -20 >&2
  mkdir -p "$out/failed" && cp "$work/build.log" "$out/failed/build-$kversion.log"
  die "the module build failed (full log: $out/failed/build-$kversion.log)"
fi

# vermagic: the loader refuses a module whose vermagic differs from the kernel's; compare with the stock kvm.ko
# of that kernel when it is installed, else at least with the kernel release.
stock="$(ls /usr/lib/modules/"$kversion"/kernel/arch/x86/kvm/kvm.ko* 2>/dev/null | head -1 || true)"
for m in kvm kvm-amd kvm-intel; do
  ko="$src/arch/x86/kvm/$m.ko"
  [[ -f "$ko" ]] || die "the build produced no $m.ko (see $work/build.log)"
  magic="$(modinfo -F vermagic "$ko")"
  [[ "$magic" == "$kversion "* ]] || die "$m.ko has vermagic '$magic', expected it to start with '$kversion '"
  if [[ -n "$stock" ]]; then
    stock_magic="$(modinfo -F vermagic "$stock")"
    [[ "$magic" == "$stock_magic" ]] || die "$m.ko has vermagic '$magic', the installed $stock has '$stock_magic'"
  fi
done
modinfo -F parm "$src/arch/x86/kvm/kvm.ko" | grep -q '^deja_rdtsc:' || die "kvm.ko lacks the deja_rdtsc parameter: were the patches applied?"

mkdir -p "$dest.tmp"
cp "$src"/arch/x86/kvm/{kvm,kvm-amd,kvm-intel}.ko "$work/build.log" "$dest.tmp"/
took=$(( $(date +%s) - start ))
{
  echo "kernel=$kversion"
  echo "source=$tarball ($src_version)"
  echo "headers=$headers"
  echo "vermagic=$(modinfo -F vermagic "$dest.tmp/kvm.ko")"
  echo "patches=$(cd "$deja_dir/patches" && ls *.patch | tr '\n' ' ')"
  echo "build_seconds=$took"
} > "$dest.tmp/BUILD-INFO"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "kvm-deja-build: built kvm.ko, kvm-amd.ko, kvm-intel.ko for $kversion in ${took}s" >&2
echo "$dest"
