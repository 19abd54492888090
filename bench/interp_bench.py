#!/usr/bin/env python3
"""The software CPU against QEMU TCG (issue 15): the same images, in one run, instructions per second and the ratio.

Workloads: cpu-bound (integer loop), mem-bound (random accesses over 64 MiB of 4 KiB pages), syscall-bound (ring 3
SYSCALL/INT 0x80 under a 1 kHz timer), string-bound (glibc's AVX2 memset/memcpy/strlen/memchr/memcmp loops: deja's
default model, x86-64-v3, against QEMU's `-cpu max`, its model with AVX2; both checksums must agree), the bundled
Linux guest's boot to its marker, and that guest running a fixed busybox workload (/scripts/workload); both sides
boot the same extracted vmlinux and initramfs. For each: deja's instruction count (--stats; QEMU's rate uses the
same count, QEMU does not count), deja's and QEMU's time and instructions per second, their ratio, and deja's
`record` time over its `run` time.

Times are CPU time (user + system of the child process), because this shared 2-core machine is loaded and wall time
measures the neighbours; wall time is printed too. The fixed start-up cost of each side (an image run with n=1, or
nothing for Linux) is subtracted before computing rates, so the ratio compares the CPUs, not process start-up; both
raw times are shown. Best of --repeat runs.

Usage: bench/interp_bench.py [--build build] [--repeat 1] [--only cpu-bound,...] [--modes jit,threaded,reference]
                             [--scale 1.0] [--json FILE]
"""
import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "linux"))
import linux_guest  # noqa: E402


