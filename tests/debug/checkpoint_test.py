#!/usr/bin/env python3
"""Checkpoints over long traces: `deja debug --verify-checkpoints` replays to the end taking checkpoints, restores
each one and checks that replaying from it reproduces the next one's state digest, and that dropping them changes
nothing. Runs on threads-race (timer interrupts, context switches, SSE) and cpu-bound, exact and exit-sync."""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--deja", required=True)
ap.add_argument("--guests", required=True)
ap.add_argument("--backend", default="interp")
args = ap.parse_args()
failed = []
SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "guest-tests")
# (guest, record options, checkpoint interval, debug options); --checkpoint-by-events is KVM's time axis.
cases = [("threads-race", [], "500000", []), ("threads-race", ["--progress", "exit-sync"], "400000", []),
         ("cpu-bound", ["--cmdline", "n=100000"], "100000", []),
         ("serial-echo", ["--serial-in", os.path.join(SOURCES, "serial-echo.input")], "8", ["--checkpoint-by-events"]),
         ("threads-race", ["--progress", "exit-sync"], "20", ["--checkpoint-by-events"]),
         # Thinned out under a small --checkpoint-memory: still exact.
         ("threads-race", [], "250000", ["--checkpoint-memory", "1000K"])]
with tempfile.TemporaryDirectory() as work:
    for guest, extra, interval, debug_extra in cases:
        trace = os.path.join(work, f"{guest}-{len(debug_extra)}-{len(extra)}.trace")
        if os.path.exists(trace):
            os.unlink(trace)
        r = subprocess.run([args.deja, "record", "--backend", "interp", "-o", trace, *extra,
                            os.path.join(args.guests, guest + ".elf")], capture_output=True, text=True, timeout=600)
        if not os.path.exists(trace):
            sys.exit(f"recording {guest} failed: {r.stderr}")
        v = subprocess.run([args.deja, "debug", trace, "--backend", args.backend, "--verify-checkpoints",
                            "--checkpoint-interval", interval, *debug_extra], capture_output=True, text=True, timeout=900)
        m = re.search(r"checkpoints verified: (\d+) checkpoints over (\d+) (\w+), (\d+) mismatches", v.stderr)
        ok = v.returncode == 0 and m and int(m.group(1)) >= 10 and m.group(4) == "0"
        if "--checkpoint-memory" in debug_extra:
            t = re.search(r"(\d+) thinned out", v.stderr)
            ok = ok and t and int(t.group(1)) > 0
        print(("ok   " if ok else "FAIL ") + f"{guest} {' '.join(extra[:2])} {' '.join(debug_extra)}: {v.stderr.strip().splitlines()[-1] if v.stderr.strip() else v.returncode}")
        if not ok:
            failed.append(guest)
            print(v.stderr[-3000:])
print(f"{len(cases) - len(failed)} passed, {len(failed)} failed")
sys.exit(1 if failed else 0)
