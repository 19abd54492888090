#!/usr/bin/env python3
"""Recordings cut short from outside (issue 21): a host failure and an interrupt both end the trace properly.

host-failure: a guest flooding COM1 recorded with --serial-out on a full file system (a small tmpfs in a mount
  namespace; where there is none, a file-size limit that the serial output reaches long before the trace does). `record` exits 10 naming the failure; the trace is complete: `verify`
  says it is and that a host failure stopped the recording, `inspect` gives the reason, the real instruction count and
  the wall time, and `replay` goes to where the recording stopped, says why, and exits 12 (never 6 against an End at
  rip 0).
wall-time: an interrupted recording keeps its wall time (inspect showed 0.000 s).
"""
import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run(args, timeout=300, **kw):
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        fail(f"hang: {' '.join(args)}")
    if r.returncode < 0:
        fail(f"crash: {' '.join(args)} died with signal {-r.returncode}\n{r.stderr}")
    return r


def inspect_duration(deja, trace):
    doc = json.loads(run([deja, "inspect", "--json", trace]).stdout)
    return doc["duration"]


def host_failure(deja, hostile, tmp):
    trace = os.path.join(tmp, "flood.trace")
    flood = [deja, "record", "--mem", "4M", "-o", trace, "--backend", "interp"]
    small = os.path.join(tmp, "small")
    os.mkdir(small)
    # A full file system: a 128 KiB tmpfs for the serial output, mounted in a mount namespace of the recording's own
    # (it goes away with it).
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "-o", "size=128k",
                            "tmpfs", small], capture_output=True)
    if probe.returncode == 0:
        rec = run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   'mount -t tmpfs -o size=128k tmpfs "$0" && exec "$@"', small,
                   *flood, "--serial-out", os.path.join(small, "flood.out"), os.path.join(hostile, "serial-flood.elf")],
                  timeout=300)
        words = "No space left on device"
    else:
        # No mount namespace here: a file-size limit the serial output reaches long before the trace does (guest RAM is
        # a memory file under the same limit: --mem 4M fits).
        limit = 4 << 20

        def limited():
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        rec = run([*flood, "--serial-out", os.path.join(tmp, "flood.out"), os.path.join(hostile, "serial-flood.elf")],
                  preexec_fn=limited, timeout=600)
        words = "File too large"
    if rec.returncode != 10 or words not in rec.stderr:
        fail(f"record with a serial output that cannot be written: exit {rec.returncode}, expected 10 and '{words}'\n"
             f"{rec.stderr}")
    if not os.path.exists(trace) or os.path.exists(trace + ".partial"):
        fail(f"the trace was not finished (files: {os.listdir(tmp)})\n{rec.stderr}")
    v = run([deja, "verify", trace])
    if v.returncode != 0 or "stopped by a host failure" not in v.stdout:
        fail(f"verify: exit {v.returncode}, expected 0 saying a host failure stopped the recording\n{v.stdout}{v.stderr}")
    d = inspect_duration(deja, trace)
    if not d.get("reason", "").startswith("stopped by a host failure") or d.get("instructions", 0) == 0 or \
            d.get("wall_ns", 0) == 0:
        fail(f"inspect: expected the host failure's reason, the instructions run and the wall time: {d}")
    text = run([deja, "inspect", trace]).stdout
    if "stopped by a host failure" not in text:
        fail(f"inspect does not say the recording was stopped by a host failure:\n{text}")
    rep = run([deja, "replay", "--serial-out", "/dev/null", trace])
    if rep.returncode != 12 or "stopped by a host failure" not in rep.stderr or "replay OK" not in rep.stderr:
        fail(f"replay: exit {rep.returncode}, expected 12 with 'stopped by a host failure' and 'replay OK'\n{rep.stderr}")
    print("host failure:", rec.stderr.strip().splitlines()[-1][:160])
    print("  verify:", v.stdout.strip()[-120:])
    print("  replay:", rep.stderr.strip().splitlines()[-1][:160])


def wall_time(deja, hostile, tmp):
    trace = os.path.join(tmp, "spin.trace")
    p = subprocess.Popen([deja, "record", "-o", trace, "--backend", "interp", os.path.join(hostile, "cli-spin.elf")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    if p.returncode != 12:
        fail(f"interrupted recording: exit {p.returncode}\n{err}")
    d = inspect_duration(deja, trace)
    if d.get("wall_ns", 0) < 500_000_000:
        fail(f"an interrupted recording of 1.5 s shows a wall time of {d.get('wall_ns')} ns: {d}")
    text = run([deja, "inspect", trace]).stdout
    m = re.search(r"wall time ([0-9.]+) s", text)
    if not m or float(m.group(1)) < 0.5:
        fail(f"inspect of an interrupted recording: {text}")
    print(f"interrupted recording: wall time {m.group(1)} s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--hostile", required=True)
    ap.add_argument("case", choices=["host-failure", "wall-time"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (host_failure if args.case == "host-failure" else wall_time)(args.deja, args.hostile, tmp)
    print("PASS")


if __name__ == "__main__":
    main()
