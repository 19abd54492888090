#!/usr/bin/env bash
# Builds the distro guests' root file system (a Debian 12 ext4 image made from Debian's packages) or finds it in the
# cache, and prints the image's path. Usage: build-rootfs.sh [--zero-isa-markers] OUTPUT_DIR | --print-key
#
# The tree comes from mmdebstrap (minbase + guest-distro/packages, from the Debian mirror apt uses on this machine),
# plus the files of guest-distro/root/, packed with mkfs.ext4 -d (no mounts). The image is cached under
# ${DEJA_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/deja}/distro/rootfs-KEY/, KEY a hash of the package list, the overlay,
# the recipe (build_image below), the suite and the mirror: it is built once per change of those, and OUTPUT_DIR/root.img links to it.
# DEJA_DISTRO_REBUILD=1 rebuilds it anyway (a newer point release of the same packages).
#
# --zero-isa-markers: a diagnostic copy, never what a test passes with: every ELF file's "x86 ISA needed" property
# is zeroed (in the image, and in a copy of the host's initrd written beside it as initrd-zero-isa.img), so glibc runs
# on a CPU model below the x86-64 baseline (no MMX). It lets the deja side be measured before the CPU models have MMX.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
zero_isa=0 print_key=0
if [ "${1:-}" = "--zero-isa-markers" ]; then zero_isa=1; shift; fi
if [ "${1:-}" = "--print-key" ]; then print_key=1; set -- -; fi
[ $# -eq 1 ] || { echo "usage: $0 [--zero-isa-markers] OUTPUT_DIR | --print-key" >&2; exit 2; }
out="$1"
suite=bookworm

# The mirror apt uses here (deb822 .sources or one-line .list), so the guest comes from where the host's packages do.
mirror="$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -1)"
[ -n "$mirror" ] || mirror="$(awk '$1 == "deb" && $3 == "'$suite'" { print $2; exit }' /etc/apt/sources.list \
                                /etc/apt/sources.list.d/*.list 2>/dev/null || true)"
mirror="${mirror:-http://deb.debian.org/debian}"

# The recipe: mmdebstrap's tree, the overlay, then an ext4 image in $1. Its text is part of the cache key.
build_image() {
  local work="$1" tree="$1/tree" start used_mib size_mib
  mkdir -p "$work"
  echo "build-rootfs: mmdebstrap $suite from $mirror: minbase + $packages" >&2
  start=$(date +%s)
  # force-unsafe-io: no fsync per file (the image is made afterwards anyway); no recommends: exactly the list.
  mmdebstrap --variant=minbase --include="$packages" --dpkgopt=force-unsafe-io \
    --aptopt='APT::Install-Recommends "false"' --aptopt='Acquire::Retries "3"' \
    --customize-hook='chroot "$1" passwd -d root' \
    "$suite" "$tree" "$mirror" > "$work/mmdebstrap.log" 2>&1 \
    || { tail -30 "$work/mmdebstrap.log" >&2; echo "build-rootfs: mmdebstrap failed (log: $work/mmdebstrap.log)" >&2; exit 1; }
  cp -a "$here/root/." "$tree/"
  chroot "$tree" dpkg-query -W -f='${Package} ${Version}\n' > "$work/packages.txt"
  rm -rf "$tree/var/cache/apt" "$tree/var/lib/apt/lists"
  mkdir -p "$tree/var/cache/apt/archives/partial" "$tree/var/lib/apt/lists/partial"
  # Room to write beside the files (journal, logs): half again their size, at least 256 MiB.
  used_mib=$(du -sm "$tree" | cut -f1)
  size_mib=$(( used_mib + used_mib / 2 > used_mib + 256 ? used_mib + used_mib / 2 : used_mib + 256 ))
  # A fixed UUID and hash seed: the same tree gives the same file system layout.
  mkfs.ext4 -q -F -L deja-root -U 6b1f5a2e-3c4d-4e5f-8a9b-0c1d2e3f4a5b -E hash_seed=6b1f5a2e-3c4d-4e5f-8a9b-0c1d2e3f4a5b \
    -d "$tree" "$work/root.img" "${size_mib}M"
  rm -rf "$tree"
  echo "built $(date -u +%FT%TZ) in $(( $(date +%s) - start )) s: $suite from $mirror, $(wc -l < "$work/packages.txt") packages, ${used_mib} MiB of files" > "$work/built"
}

packages="$(grep -v '^#' "$here/packages" | tr -s ' \n' '\n' | grep . | LC_ALL=C sort -u | paste -sd, -)"
key="$( { echo "$suite $mirror $packages"; declare -f build_image;
          (cd "$here/root" && find . -print0 | LC_ALL=C sort -z | xargs -0 ls -ld --time-style=+ | awk '{$3=$4=""; print}';
           find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum); } | sha256sum | cut -c1-16)"
