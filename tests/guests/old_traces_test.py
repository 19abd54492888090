#!/usr/bin/env python3
"""Replays the traces recorded by earlier versions of deja (tests/guests/old-traces): each must replay exactly."""
import argparse
import lzma
import os
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--deja", required=True)
ap.add_argument("--traces", required=True)
args = ap.parse_args()

failures = 0
with tempfile.TemporaryDirectory() as tmp:
    for name in sorted(os.listdir(args.traces)):
        if not name.endswith(".trace"):
            continue
        # A trace is named after its guest, with what distinguishes it after a dash (cpuid-x86-64-v1.trace).
        stem = name[: -len(".trace")]
        guest = max((g[: -len(".elf.xz")] for g in os.listdir(args.traces) if g.endswith(".elf.xz")
                     and (stem == g[: -len(".elf.xz")] or stem.startswith(g[: -len(".elf.xz")] + "-"))), key=len)
        image = os.path.join(tmp, guest + ".elf")
        with lzma.open(os.path.join(args.traces, guest + ".elf.xz")) as src, open(image, "wb") as dst:
            dst.write(src.read())
        trace = os.path.join(args.traces, name)
        for cmd, want in ((["verify", trace], 0),
                          (["replay", "--backend", "interp", "--image", image, "--serial-out", os.devnull, trace], 1)):
            p = subprocess.run([args.deja] + cmd, capture_output=True, text=True, timeout=600)
            ok = p.returncode == want and (cmd[0] != "replay" or "replay OK" in p.stderr)
            print(f"{'ok  ' if ok else 'FAIL'} deja {cmd[0]} {name}: status {p.returncode}")
            if not ok:
                failures += 1
                sys.stderr.write(p.stdout + p.stderr)
sys.exit(1 if failures else 0)
