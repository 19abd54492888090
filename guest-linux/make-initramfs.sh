#!/usr/bin/env bash
# Builds the bundled guest's initramfs (an uncompressed newc cpio: the kernel unpacks it without a decompressor)
# from busybox-static, /init, and the virtio modules of kernel KVER, reproducibly (fixed owners and times).
# Usage: make-initramfs.sh KVER SOURCE_DIR OUTPUT.cpio [--modules FILE] [--scripts DIR]... [PROGRAM...]
# Each PROGRAM (a static executable the build made, e.g. tsc-spin) goes to /bin under its own name. --modules replaces
# SOURCE_DIR/modules (the list of modules /init loads); each --scripts DIR adds its files to /scripts (the distro
# guest's initramfs, guest-distro/, is this one with its own modules and scripts).
set -euo pipefail
kver="$1" src="$2" out="$3"
shift 3
modules_list="$src/modules"
script_dirs=("$src/scripts")
while [ $# -gt 0 ]; do
  case "$1" in
    --modules) modules_list="$2"; shift 2 ;;
    --scripts) script_dirs+=("$2"); shift 2 ;;
    *) break ;;
  esac
done
busybox=/bin/busybox
modules_dir="/usr/lib/modules/$kver"
if [ ! -x "$busybox" ] || readelf -l "$busybox" 2>/dev/null | grep -q INTERP; then
  echo "make-initramfs: $busybox is missing or dynamically linked: install busybox-static" >&2
  exit 1
fi
[ -d "$modules_dir" ] || { echo "make-initramfs: no $modules_dir (install linux-image-amd64)" >&2; exit 1; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,mnt,root,etc/deja,lib/modules,scripts}
cp "$busybox" "$stage/bin/busybox"
# Applet links made here, not by `busybox --install` at boot: fewer guest instructions. No modprobe: the kernel's
# module requests (crypto, filesystems) then fail at once instead of each running busybox to find nothing.
for applet in $("$busybox" --list-full); do
  case "$applet" in */modprobe) continue ;; esac
  [ -e "$stage/$applet" ] || ln -s /bin/busybox "$stage/$applet"
done
install -m 0755 "$src/init" "$stage/init"
install -m 0755 "$src/deja-exit" "$stage/bin/deja-exit"
for program in "$@"; do
  if readelf -l "$program" 2>/dev/null | grep -q INTERP; then
    echo "make-initramfs: $program is dynamically linked (the initramfs has no libc)" >&2
    exit 1
  fi
  install -m 0755 "$program" "$stage/bin/$(basename "$program")"
done
cp "$modules_list" "$stage/etc/deja/modules"
for dir in "${script_dirs[@]}"; do
  for script in "$dir"/*; do install -m 0755 "$script" "$stage/scripts/"; done
done
while read -r module; do
  path="$(modinfo -k "$kver" -n "$module")"
  case "$path" in
    *.ko) cp "$path" "$stage/lib/modules/$module.ko" ;;
    *.ko.xz) xz -dc "$path" > "$stage/lib/modules/$module.ko" ;;
    *.ko.zst) zstd -qdc "$path" > "$stage/lib/modules/$module.ko" ;;
    *) echo "make-initramfs: module $module of $kver not found ($path)" >&2; exit 1 ;;
  esac
done < "$modules_list"
echo "root:x:0:0:root:/root:/bin/sh" > "$stage/etc/passwd"
echo "root:x:0:" > "$stage/etc/group"
echo "$kver" > "$stage/etc/deja/kernel"
find "$stage" -exec touch -h -d @0 {} +
(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0 --reproducible) > "$out.tmp"
mv "$out.tmp" "$out"
