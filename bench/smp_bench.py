#!/usr/bin/env python3
"""Several vCPUs (issue 23, docs/smp.md): the bundled Linux guest on the APIC PC with 1, 2 and 4 vCPUs, on deja's
software CPU and on QEMU TCG (-smp N, one thread and multi-threaded), in the same run; then the same workload
recorded and replayed with 1 and 2 vCPUs. Prints times and the ratios the issue's aims name:

  - boot to /init's marker: deja interp --cpus 2 / QEMU TCG -smp 2 thread=single (aim: <= 1x), 4 vCPUs and
    multi-threaded TCG beside it;
  - record / run and replay / record with 2 vCPUs (aims: <= 1.05x, <= 1x), replay with 2 vCPUs / with 1;
  - the trace with 2 vCPUs / with 1 (aim: <= 1.2x: the schedule costs no bytes).

QEMU boots with ACPI (its -smp guest finds its processors in the MADT; with acpi=off Linux would see one), deja
with the MP table. Usage: bench/smp_bench.py [--build build] [--repeat 1] [--skip boot,qemu,rr] [--json FILE]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "linux"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import linux_guest  # noqa: E402
from linux_boot_bench import boot  # noqa: E402  (seconds to /init's marker, total seconds, output)

BOOT_SCRIPT = "deja.script=ready"
RR_SCRIPT = "deja.script=smp deja.threads=2"  # the same workload on 1 and 2 vCPUs


def timed(argv, timeout=1800):
    t0 = time.monotonic()
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    return time.monotonic() - t0, p


def best_of(repeat, fn):
    runs = [fn() for _ in range(repeat)]
    return min(runs, key=lambda r: r[1] if r[0] is not None else float("inf"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--skip", default="", help="comma-separated: boot (deja's boots), qemu, rr")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    deja = os.path.join(build, "deja")
    guest_dir = os.path.join(build, "guest-linux")
    os.environ["DEJA_LINUX_GUEST_DIR"] = guest_dir
    skip = set(filter(None, args.skip.split(",")))
    boots, rr = {}, {}

    for cpus in (1, 2, 4) if "boot" not in skip else ():
        argv = [deja, "run", "--linux", "--machine", "pc-apic", "--stats", "--append", BOOT_SCRIPT]
        if cpus > 1:
            argv += ["--cpus", str(cpus), "--schedule-seed", "1"]
        marker, total, out = best_of(args.repeat, lambda: boot(argv))
        if marker is None:
            print(f"deja --cpus {cpus}: no marker; output ends:\n{out[-2000:]}")
        boots[f"deja-interp-{cpus}"] = {"marker_s": marker, "total_s": total}

    if "qemu" not in skip and shutil.which("qemu-system-x86_64"):
        tmp = tempfile.mkdtemp(prefix="deja-smp-bench-")
        kernel = open(os.path.join(guest_dir, "kernel.path")).read().strip()
        vmlinux = os.path.join(tmp, "vmlinux")
        if linux_guest.extract_vmlinux(kernel, vmlinux):
            cmdline = subprocess.run([deja, "run", "--linux", "--print-cmdline"], capture_output=True,
                                     text=True).stdout.strip().replace("acpi=off ", "")
            for cpus, threads in ((1, "single"), (2, "single"), (4, "single"), (2, "multi"), (4, "multi")):
                argv = linux_guest.qemu_argv(vmlinux, os.path.join(guest_dir, "initramfs.cpio"),
                                             f"{cmdline} {BOOT_SCRIPT}")
                argv[argv.index("-accel") + 1] = f"tcg,thread={threads}"
                argv[argv.index("-machine") + 1] = "pc"
                argv[argv.index("-cpu") + 1] = "qemu64"  # with its local APIC: the PIC-only CPU cannot start APs
                argv += ["-smp", str(cpus)]
                marker, total, _ = best_of(args.repeat, lambda: boot(argv))
                boots[f"qemu-tcg-{threads}-{cpus}"] = {"marker_s": marker, "total_s": total}
        shutil.rmtree(tmp, ignore_errors=True)

    if "rr" not in skip:
        tmp = tempfile.mkdtemp(prefix="deja-smp-bench-rr-")
        for cpus in (1, 2):
            smp = ["--cpus", str(cpus), "--schedule-seed", "1"] if cpus > 1 else []
            common = ["--linux", "--machine", "pc-apic", *smp, "--append", RR_SCRIPT]
            run_s, _ = best_of(args.repeat, lambda: timed([deja, "run", *common]))
            trace = os.path.join(tmp, f"smp{cpus}.trace")
            record_s, rec = best_of(args.repeat, lambda: timed([deja, "record", "-o", trace, *common]))
            replay_s, rep = best_of(args.repeat, lambda: timed([deja, "replay", trace]))
            ok = rec.returncode == 1 and rep.returncode == 1 and "replay OK" in rep.stderr
            race = re.search(r"smp-race: .*", rec.stdout)
            rr[cpus] = {"run_s": run_s, "record_s": record_s, "replay_s": replay_s, "trace_bytes": os.path.getsize(trace),
                        "replay_ok": ok, "workload": race.group(0) if race else None}
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{'boot (pc-apic)':24} {'to marker':>10} {'total':>8}")
    for name, fig in boots.items():
        m = f"{fig['marker_s']:.2f}s" if fig["marker_s"] else "failed"
        print(f"{name:24} {m:>10} {fig['total_s']:>7.2f}s")

    def ratio(a, b):
        fa, fb = boots.get(a), boots.get(b)
        if fa and fb and fa["marker_s"] and fb["marker_s"]:
            print(f"  {a} / {b}: {fa['marker_s'] / fb['marker_s']:.2f}x")

    ratio("deja-interp-2", "qemu-tcg-single-2")
    ratio("deja-interp-4", "qemu-tcg-single-4")
    ratio("deja-interp-2", "qemu-tcg-multi-2")
    ratio("deja-interp-4", "qemu-tcg-multi-4")
    ratio("deja-interp-1", "qemu-tcg-single-1")
    ratio("deja-interp-2", "deja-interp-1")
    for cpus, fig in rr.items():
        print(f"record/replay --cpus {cpus}: run {fig['run_s']:.2f}s, record {fig['record_s']:.2f}s, replay "
              f"{fig['replay_s']:.2f}s, trace {fig['trace_bytes']} bytes, replay OK: {fig['replay_ok']}; "
              f"{fig['workload']}")
        print(f"  record / run {fig['record_s'] / fig['run_s']:.2f}x, replay / record "
              f"{fig['replay_s'] / fig['record_s']:.2f}x")
    if 1 in rr and 2 in rr:
        print(f"  2 vCPUs / 1: replay {rr[2]['replay_s'] / rr[1]['replay_s']:.2f}x, "
              f"trace {rr[2]['trace_bytes'] / rr[1]['trace_bytes']:.2f}x")
    if args.json:
        json.dump({"boots": boots, "rr": rr}, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
