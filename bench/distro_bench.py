#!/usr/bin/env python3
"""The distro guests (guest-distro/, docs/distro.md) on deja against QEMU TCG, in the same run, on the same files.

Workloads:
  systemd  Debian 12's kernel and initrd boot the Debian root file system to systemd's multi-user.target, where
           deja-ready.service prints its marker and ends the machine (issue 22's first aim: on deja's default model,
           replayed exactly, no slower than QEMU TCG).
  glibc    the distro initramfs runs the glibc workload (Debian's dynamic programs: sort, grep, sed, awk, perl, gzip,
           xz, bzip2, sha256sum, find, tar) in the same root file system, ROUNDS times (issue 22's aim: >= 1x QEMU
           TCG -cpu max).

For each: QEMU TCG's time, deja's run, record and replay times, each as wall and CPU seconds (user + system of the
machine's process; this 2-core machine is shared, so CPU time is the steadier measure), and the ratios QEMU time /
deja time (above 1: deja is faster). The trace size and deja's instruction count come along. Best of --repeat.

Before deja's default CPU model has MMX, Debian's glibc refuses to run on it; --zero-isa-markers measures a
diagnostic copy of the files (the ISA markers zeroed, on both machines) so figures exist now. Rerun without it after
the CPU models land:  bench/distro_bench.py --build build [--only systemd|glibc] [--repeat 3] [--json FILE]
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "distro"))
import distro_test  # noqa: E402


def measured(argv, log_path, timeout=3600):
    """Runs a machine to its end; returns (wall s, cpu s, exit status, console + messages text)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        status = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, status, open(log_path, "rb").read().decode(errors="replace")


def best(repeat, fn):
    return min((fn() for _ in range(repeat)), key=lambda r: r[1])


def expect(ok, what, text):
    if not ok:
        sys.exit(f"{what}; output ends:\n{text[-3000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--only", default="systemd,glibc")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=8, help="glibc workload rounds")
    ap.add_argument("--qemu-cpu", default="max")
    ap.add_argument("--zero-isa-markers", action="store_true", help="diagnostic copy of the files (see above)")
    ap.add_argument("--no-replay", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    tmp = tempfile.mkdtemp(prefix="deja-distro-bench-")
    results = {}
    for guest in [g for g in args.only.split(",") if g]:
        opts = argparse.Namespace(guest=guest, deja=os.path.join(build, "deja"),
                                  guest_dir=os.path.join(build, "guest-distro"),
                                  zero_isa_markers=args.zero_isa_markers, qemu_cpu=args.qemu_cpu, mem="512M",
                                  rounds=args.rounds, timeout=3600)
        if not args.zero_isa_markers:
            lacking = distro_test.default_model_lacks_baseline(
                argparse.Namespace(deja=opts.deja, cpuid_guest=os.path.join(build, "guest-tests", "cpuid.elf")))
            if lacking:
                sys.exit(f"deja's default CPU model lacks {'; and '.join(lacking)}: Debian's glibc cannot run on it; "
                         "measure the diagnostic copy with --zero-isa-markers")
        kernel, initrd, image = distro_test.guest_files(opts)
        # deja-ready.service prints its marker and ends the machine (status 1) only after multi-user.target.
        done = re.compile(re.escape(distro_test.SYSTEMD_MARKER) if guest == "systemd" else r"^@@end", re.M)
        print(f"== {guest}: {kernel}, {initrd}, {image}" + (" (ISA markers zeroed: diagnostic)"
                                                              if args.zero_isa_markers else ""), flush=True)
        fig = {}
        wall, cpu, status, out = best(args.repeat, lambda: measured(
            distro_test.qemu_argv(opts, kernel, initrd, image), os.path.join(tmp, f"{guest}-qemu.log")))
        expect(done.search(out) and status == 1, f"qemu: {guest} did not finish (status {status})", out)
        fig["qemu"] = {"wall_s": wall, "cpu_s": cpu}
        trace = os.path.join(tmp, f"{guest}.trace")
        overlay = os.path.join(tmp, f"{guest}-overlay.img")
        for kind in ("run", "record"):
            def deja_once():
                if os.path.exists(overlay):
                    os.unlink(overlay)
                argv = distro_test.deja_argv(opts, kernel, initrd, image, trace, overlay)
                if kind == "run":
                    argv = [argv[0], "run"] + argv[4:]  # the same options without `record -o TRACE`
                return measured(argv, os.path.join(tmp, f"{guest}-deja-{kind}.log"))
            wall, cpu, status, out = best(args.repeat, deja_once)
            expect(done.search(out) and status == 1, f"deja {kind}: {guest} did not finish (status {status})", out)
            m = re.search(r"instructions retired: (\d+)", out)
            fig[f"deja_{kind}"] = {"wall_s": wall, "cpu_s": cpu, "instructions": int(m.group(1)) if m else None}
        fig["trace_bytes"] = os.path.getsize(trace)
        if not args.no_replay:
            wall, cpu, status, out = best(args.repeat, lambda: measured(
                [opts.deja, "replay", trace, "--stats"], os.path.join(tmp, f"{guest}-replay.log")))
            expect(status == 1 and "replay OK" in out, f"deja replay: {guest} did not replay exactly", out)
            fig["deja_replay"] = {"wall_s": wall, "cpu_s": cpu}
        results[guest] = fig

    print()
    print(f"{'workload':9} {'instructions':>13} {'trace':>9}  {'machine':12} {'wall s':>8} {'cpu s':>8} "
          f"{'qemu/deja wall':>15} {'qemu/deja cpu':>14}")
    for guest, fig in results.items():
        q = fig["qemu"]
        first = True
        for kind in ("qemu", "deja_run", "deja_record", "deja_replay"):
            if kind not in fig:
                continue
            e = fig[kind]
            head = (f"{guest:9} {fig['deja_run']['instructions'] or '-':>13} {fig['trace_bytes'] // 1024:>7}K"
                    if first else f"{'':9} {'':>13} {'':>8}")
            ratios = "" if kind == "qemu" else (f"{q['wall_s'] / e['wall_s']:>14.2f}x "
                                                f"{q['cpu_s'] / max(e['cpu_s'], 1e-6):>13.2f}x")
            print(f"{head}  {kind.replace('_', ' '):12} {e['wall_s']:>8.1f} {e['cpu_s']:>8.1f} {ratios}")
            first = False
    print(f"(QEMU TCG -cpu {args.qemu_cpu}; deja interp, its default CPU model; ratios above 1: deja is faster"
          + ("; DIAGNOSTIC: ISA markers zeroed" if args.zero_isa_markers else "") + ")")
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
