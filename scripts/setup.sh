#!/usr/bin/env bash
# Installs every dependency deja needs from Debian 12 packages (idempotent: installs only what is missing).
set -euo pipefail

PACKAGES=(
  # build
  build-essential cmake ninja-build pkg-config git python3 ccache
  # libraries
  libzydis-dev libprotobuf-dev protobuf-compiler libzstd-dev libssl-dev libxxhash-dev libfmt-dev libcli11-dev
  libgtest-dev libgmock-dev
  # signed traces: DSSE envelopes and in-toto statements are JSON; docs/audit.md checks them with jq and openssl
  nlohmann-json3-dev jq openssl
  # --net user: the user-mode network stack QEMU uses
  libslirp-dev
  # Linux kernels: every compression a bzImage payload may use is decompressed in-process (PVH boot)
  liblzma-dev zlib1g-dev libbz2-dev liblz4-dev liblzo2-dev
  # guests are linked with binutils (objcopy -O elf32-i386); QEMU is the reference and hosts nested KVM
  binutils qemu-system-x86
  # bench/timetravel_bench.py: a qcow2 disk for QEMU's record/replay snapshots
  qemu-utils
  # the nested-KVM harness: a Debian kernel with its kvm modules, busybox, cpio, kmod, zstd/xz for modules
  linux-image-amd64 busybox-static cpio kmod xz-utils zstd
  # kvm-deja (scripts/kvm-deja-build.sh): patch(1); the kernel headers and source are added below
  patch
  # coverage-guided fuzzing (scripts/fuzz.sh): clang 16 and its libFuzzer runtime
  clang-16 libclang-rt-16-dev
  # deja debug is tested through Debian's stock gdb (tests/debug)
  gdb
  # `deja inspect --pcap` is checked by reading the capture back with tshark (tests/linux)
  tshark
  # libvirt domains (libvirt/): libxml2 parses and validates them against libvirt's domain.rng (shipped by libvirt0,
  # which libvirt-dev brings); libvirt-dev is the optional C API of --libvirt-domain; xmllint (libxml2-utils) checks
  # exported domains in the tests; virsh (libvirt-clients) shows the test driver's domains by hand
  libxml2-dev libvirt-dev libvirt0 libxml2-utils libvirt-clients
  # `deja inspect --html` pages are loaded in headless Chromium in the tests (tests/logging); `query --dump` cores are
  # read with gdb (above) and readelf (binutils), and `crash` opens them (docs/debugging.md)
  chromium crash
  # the distro guests (guest-distro/, tests/distro): a Debian root file system made with mmdebstrap from the mirror
  # apt uses, packed with mkfs.ext4 -d; the host's initrd unpacked for the diagnostic copy (unmkinitramfs)
  mmdebstrap e2fsprogs initramfs-tools-core
  # the Slurm executor of segments (segments/, tests/segments): scripts/slurm-local.sh starts a one-node cluster
  slurmctld slurmd slurm-client
)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in "${PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO=sudo; fi
need_root() {
  if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
    echo "setup: need root (or sudo) to install: $*" >&2
    exit 1
  fi
}
updated=0
apt_install() {  # package[=version]...
  need_root "$@"
  if [ $updated = 0 ]; then $SUDO apt-get update; updated=1; fi
  # Downgrades only ever happen to a pinned version (the kernel source matching the booted image).
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends --allow-downgrades "$@"
}

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt_install "${missing[@]}"
fi

# kvm-deja builds kvm.ko for the kernel the nested harness boots (scripts/kvm-nested.sh: the newest
# /boot/vmlinuz-* with KVM modules), so it needs that kernel's headers and the Debian source of the same
# package version. Both are derived from the installed image at run time: CI gets whatever linux-image-amd64
# is current.
kversion=""
for candidate in $(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V -r); do
  v="${candidate#/boot/vmlinuz-}"
  if ls /usr/lib/modules/"$v"/kernel/arch/x86/kvm/kvm.ko* >/dev/null 2>&1; then kversion="$v"; break; fi
done
if [ -z "$kversion" ]; then
  echo "setup: no /boot/vmlinuz-* with KVM modules: cannot pick kernel headers for kvm-deja" >&2
  exit 1
fi
image_package="$(dpkg-query -S "/boot/vmlinuz-$kversion" 2>/dev/null | cut -d: -f1 | head -1)"
image_version="$(dpkg-query -W -f='${Version}' "$image_package" 2>/dev/null || true)"
series="$(echo "$kversion" | grep -oE '^[0-9]+\.[0-9]+')"
kernel_packages=()
installed "linux-headers-$kversion" || kernel_packages+=("linux-headers-$kversion${image_version:+=$image_version}")
source_version="$(dpkg-query -W -f='${Version}' "linux-source-$series" 2>/dev/null || true)"
if ! installed "linux-source-$series"; then source_version=""; fi
if [ -z "$source_version" ] || { [ -n "$image_version" ] && [ "$source_version" != "$image_version" ]; }; then
  if [ $updated = 0 ]; then need_root "linux-source-$series"; $SUDO apt-get update; updated=1; fi
  # Pin the source to the image's version when the archive still has it (security updates replace versions).
  if [ -n "$image_version" ] && apt-cache madison "linux-source-$series" | awk '{print $3}' | grep -qx "$image_version"; then
    kernel_packages+=("linux-source-$series=$image_version")
  elif ! installed "linux-source-$series"; then
    echo "setup: note: linux-source-$series $image_version is not in the archive; installing the newest" >&2
    kernel_packages+=("linux-source-$series")
  fi
fi
if [ ${#kernel_packages[@]} -gt 0 ]; then
  echo "setup: installing ${kernel_packages[*]} (kvm-deja, kernel $kversion)"
  apt_install "${kernel_packages[@]}"
fi
echo "setup: all packages are installed (kvm-deja builds for kernel $kversion)"
