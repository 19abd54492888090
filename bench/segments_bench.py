#!/usr/bin/env python3
"""Segmented verify against one sequential replay of the same trace (cpu-bound, interp): prints the wall times and the
ratio for 1, 2 and 4 local workers, and the cost of `deja index`. On a 2-core machine the speedup is bounded by 2."""
import argparse
import os
import subprocess
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--deja", required=True)
ap.add_argument("--guests", required=True)
ap.add_argument("--iterations", default="200000000")
ap.add_argument("--segments", default="4")
args = ap.parse_args()


def timed(*argv):
    t = time.monotonic()
    r = subprocess.run([args.deja, *argv], capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise SystemExit(f"{argv[0]} failed ({r.returncode}): {r.stderr[-2000:]}")
    return time.monotonic() - t


with tempfile.TemporaryDirectory() as work:
    trace = os.path.join(work, "t.trace")
    timed("record", "--backend", "interp", "-o", trace, "--cmdline", f"n={args.iterations}",
          os.path.join(args.guests, "cpu-bound.elf"))
    sequential = timed("replay", trace)
    index = timed("index", trace, "--every", "250M")
    print(f"sequential replay {sequential:.2f} s; deja index {index:.2f} s ({index / sequential:.2f}x a replay)")
    for j in (1, 2, 4):
        t = timed("verify", trace, "--replay", "-j", str(j), "--segments", args.segments)
        print(f"-j{j}: {t:.2f} s, speedup {sequential / t:.2f}x over one sequential replay")
