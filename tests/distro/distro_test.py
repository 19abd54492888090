#!/usr/bin/env python3
"""The distro guests (guest-distro/, docs/distro.md) on QEMU TCG and on deja.

  --guest glibc    the distro initramfs mounts the Debian root file system and runs /scripts/glibc-workload in it:
                   Debian's dynamically linked programs on glibc 2.36. The workload's output must be the same on every
                   machine; what glibc chose for the CPU (ISA level, AVX2) is checked against what the CPU offers.
  --guest systemd  Debian's own kernel and initrd boot the root file system to systemd's multi-user.target, where
                   deja-ready.service prints a marker and ends the machine.

  --machine qemu   QEMU TCG (-cpu max, which has AVX2 in QEMU 7.2): writes its output for the deja side to compare.
  --machine deja   deja's default CPU model: record, then replay (every event checked, the same serial output).

Exit status: 0 pass, 1 fail, 77 skipped (why is printed): no root file system could be built here. On deja the test
first asks the default CPU model (through the cpuid guest) for what Debian's glibc needs, and fails up front, naming
it, where the model lacks it: the x86-64 baseline (MMX) or a vendor glibc 2.36 reads CPUID for (--zero-isa-markers
runs a diagnostic copy of the files whose ISA markers are zeroed).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "linux"))
import linux_guest  # noqa: E402

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_ROOTFS = os.path.join(HERE, "..", "..", "guest-distro", "build-rootfs.sh")
SYSTEMD_CMDLINE = "console=ttyS0 root=/dev/vda rw"  # the stock command line a user types (issue 22)
SYSTEMD_MARKER = "deja-distro: reached multi-user.target"
# glibc's x86-64 baseline: CPUID.1:EDX FPU, CX8, CMOV, MMX, FXSR, SSE, SSE2.
BASELINE_EDX = {"FPU": 0, "CX8": 8, "CMOV": 15, "MMX": 23, "FXSR": 24, "SSE": 25, "SSE2": 26}
# The vendors whose CPUID glibc 2.36 reads in full (sysdeps/x86/cpu-features.c); for any other its get_common_indices
# skips leaf 1, so CMOV, CX8, MMX, SSE2... all read as absent and every baseline-marked program refuses to start.
GLIBC_VENDORS = {"GenuineIntel", "AuthenticAMD", "HygonGenuine", "CentaurHauls", "  Shanghai  "}


class Skip(Exception):
    pass


def guest_files(args):
    """(kernel, initrd, root image) for this guest; builds or finds the cached root file system."""
    out = os.path.abspath(args.guest_dir)
    flags = ["--zero-isa-markers"] if args.zero_isa_markers else []
    build = subprocess.run([BUILD_ROOTFS, *flags, out], capture_output=True, text=True)
    if build.returncode == 3:
        raise Skip(f"no root file system: {build.stderr.strip()}")
    if build.returncode != 0:
        raise linux_guest.GuestError(f"build-rootfs.sh failed ({build.returncode}):\n{build.stderr[-3000:]}")
    image = build.stdout.strip().splitlines()[-1]
    kernel = open(os.path.join(out, "kernel.path")).read().strip()
    kver = os.path.basename(kernel).removeprefix("vmlinuz-")
    if args.guest == "glibc":
        initrd = os.path.join(out, "initramfs.cpio")
    elif args.zero_isa_markers:
        initrd = os.path.join(out, "initrd-zero-isa.img")
    else:
        initrd = f"/boot/initrd.img-{kver}"
    if not os.path.isfile(initrd):
        raise Skip(f"no initrd {initrd} (linux-image-amd64 makes it through initramfs-tools; "
                   f"`update-initramfs -c -k {kver}` makes it by hand)")
    return kernel, initrd, image


def default_model_lacks_baseline(args):
    """Why Debian 12's glibc cannot run on deja's default CPU model (empty: it can), from the cpuid guest's answers:
    a vendor glibc 2.36 does not know (it then reads no CPUID leaf 1 at all: ISA level 0), or baseline features
    missing from CPUID.1:EDX."""
    run = subprocess.run([args.deja, "run", "--backend", "interp", args.cpuid_guest], capture_output=True, text=True,
                         timeout=120)
    vendor = re.search(r'^vendor: "(.*)"$', run.stdout, re.M)
    leaf1 = re.search(r"leaf 00000001\.0: .* edx=([0-9a-f]{8})", run.stdout)
    if not vendor or not leaf1:
        raise linux_guest.GuestError(f"the cpuid guest printed no vendor or leaf 1:\n{run.stdout}{run.stderr}")
    lacking = []
    if vendor.group(1) not in GLIBC_VENDORS:
        lacking.append(f"a vendor glibc 2.36 knows (it says \"{vendor.group(1)}\", and for an unknown vendor glibc "
                       "reads no CPUID leaf 1 features: ISA level 0)")
    edx = int(leaf1.group(1), 16)
    missing = [name for name, bit in BASELINE_EDX.items() if not edx >> bit & 1]
    if missing:
        lacking.append(f"{', '.join(missing)} of the x86-64 baseline")
    return lacking


def cmdline(args):
    if args.guest == "systemd":
        return SYSTEMD_CMDLINE
    base = subprocess.run([args.deja, "run", "--linux", "--print-cmdline"], capture_output=True, text=True,
                          check=True).stdout.strip()
    return f"{base} deja.script=glibc deja.rounds={args.rounds}"


def qemu_argv(args, kernel, initrd, image):
    return ["qemu-system-x86_64", "-accel", "tcg", "-machine", "pc,acpi=off", "-cpu", args.qemu_cpu, "-m", args.mem,
            "-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio",
            "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
            "-kernel", kernel, "-initrd", initrd, "-append", cmdline(args),
            # snapshot=on: the image is never written; the guest's writes go to a temporary overlay.
            "-drive", f"file={image},format=raw,if=none,id=d0,snapshot=on", "-device", "virtio-blk-pci,drive=d0"]


def deja_argv(args, kernel, initrd, image, trace, overlay):
    return [args.deja, "record", "-o", trace, "--backend", "interp", "--stats", "--mem", args.mem,
            "--kernel", kernel, "--initrd", initrd, "--cmdline", cmdline(args),
            "--disk", f"{image},overlay={overlay}"]


def run_machine(argv, log_path, timeout):
    """Runs a machine to its end with its console in `log_path`; returns (status, console text, seconds)."""
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            status = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            raise linux_guest.GuestError(f"{argv[0]} did not end within {timeout} s (console: {log_path})")
    text = open(log_path, "rb").read().decode(errors="replace").replace("\r", "")
    return status, text, time.monotonic() - t0


def section(text, name):
    match = re.search(rf"^@@{name}\n(.*?)^@@", text, re.S | re.M)
    return match.group(1) if match else None


def glibc_choices(diagnostics):
    """What glibc 2.36 chose for this CPU, from its --list-diagnostics: ISA level and string-function family."""
    values = dict(re.findall(r"^x86\.cpu_features\.([^=]+)=(0x[0-9a-f]+)$", diagnostics, re.M))
    isa = int(values.get("isa_1", "0x0"), 16)
    leaf7_ebx = int(values.get("features[0x1].active[0x1]", "0x0"), 16)
    avx2, bmi2 = bool(leaf7_ebx >> 5 & 1), bool(leaf7_ebx >> 8 & 1)
    evex = bool(leaf7_ebx >> 31 & 1) and bool(leaf7_ebx >> 30 & 1)  # AVX512VL and AVX512BW
    levels = [name for bit, name in ((1, "baseline"), (2, "v2"), (4, "v3"), (8, "v4")) if isa & bit]
    # glibc 2.36's ifunc selectors for strlen/memchr/strchr/memcmp: EVEX with AVX512VL+BW+BMI2, else AVX2 with
    # AVX2+BMI2, else SSE2.
    family = "evex" if evex and bmi2 else "avx2" if avx2 and bmi2 else "sse2"
    return {"isa_1": isa, "levels": levels, "avx2": avx2, "string_functions": family}


def check_glibc(text, machine, results):
    """Checks the glibc guest's console: the workload ran and what glibc chose fits the CPU. Returns the output."""
    flags = re.search(r"deja-distro: cpu flags: (.*)", text)
    diagnostics, output = section(text, "diagnostics"), section(text, "output")
    if "CPU ISA level is lower than required" in text:
        raise linux_guest.GuestError(f"{machine}: glibc refused to run (CPU ISA level is lower than required); "
                                     f"cpu flags: {flags.group(1) if flags else '?'}")
    if not flags or diagnostics is None or output is None or "@@end" not in text:
        raise linux_guest.GuestError(f"{machine}: the glibc workload did not run to its end; console ends:\n"
                                     + text[-3000:])
    cpu_flags = set(flags.group(1).split())
    chosen = glibc_choices(diagnostics)
    results.append(f"{machine}: glibc ISA levels {'+'.join(chosen['levels']) or 'none'} (isa_1={chosen['isa_1']:#x}), "
                   f"string functions {chosen['string_functions']}; CPU has avx2: {'avx2' in cpu_flags}")
    if "avx2" in cpu_flags and "bmi2" in cpu_flags and chosen["string_functions"] == "sse2":
        raise linux_guest.GuestError(f"{machine}: the CPU offers AVX2 and BMI2 but glibc picked SSE2 string functions")
    if {"avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm", "xsave"} <= cpu_flags and not chosen["isa_1"] & 4:
        raise linux_guest.GuestError(f"{machine}: the CPU offers x86-64-v3 but glibc does not see it "
                                     f"(isa_1={chosen['isa_1']:#x})")
    return output, chosen


