#!/usr/bin/env bash
# Fetches the debug symbols `crash` needs to open deja's memory dumps of the bundled Linux guest: only the vmlinux of
# Debian's linux-image-RELEASE-dbg (an 860 MB download, about 630 MB extracted; the package installs 5.6 GB), into
# DIR (default build/crash-symbols). Not part of setup.sh for that size; tests/linux runs crash on a dump when it is
# there (or in /usr/lib/debug/boot). Usage: scripts/crash-symbols.sh [RELEASE] [DIR]
set -euo pipefail
release="${1:-$(ls -1 /boot/vmlinuz-* | sort -V | tail -1 | sed 's|/boot/vmlinuz-||')}"
dir="${2:-$(dirname "$0")/../build/crash-symbols}"
mkdir -p "$dir"
if [ -s "$dir/vmlinux-$release" ]; then echo "crash-symbols: $dir/vmlinux-$release is there"; exit 0; fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"  # apt's download user must be able to write there
(cd "$work" && apt-get download "linux-image-$release-dbg")
dpkg-deb --fsys-tarfile "$work"/linux-image-"$release"-dbg_*.deb |
  tar -x -C "$work" "./usr/lib/debug/boot/vmlinux-$release"
mv "$work/usr/lib/debug/boot/vmlinux-$release" "$dir/vmlinux-$release.partial"
mv "$dir/vmlinux-$release.partial" "$dir/vmlinux-$release"
echo "crash-symbols: $dir/vmlinux-$release"