def run_measured(argv, timeout=7200):
    """Runs argv to the end; returns (cpu seconds, wall seconds, stdout+stderr text, exit status)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, p.stdout.decode(errors="replace"), p.returncode


def best(repeat, fn):
    runs = [fn() for _ in range(repeat)]
    return min(runs, key=lambda r: r[0])


def instructions_of(text):
    m = re.search(r"instructions retired: (\d+)", text)
    return int(m.group(1)) if m else None


def checksum_of(text):
    m = re.search(r"checksum=(0x[0-9a-f]+)", text)
    return m.group(1) if m else None


class Workload:
    def __init__(self, name, kind, image=None, args="", startup_args=None, check=None, qemu_cpu=None):
        self.name, self.kind, self.image, self.args = name, kind, image, args
        self.qemu_cpu = qemu_cpu          # QEMU's -cpu, where its default model lacks what the guest needs
        self.startup_args = startup_args  # the same image doing (almost) nothing: the fixed cost
        self.check = check                # a regex the guest's output must contain


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--modes", default="jit", help="deja interp modes to measure (jit, threaded, reference)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the guests' iteration counts")
    ap.add_argument("--no-record", action="store_true", help="skip the record/run measurement")
    ap.add_argument("--no-qemu", action="store_true")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    deja = os.path.join(build, "deja")
    guests = os.path.join(build, "guest-tests")
    guest_linux = os.path.join(build, "guest-linux")
    os.environ["DEJA_LINUX_GUEST_DIR"] = guest_linux
    have_qemu = shutil.which("qemu-system-x86_64") is not None and not args.no_qemu
    tmp = tempfile.mkdtemp(prefix="deja-interp-bench-")
    modes = [m for m in args.modes.split(",") if m]

    def n(default):
        return max(1, int(default * args.scale))

    workloads = [
        Workload("cpu-bound", "image", "cpu-bound.elf", f"n={n(60_000_000)}", "n=1", r"checksum=0x"),
        Workload("mem-bound", "image", "mem-bound.elf", f"n={n(20_000_000)}", "n=1", r"checksum=0x"),
        Workload("syscall-bound", "image", "syscall-bound.elf", f"n={n(2_000_000)}", "n=1", r"checksum=0x"),
        Workload("string-bound", "image", "string-bound.elf", f"n={n(400_000)}", "n=1", r"checksum=0x",
                 qemu_cpu="max"),
        Workload("linux-boot", "linux", args="deja.script=ready", check=r"deja-linux: ready"),
        Workload("linux-workload", "linux", args=f"deja.script=workload deja.rounds={n(12)}",
                 check=r"workload: \d+ rounds"),
    ]
    if args.only:
        wanted = set(args.only.split(","))
        workloads = [w for w in workloads if w.name in wanted]

    vmlinux = None
    cmdline = ""
    if any(w.kind == "linux" for w in workloads):
        kernel = open(os.path.join(guest_linux, "kernel.path")).read().strip()
        vmlinux = os.path.join(tmp, "vmlinux")
        if not linux_guest.extract_vmlinux(kernel, vmlinux):
            print("cannot extract the kernel's vmlinux for QEMU; the Linux workloads run on deja only")
            vmlinux = None
        cmdline = subprocess.run([deja, "run", "--linux", "--print-cmdline"], capture_output=True,
                                 text=True).stdout.strip()

    def deja_argv(w, mode, guest_args, record_to=None):
        head = [deja, "record", "-o", record_to] if record_to else [deja, "run"]
        head += ["--backend", "interp", "--interp-mode", mode, "--stats"]
        if w.kind == "linux" and vmlinux:
            # The same kernel file QEMU boots: decompressing the bzImage (0.7 s of CPU) is loading, not CPU speed.
            return head + ["--kernel", vmlinux, "--initrd", os.path.join(guest_linux, "initramfs.cpio"),
                           "--cmdline", f"{cmdline} {guest_args}"]
        if w.kind == "linux":
            return head + ["--linux", "--append", guest_args]
        return head + ["--cmdline", guest_args, os.path.join(guests, w.image)]

    def qemu_argv(w, guest_args):
        if w.kind == "linux":
            return linux_guest.qemu_argv(vmlinux, os.path.join(guest_linux, "initramfs.cpio"),
                                         f"{cmdline} {guest_args}")
        cpu = ["-cpu", w.qemu_cpu] if w.qemu_cpu else []
        return ["qemu-system-x86_64", "-accel", "tcg", *cpu, "-m", "256M", "-kernel", os.path.join(guests, w.image),
                "-append", guest_args, "-device", "isa-debug-exit,iobase=0xf4,iosize=4", "-serial", "stdio",
                "-display", "none", "-no-reboot"]

    results = {}
    for w in workloads:
        print(f"== {w.name} ({w.args})", flush=True)
        fig = {"args": w.args}
        qemu_startup = 0.0
        qemu_checksum = None
        if have_qemu and (w.kind != "linux" or vmlinux):
            if w.startup_args:
                qemu_startup = best(args.repeat, lambda: run_measured(qemu_argv(w, w.startup_args)))[0]
            cpu, wall, out, _ = best(args.repeat, lambda: run_measured(qemu_argv(w, w.args)))
            if w.check and not re.search(w.check, out):
                print(f"  qemu: the guest did not finish as expected; output ends:\n{out[-1500:]}")
            fig["qemu"] = {"cpu_s": cpu, "wall_s": wall, "startup_cpu_s": qemu_startup}
            qemu_checksum = checksum_of(out)
        for mode in modes:
            startup = 0.0
            if w.startup_args:
                startup = best(args.repeat, lambda: run_measured(deja_argv(w, mode, w.startup_args)))[0]
            cpu, wall, out, status = best(args.repeat, lambda: run_measured(deja_argv(w, mode, w.args)))
            if w.check and not re.search(w.check, out):
                print(f"  deja {mode}: the guest did not finish as expected (status {status}); output ends:\n"
                      f"{out[-1500:]}")
            if qemu_checksum and checksum_of(out) != qemu_checksum:
                print(f"  deja {mode}: checksum {checksum_of(out)}, QEMU's {qemu_checksum}: the CPUs disagree")
            entry = {"cpu_s": cpu, "wall_s": wall, "startup_cpu_s": startup, "instructions": instructions_of(out)}
            if not args.no_record and mode == modes[0]:
                trace = os.path.join(tmp, f"{w.name}.trace")
                rcpu, rwall, rout, _ = best(args.repeat, lambda: run_measured(deja_argv(w, mode, w.args, trace)))
                entry["record_cpu_s"] = rcpu
                entry["record_wall_s"] = rwall
            fig[mode] = entry
        results[w.name] = fig

    # The table.
    print()
    head = f"{'workload':15} {'instructions':>13} "
    for mode in modes:
        head += f"{'deja ' + mode + ' s':>17} {'M instr/s':>10} "
    head += f"{'qemu s':>8} {'M instr/s':>10} {'deja/qemu':>10} {'record/run':>11}"
    print(head)
    for name, fig in results.items():
        ref = fig.get(modes[0], {})
        instructions = ref.get("instructions")
        line = f"{name:15} {instructions or '-':>13} "
        rates = {}
        for mode in modes:
            e = fig.get(mode)
            if not e or not instructions:
                line += f"{'-':>17} {'-':>10} "
                continue
            net = max(e["cpu_s"] - e["startup_cpu_s"], 1e-6)
            rates[mode] = instructions / net / 1e6
            line += f"{e['cpu_s']:>17.2f} {rates[mode]:>10.0f} "
        q = fig.get("qemu")
        if q and instructions:
            qnet = max(q["cpu_s"] - q["startup_cpu_s"], 1e-6)
            qrate = instructions / qnet / 1e6
            line += f"{q['cpu_s']:>8.2f} {qrate:>10.0f} {rates.get(modes[0], 0) / qrate:>9.2f}x "
            fig["ratio"] = rates.get(modes[0], 0) / qrate
        else:
            line += f"{'-':>8} {'-':>10} {'-':>10} "
        if "record_cpu_s" in ref:
            ratio = ref["record_cpu_s"] / max(ref["cpu_s"], 1e-6)
            fig["record_over_run"] = ratio
            line += f"{ratio:>10.3f}x"
        print(line)
    print("(CPU seconds of the whole process; rates subtract each side's start-up (the same image with n=1, shown in "
          "--json); QEMU's rate uses deja's instruction count)")
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