def replay(args, trace, recorded_serial, workdir, results):
    """Replays the trace: it must end `replay OK` (every event checked, the recording's final state digest) with the
    recorded serial output byte for byte."""
    replayed = os.path.join(workdir, "replayed.out")
    t0 = time.monotonic()
    rep = subprocess.run([args.deja, "replay", trace, "--serial-out", replayed, "--stats"], capture_output=True,
                         text=True, timeout=args.timeout)
    seconds = time.monotonic() - t0
    if rep.returncode != 1 or "replay OK" not in rep.stderr:
        raise linux_guest.GuestError(f"replay ended with status {rep.returncode}:\n{rep.stderr[-3000:]}")
    if open(replayed, "rb").read() != open(recorded_serial, "rb").read():
        raise linux_guest.GuestError(f"the replayed serial output differs from the recorded one ({replayed})")
    summary = next(line for line in rep.stderr.splitlines() if "replay OK" in line)
    results.append(f"replay {seconds:.1f} s: {summary.strip().removeprefix('deja: ')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--guest", choices=["glibc", "systemd"], required=True)
    ap.add_argument("--machine", choices=["qemu", "deja"], required=True)
    ap.add_argument("--deja", required=True)
    ap.add_argument("--guest-dir", required=True, help="build/guest-distro")
    ap.add_argument("--cpuid-guest", help="build/guest-tests/cpuid.elf: what the default CPU model offers")
    ap.add_argument("--qemu-cpu", default="max")
    ap.add_argument("--mem", default="512M")
    ap.add_argument("--rounds", type=int, default=2, help="glibc workload rounds")
    ap.add_argument("--zero-isa-markers", action="store_true",
                    help="diagnostic: the files with their ISA markers zeroed (never what the test passes with)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--workdir")
    args = ap.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix=f"deja-distro-{args.guest}-{args.machine}-")
    os.makedirs(workdir, exist_ok=True)
    results = []
    try:
        if args.machine == "deja" and not args.zero_isa_markers:
            lacking = default_model_lacks_baseline(args)
            if lacking:
                raise linux_guest.GuestError(f"deja's default CPU model lacks {'; and '.join(lacking)}: Debian 12's "
                                             "glibc refuses every dynamic program on it (\"CPU ISA level is lower "
                                             "than required\")")
        kernel, initrd, image = guest_files(args)
        results.append(f"files: {kernel}, {initrd}, {image}")
        reference = os.path.join(args.guest_dir, f"{args.guest}-qemu{'-zero-isa' if args.zero_isa_markers else ''}.out")
        if args.machine == "qemu":
            status, text, seconds = run_machine(qemu_argv(args, kernel, initrd, image),
                                                os.path.join(workdir, "qemu.log"), args.timeout)
        else:
            trace, overlay = os.path.join(workdir, "guest.trace"), os.path.join(workdir, "overlay.img")
            serial = os.path.join(workdir, "serial.out")
            status, log, seconds = run_machine(deja_argv(args, kernel, initrd, image, trace, overlay) +
                                               ["--serial-out", serial], os.path.join(workdir, "deja.log"),
                                               args.timeout)
            results += [line.strip() for line in log.splitlines()
                        if "instructions retired" in line or "unimplemented" in line]
            text = open(serial, "rb").read().decode(errors="replace").replace("\r", "")
        results.append(f"{args.machine}: ran to the end in {seconds:.1f} s with status {status}")
        if args.guest == "glibc":
            output, _ = check_glibc(text, args.machine, results)
        else:
            # deja-ready.service runs only once multi-user.target is reached; systemd's own "Reached target" line
            # may not show (it stops its status output once serial-getty owns the console).
            if SYSTEMD_MARKER not in text:
                raise linux_guest.GuestError(f"{args.machine}: systemd did not reach multi-user.target; console "
                                             "ends:\n" + text[-4000:])
            results.append(next(line for line in text.splitlines() if SYSTEMD_MARKER in line).strip())
            # A halted guest's timer must fire at its deadline (Engine::idle_now_ns), not after a jump of guest time.
            stall = re.search(r"rcu: INFO: rcu_preempt self-detected stall|timer wakeup didn't happen", text)
            if stall:
                raise linux_guest.GuestError(f"{args.machine}: the guest reported a stall: {stall.group(0)}")
            output = None
        if status != 1:
            raise linux_guest.GuestError(f"{args.machine} ended with status {status}, not 1 (isa-debug-exit 0)")
        if args.machine == "qemu":
            if output is not None:
                with open(reference, "w") as f:
                    f.write(output)
        else:
            if output is not None:
                if not os.path.exists(reference):
                    raise linux_guest.GuestError(f"no QEMU output to compare with ({reference}): run the test with "
                                                 "--machine qemu first (CTest's fixture does)")
                if open(reference).read() != output:
                    raise linux_guest.GuestError(f"the workload's output differs from QEMU's ({reference}):\n"
                                                 f"deja:\n{output}\nqemu:\n{open(reference).read()}")
                results.append("the workload's output is QEMU's, byte for byte")
            replay(args, trace, serial, workdir, results)
    except Skip as why:
        print(f"SKIPPED: {why}")
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        return SKIP
    except (linux_guest.GuestError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        print("\n".join(results))
        print(f"FAILED: {error}\n(work files: {workdir})")
        return 1
    print("\n".join(results))
    print("PASSED")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)  # a failure's files stay, for a look
    return 0


if __name__ == "__main__":
    sys.exit(main())
