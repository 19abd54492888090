#!/usr/bin/env bash
# Builds the bundled guest's disk: a tar archive of known files on a raw 4 MiB image (the guest reads it with
# `tar -xOf /dev/vda FILE`; no filesystem module needed), reproducibly.
# Usage: make-disk.sh SOURCE_DIR OUTPUT.img
set -euo pipefail
src="$1" out="$2"
tar --format=ustar --owner=0 --group=0 --numeric-owner --mtime=@0 --sort=name -C "$src/disk" -cf "$out.tmp" .
size=$((4 * 1024 * 1024))
[ "$(stat -c %s "$out.tmp")" -le "$size" ] || { echo "make-disk: the disk contents exceed 4 MiB" >&2; exit 1; }
truncate -s "$size" "$out.tmp"
mv "$out.tmp" "$out"
