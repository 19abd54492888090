#!/usr/bin/env python3
"""Cost of reaching coordinates with a PMU-like counter: replay time per skid, as a ratio to the exact counter's replay.

One recording per guest (interp, exact mode); each is replayed with the exact counter and with emulated PMUs of
growing skid (`--progress emulated-pmu:N`), best of --repeat. The ratio is what a skid costs in breakpoint hits and
single steps; on KVM each of those is a VM exit, so the counts printed matter more there than interp's time.
Usage: bench/seek_bench.py [--build build] [--repeat 3] [--skids 100,10000,1000000000]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time


def timed(cmd):
    start = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return time.monotonic() - start, p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skids", default="100,10000,1000000000")
    args = ap.parse_args()
    deja = os.path.join(args.build, "deja")
    guests = os.path.join(args.build, "guest-tests")
    tmp = tempfile.mkdtemp(prefix="deja-seek-bench-")
    cases = [("threads-race", []), ("timer", [])]
    print(f"{'guest':<14}{'counter':<26}{'replay s':>10}{'ratio':>8}  seeking work")
    for name, opts in cases:
        trace = os.path.join(tmp, name + ".trace")
        rec = subprocess.run([deja, "record", "--backend", "interp", "-o", trace, *opts, os.path.join(guests, name + ".elf")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if rec.returncode != 1:
            sys.exit(f"recording {name} failed: {rec.stderr.decode(errors='replace')}")
        base = None
        for counter in ["exact"] + [f"emulated-pmu:{s}:1" for s in args.skids.split(",")]:
            runs = [timed([deja, "replay", "--stats", "--progress", counter, trace]) for _ in range(args.repeat)]
            t, p = min(runs, key=lambda r: r[0])
            if p.returncode != 1:
                sys.exit(f"replay of {name} with {counter} failed: {p.stderr.decode(errors='replace')}")
            m = re.search(rb"\): (\d+) reached, (\d+) counter overflows, (\d+) breakpoint hits, (\d+) single steps", p.stderr)
            work = (f"{int(m.group(1))} targets, {int(m.group(2))} overflows, {int(m.group(3))} breakpoint hits, "
                    f"{int(m.group(4))} single steps") if m else "?"
            base = base or t
            print(f"{name:<14}{counter:<26}{t:10.3f}{t / base:8.2f}  {work}")


if __name__ == "__main__":
    main()
