#!/usr/bin/env python3
"""The cost of RDTSC exits with the kvm-deja module: the nondet and tsc-loop guests on nested KVM, with and without it.

Boots scripts/kvm-nested.sh twice (stock KVM, then --kvm-deja) and inside each runs, best of --repeat:
  - nondet:   `deja run` and `deja record` (2 RDTSCs; the rest of the run is the same in both boots)
  - tsc-loop: `deja run` with n=0 and n=N RDTSC reads; (t(N) - t(0)) / N is the cost of one RDTSC
and prints a table with the ratio kvm-deja / stock. On stock KVM an RDTSC does not leave the guest, so the ratio
is the price of exact replay; under the nested harness every exit is emulated by QEMU, so absolute figures are
far above real hardware (docs/kvm.md measured 47-72 us per port-I/O exit here).

Usage: bench/kvm_deja_bench.py [--build build] [--n 20000] [--repeat 3]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def timed(cmd, env=None):
    start = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    return time.monotonic() - start, p


def best(repeat, cmd, expect=1):
    times = []
    for _ in range(repeat):
        t, p = timed(cmd)
        if p.returncode != expect:
            raise SystemExit(f"{' '.join(cmd)}: exit status {p.returncode}, expected {expect}\n"
                             f"{p.stderr.decode(errors='replace')[-2000:]}")
        times.append(t)
    return min(times), p


def inside(args):
    """Runs in the nested guest: measures, writes JSON."""
    deja = os.path.join(args.build, "deja")
    guests = os.path.join(args.build, "guest-tests")
    nondet = os.path.join(guests, "nondet.elf")
    loop = os.path.join(guests, "tsc-loop.elf")
    trace = os.path.join(args.work, "bench.trace")
    base = [deja, "run", "--backend", "kvm", "--mem", "16M"]
    r = {}
    r["nondet_run"], _ = best(args.repeat, base + [nondet])
    r["nondet_record"], _ = best(args.repeat, [deja, "record", "-o", trace, "--backend", "kvm", "--mem", "16M",
                                               nondet])
    r["loop0_run"], _ = best(args.repeat, base + ["--cmdline", "n=0", loop])
    r["loopN_run"], p = best(args.repeat, base + ["--stats", "--cmdline", f"n={args.n}", loop])
    r["loop_stats"] = p.stderr.decode(errors="replace")[-1500:]
    r["loop0_record"], _ = best(args.repeat, [deja, "record", "-o", trace, "--backend", "kvm", "--mem", "16M",
                                              "--cmdline", "n=0", loop])
    r["loopN_record"], _ = best(args.repeat, [deja, "record", "-o", trace, "--backend", "kvm", "--mem", "16M",
                                              "--cmdline", f"n={args.n}", loop])
    r["trace_bytes"] = os.path.getsize(trace)
    t, p = timed([deja, "replay", "--backend", "kvm", trace])
    r["loopN_replay"] = t
    r["replay_status"] = p.returncode
    r["module"] = os.path.exists("/sys/module/kvm/parameters/deja_rdtsc")
    with open(os.path.join(args.work, f"result-{args.mode}.json"), "w") as f:
        json.dump(r, f)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--n", type=int, default=20000, help="RDTSC reads of the tsc-loop guest")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="", help=argparse.SUPPRESS)
    ap.add_argument("--work", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    if args.inside:
        return inside(args)

    work = tempfile.mkdtemp(prefix="kvm-deja-bench-", dir=args.build)
    boots = {}
    for mode in ("stock", "kvm-deja"):
        cmd = [os.path.join(ROOT, "scripts", "kvm-nested.sh"), "--timeout", "3000", "--share", args.build]
        if mode == "kvm-deja":
            cmd += ["--kvm-deja", "--kvm-deja-cache", os.path.join(args.build, "kvm-deja")]
        cmd += ["--", sys.executable, os.path.abspath(__file__), "--inside", "--mode", mode, "--work", work,
                "--build", args.build, "--n", str(args.n), "--repeat", str(args.repeat)]
        t, p = timed(cmd)
        boots[mode] = t
        if p.returncode != 0:
            sys.stderr.write(p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace"))
            raise SystemExit(f"the {mode} boot failed (status {p.returncode})")
    res = {m: json.load(open(os.path.join(work, f"result-{m}.json"))) for m in ("stock", "kvm-deja")}
    s, d = res["stock"], res["kvm-deja"]
    if s["module"] or not d["module"]:
        raise SystemExit(f"wrong modules: stock boot has kvm-deja={s['module']}, kvm-deja boot has {d['module']}")

    def per_read(r, kind):
        return (r[f"loopN_{kind}"] - r[f"loop0_{kind}"]) / args.n * 1e6

    print(f"kvm-deja RDTSC exit cost, nested KVM under QEMU TCG (best of {args.repeat}; n={args.n} RDTSCs)")
    print(f"{'':<34}{'stock KVM':>12}{'kvm-deja':>12}{'ratio':>9}")
    rows = [("nondet: deja run (s)", s["nondet_run"], d["nondet_run"]),
            ("nondet: deja record (s)", s["nondet_record"], d["nondet_record"]),
            (f"tsc-loop n=0: deja run (s)", s["loop0_run"], d["loop0_run"]),
            (f"tsc-loop n={args.n}: deja run (s)", s["loopN_run"], d["loopN_run"]),
            (f"tsc-loop n={args.n}: deja record (s)", s["loopN_record"], d["loopN_record"]),
            ("one RDTSC, deja run (us)", per_read(s, "run"), per_read(d, "run")),
            ("one RDTSC, deja record (us)", per_read(s, "record"), per_read(d, "record"))]
    for label, a, b in rows:
        ratio = f"{b / a:8.1f}x" if a > 1e-9 else "     n/a"
        print(f"{label:<34}{a:12.3f}{b:12.3f}{ratio}")
    print(f"kvm-deja: tsc-loop n={args.n} trace {d['trace_bytes']} bytes "
          f"({(d['trace_bytes'] / args.n):.1f} bytes per RDTSC); its replay on KVM took {d['loopN_replay']:.2f} s "
          f"(status {d['replay_status']})")
    print(f"harness boots: stock {boots['stock']:.0f} s, kvm-deja {boots['kvm-deja']:.0f} s (including the "
          f"module build when not cached)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
