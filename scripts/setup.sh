#!/usr/bin/env bash
# Installs every dependency deja needs from Debian 12 packages (idempotent: installs only what is missing).
set -euo pipefail

PACKAGES=(
  # build
  build-essential cmake ninja-build pkg-config git python3
  # libraries
  libzydis-dev libprotobuf-dev protobuf-compiler libzstd-dev libssl-dev libxxhash-dev libfmt-dev libcli11-dev
  libgtest-dev libgmock-dev
  # guests are linked with binutils (objcopy -O elf32-i386); QEMU is the reference and hosts nested KVM
  binutils qemu-system-x86
  # the nested-KVM harness: a Debian kernel with its kvm modules, busybox, cpio, kmod, zstd/xz for modules
  linux-image-amd64 busybox-static cpio kmod xz-utils zstd
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages are installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO=sudo; else
    echo "setup: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
