#!/usr/bin/env python3
"""Segments through the binary on the local executor: record --checkpoint-every and deja index make checkpoints that a
segmented verify chains from the start to the End; plan/segment/merge by hand; a damaged checkpoint is refused by
name and the merge names the segment; SIGTERM to a local job stops its workers and leaves none behind."""
import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--deja", required=True)
ap.add_argument("--guests", required=True)
args = ap.parse_args()
failed = []


def run(*argv, timeout=600):
    return subprocess.run([args.deja, *argv], capture_output=True, text=True, timeout=timeout)


def check(name, ok, r):
    print(("ok   " if ok else "FAIL ") + name)
    if not ok:
        failed.append(name)
        print(r.stdout[-2000:], r.stderr[-3000:])


with tempfile.TemporaryDirectory() as work:
    guest = os.path.join(args.guests, "cpu-bound.elf")
    trace = os.path.join(work, "t.trace")
    # Recording takes checkpoints at the top of a turn (a guest exit): threads-race's timer makes many.
    racy = os.path.join(work, "race.trace")
    r = run("record", "--backend", "interp", "-o", racy, "--checkpoint-every", "500K",
            os.path.join(args.guests, "threads-race.elf"))
    check("record --checkpoint-every writes TRACE.ckpt", os.path.isdir(racy + ".ckpt") and
          len(os.listdir(racy + ".ckpt")) >= 2, r)
    for jobs in ("1", "2"):
        r = run("verify", racy, "--replay", "-j", jobs, timeout=300)
        check(f"verify --replay -j{jobs} chains recorded checkpoints",
              r.returncode == 0 and "state digests chain" in r.stderr, r)
    r = run("record", "--backend", "interp", "-o", trace, guest)

    r = run("index", trace, "--every", "100M", "-o", os.path.join(work, "idx.ckpt"))
    check("deja index", r.returncode == 0 and len(os.listdir(os.path.join(work, "idx.ckpt"))) >= 3, r)
    wd = os.path.join(work, "job")
    r = run("plan", trace, "--checkpoints", os.path.join(work, "idx.ckpt"), "--segments", "3", "--workdir", wd)
    check("deja plan --segments 3", r.returncode == 0 and "segment 2:" in r.stdout, r)
    manifest = os.path.join(wd, "manifest.json")
    n = r.stdout.count("segment ")
    for i in range(n):
        s = run("segment", manifest, "--index", str(i))
        check(f"deja segment --index {i}", s.returncode == 0, s)
    r = run("merge", manifest)
    check("deja merge proves the whole trace", r.returncode == 0 and "OK:" in r.stderr, r)
    # A segment that starts from a checkpoint does not load the guest image, but still checks it against the trace.
    with open(manifest) as f:
        planned = f.read()
    changed = os.path.join(work, "changed.elf")
    with open(guest, "rb") as f:
        image = bytearray(f.read())
    image[-1] ^= 0xFF
    with open(changed, "wb") as f:
        f.write(image)
    for name, path in (("a changed", changed), ("a missing", os.path.join(work, "missing.elf"))):
        edited = json.loads(planned)
        edited["inputs"][0]["path"] = path
        with open(manifest, "w") as f:
            json.dump(edited, f)
        s = run("segment", manifest, "--index", "1")
        check(f"a segment from a checkpoint refuses {name} guest image by name", s.returncode == 2 and path in s.stderr, s)
    with open(manifest, "w") as f:
        f.write(planned)

    # One segment's result removed: the merge says which is missing.
    os.unlink(os.path.join(wd, "results", "item-1.json"))
    r = run("merge", manifest)
    check("merge names a missing segment", r.returncode != 0 and "segment 1" in r.stderr, r)

    # SIGTERM to deja while its workers run: forwarded to them, every one waited for, status 12 (interrupted).
    killed = os.path.join(work, "killed")
    job = subprocess.Popen([args.deja, "verify", trace, "--replay", "--checkpoints", os.path.join(work, "idx.ckpt"),
                            "--segments", "2", "-j", "2", "--workdir", killed],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while job.poll() is None and time.monotonic() < deadline and \
            len(glob.glob(os.path.join(killed, "logs", "item-*.log"))) < 2:
        time.sleep(0.02)
    job.send_signal(signal.SIGTERM)
    out, err = job.communicate(timeout=60)
    manifest = os.path.join(killed, "manifest.json")

    def workers_left():
        left = []
        for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                if manifest.encode() in open(cmdline, "rb").read():
                    left.append(cmdline.split("/")[2])
            except OSError:
                pass  # ended while we looked
        return left
    left = workers_left()
    r = subprocess.CompletedProcess(job.args, job.returncode, out, err + f"\nworkers left: {left}")
    check("SIGTERM stops the local executor's workers, waits for them and ends with status 12",
          job.returncode == 12 and "stopping 2 workers" in err and not left, r)

    # A damaged checkpoint: refused by name, the failing segment named.
    ckpt = os.path.join(work, "idx.ckpt")
    victim = os.path.join(ckpt, sorted(os.listdir(ckpt))[0])
    with open(victim, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    r = run("verify", trace, "--replay", "--checkpoints", ckpt, "--segments", "3")
    check("damaged checkpoint refused by name", victim in r.stderr, r)
print(f"{len(failed)} failed")
sys.exit(1 if failed else 0)
