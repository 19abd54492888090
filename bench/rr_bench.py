#!/usr/bin/env python3
"""deja benchmarks: software-CPU speed against QEMU TCG, and record/replay cost against QEMU's record/replay.

Every figure is a ratio against a peer measured in the same run, so a noisy shared machine affects both sides.
Usage: bench/rr_bench.py [--build build] [--backend interp|kvm] [--n ITERATIONS] [--repeat 3]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time


def timed(cmd, stdin=None, timeout=3600):
    start = time.monotonic()
    p = subprocess.run(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return time.monotonic() - start, p


def best_of(repeat, fn):
    results = [fn() for _ in range(repeat)]
    return min(results, key=lambda r: r[0])


def qemu_cmd(image, append, extra=()):
    return ["qemu-system-x86_64", "-accel", "tcg", "-m", "256M", "-kernel", image, "-append", append,
            "-device", "isa-debug-exit,iobase=0xf4,iosize=4", "-serial", "stdio", "-display", "none",
            "-no-reboot", *extra]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--backend", default="interp")
    ap.add_argument("--n", type=int, default=6_000_000, help="cpu-bound iterations (16.5 instructions each)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    deja = os.path.join(args.build, "deja")
    guests = os.path.join(args.build, "guest-tests")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "guest-tests")
    have_qemu = shutil.which("qemu-system-x86_64") is not None
    tmp = tempfile.mkdtemp(prefix="deja-bench-")

    # 1. Software CPU speed: cpu-bound on deja vs QEMU TCG, the same image and argument.
    image = os.path.join(guests, "cpu-bound.elf")
    append = f"n={args.n}"
    t_deja, p = best_of(args.repeat, lambda: timed([deja, "run", "--backend", args.backend, "--stats",
                                                     "--cmdline", append, image]))
    m = re.search(rb"instructions retired: (\d+)", p.stderr)
    instructions = int(m.group(1)) if m else int(args.n * 16.5)
    print(f"cpu-bound n={args.n}: {instructions} instructions")
    print(f"  deja {args.backend:<7} {t_deja:8.3f} s  {instructions / t_deja / 1e6:8.1f} M instructions/s")
    if have_qemu:
        t_qemu, _ = best_of(args.repeat, lambda: timed(qemu_cmd(image, append)))
        print(f"  qemu tcg     {t_qemu:8.3f} s  {instructions / t_qemu / 1e6:8.1f} M instructions/s")
        print(f"  ratio deja/qemu speed: {t_qemu / t_deja:.2f}x")

    # 2. Record/replay cost per guest.
    workloads = [
        ("cpu-bound", append, None),
        ("timer", "", None),
        ("serial-echo", "", os.path.join(src, "serial-echo.input")),
    ]
    print()
    print(f"{'guest':<12} {'run s':>8} {'record s':>9} {'replay s':>9} {'rec/run':>8} {'rep/rec':>8} "
          f"{'trace B':>9} {'B/s':>9} {'B/Minstr':>9} | {'qemu rec s':>10} {'qemu B':>9}")
    for name, cmdline, serial_in in workloads:
        img = os.path.join(guests, name + ".elf")
        base = [deja]
        opts = ["--backend", args.backend, "--cmdline", cmdline]
        if serial_in:
            opts += ["--serial-in", serial_in]
        trace = os.path.join(tmp, name + ".trace")
        t_run, _ = best_of(args.repeat, lambda: timed(base + ["run", *opts, img]))
        t_rec, p = best_of(args.repeat, lambda: timed(base + ["record", "-o", trace, *opts, img]))
        t_rep, r = best_of(args.repeat, lambda: timed(base + ["replay", trace]))
        if r.returncode != p.returncode:
            print(f"  {name}: replay exit {r.returncode} != record exit {p.returncode}: {r.stderr.decode()[-500:]}")
        size = os.path.getsize(trace)
        st = subprocess.run([deja, "run", "--stats", *opts, img], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        m = re.search(rb"instructions retired: (\d+)", st.stderr)
        minstr = int(m.group(1)) / 1e6 if m else float("nan")
        qemu_rec, qemu_size = float("nan"), 0
        if have_qemu:
            rr = os.path.join(tmp, name + ".qemu-rr")
            stdin = open(serial_in, "rb") if serial_in else subprocess.DEVNULL
            qemu_rec, _ = timed(qemu_cmd(img, cmdline, ["-icount", f"shift=auto,rr=record,rrfile={rr}"]), stdin=stdin)
            qemu_size = os.path.getsize(rr) if os.path.exists(rr) else 0
        print(f"{name:<12} {t_run:8.3f} {t_rec:9.3f} {t_rep:9.3f} {t_rec / t_run:8.3f} {t_rep / t_rec:8.3f} "
              f"{size:9d} {size / t_rec:9.0f} {size / minstr if minstr else 0:9.1f} | {qemu_rec:10.3f} {qemu_size:9d}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
