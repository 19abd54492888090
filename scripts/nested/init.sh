#!/bin/busybox sh
# Init (PID 1) of the nested-KVM guest built by scripts/kvm-nested.sh: load KVM, mount the host tree, run one command.
# Why a chroot into the host's own root (shared read-only over 9p): the command then finds the very same
# binaries, shared libraries and paths it has on the host, with no ldd-driven copying that can miss a dlopen.

/bin/busybox --install -s /bin
export PATH=/bin

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

say() { echo "deja-nested: $*" > /dev/ttyS0; }

# Loopback up: tests serve files on 127.0.0.1 to guests behind deja's user network (slirp connects there).
ip link set lo up

arg() {  # value of deja.NAME=... on the kernel command line
  for word in $(cat /proc/cmdline); do
    case "$word" in "deja.$1="*) echo "${word#deja.$1=}" ;; esac
  done
}

# Dependency order was resolved on the host from modules.dep; a module that does not apply to this CPU
# (kvm-intel on an AMD-flavoured "-cpu max") fails to load, which is expected and harmless.
for module in $(cat /modules.order); do
  insmod "/lib/modules/$module" 2>/dev/null || say "note: $module did not load"
done

nine_p="trans=virtio,version=9p2000.L,msize=262144"
mkdir -p /host
# The root is read-only and does not change during a run, so the guest page cache may keep it (cache=loose).
if ! mount -t 9p -o "$nine_p,ro,cache=loose" deja_root /host; then
  say "FAILED: cannot mount the host root over 9p"
  echo "DEJA-NESTED-ENV-FAILED" > /dev/ttyS0
  reboot -f
fi
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mount -t tmpfs tmp /host/tmp
mount -t tmpfs run /host/run 2>/dev/null
mkdir -p /host/dev/shm /host/dev/pts
mount -t tmpfs shm /host/dev/shm

# Writable shares (project tree, the per-run output directory) at their host paths. Mounting over a
# directory of the read-only root is allowed; paths under /tmp first need their directory in the tmpfs.
index=0
for path in $(arg shares | tr ',' ' '); do
  mkdir -p "/host$path" 2>/dev/null
  mount -t 9p -o "$nine_p" "deja_share$index" "/host$path" || say "FAILED: cannot mount share $path"
  index=$((index + 1))
done

outdir=$(arg out)
if [ ! -c /dev/kvm ]; then
  say "FAILED: /dev/kvm did not appear (is SVM/VMX exposed by the emulated CPU?)"
  echo "DEJA-NESTED-NO-KVM" > /dev/ttyS0
  reboot -f
fi
# --kvm-deja: the loaded kvm.ko must be the patched one (it has the deja_rdtsc parameter), or the run would
# silently test stock KVM.
if [ "$(arg kvmdeja)" = 1 ]; then
  if [ ! -e /sys/module/kvm/parameters/deja_rdtsc ]; then
    say "FAILED: kvm.ko has no deja_rdtsc parameter: the kvm-deja module is not loaded"
    echo "DEJA-NESTED-KVM-DEJA-MISSING" > /dev/ttyS0
    reboot -f
  fi
  echo "DEJA-NESTED-KVM-DEJA rdtsc=$(cat /sys/module/kvm/parameters/deja_rdtsc)" > /dev/ttyS0
fi
echo "DEJA-NESTED-KVM-READY uptime=$(cut -d' ' -f1 /proc/uptime)" > /dev/ttyS0

chroot /host /bin/sh "$outdir/command.sh" < /dev/null > "/host$outdir/stdout" 2> "/host$outdir/stderr"
status=$?
echo "$status" > "/host$outdir/status"
sync
echo "DEJA-NESTED-EXIT-STATUS=$status uptime=$(cut -d' ' -f1 /proc/uptime)" > /dev/ttyS0
reboot -f