[ "$print_key" = 0 ] || { echo "$key"; exit 0; }  # e.g. for a CI cache keyed like this one
cache="${DEJA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/deja}/distro"
dir="$cache/rootfs-$key"
mkdir -p "$cache" "$out"

missing=()
for tool in mmdebstrap mkfs.ext4; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-rootfs: ${missing[*]} missing (scripts/setup.sh installs mmdebstrap and e2fsprogs)" >&2
  exit 3
fi

# One builder at a time per cache (tests run in parallel); the others wait and then find the image.
exec 9>"$cache/lock"
flock 9
if [ ! -f "$dir/root.img" ] || [ "${DEJA_DISTRO_REBUILD:-0}" = 1 ]; then
  [ "$(id -u)" = 0 ] || { echo "build-rootfs: building the root file system needs root (mmdebstrap's root mode)" >&2; exit 3; }
  rm -rf "$dir" "$dir.tmp"
  build_image "$dir.tmp"
  mv "$dir.tmp" "$dir"
  # Older images (other package lists) are left for `rm -rf` by hand: several worktrees may share the cache.
fi

image="$dir/root.img"
if [ "$zero_isa" = 1 ]; then
  kver="$(ls -1 /boot/vmlinuz-* | sort -V -r | head -1 | sed 's,/boot/vmlinuz-,,')"
  if [ ! -f "$dir/zero-isa/root.img" ] || [ ! -f "$dir/zero-isa/initrd-$kver.img" ]; then
    rm -rf "$dir/zero-isa.tmp"
    mkdir -p "$dir/zero-isa.tmp/tree" "$dir/zero-isa.tmp/initrd"
    # Unpack the image with debugfs (no mounts), zero the markers, pack it again.
    debugfs -R "rdump / $dir/zero-isa.tmp/tree" "$image" > /dev/null 2>&1
    python3 "$here/zero-isa-markers.py" "$dir/zero-isa.tmp/tree" >&2
    mkfs.ext4 -q -F -L deja-root -d "$dir/zero-isa.tmp/tree" "$dir/zero-isa.tmp/root.img" "$(( $(stat -c %s "$image") / 1024 ))k"
    unmkinitramfs "/boot/initrd.img-$kver" "$dir/zero-isa.tmp/initrd"
    main="$dir/zero-isa.tmp/initrd"; [ -d "$main/main" ] && main="$main/main"
    python3 "$here/zero-isa-markers.py" "$main" >&2
    (cd "$main" && find . | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) | zstd -q -1 > "$dir/zero-isa.tmp/initrd-$kver.img"
    rm -rf "$dir/zero-isa.tmp/tree" "$dir/zero-isa.tmp/initrd" "$dir/zero-isa"
    mv "$dir/zero-isa.tmp" "$dir/zero-isa"
  fi
  image="$dir/zero-isa/root.img"
  ln -sfn "$dir/zero-isa/initrd-$kver.img" "$out/initrd-zero-isa.img"
  ln -sfn "$image" "$out/root-zero-isa.img"
else
  ln -sfn "$image" "$out/root.img"
  ln -sfn "$dir/packages.txt" "$out/packages.txt"
fi
echo "$image"
