#!/usr/bin/env python3
"""Soak: record the soak guest (PIT at 1000 Hz, serial input streamed through a FIFO, CMOS reads, a line a second) for
minutes of guest time, replay it, and check that it replays exactly and that deja's memory stays flat in both runs.

    bench/soak.py --build build [--seconds 600] [--backend interp]

Prints the record and replay times, trace size, events, and resident memory sampled every second (first minute's
peak against the last minute's peak): "flat" means the last is within 16 MiB of the first."""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

MiB = 1 << 20


def rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def sampled_run(cmd, **kw):
    """Runs cmd, sampling its RSS once a second; returns (returncode, stderr, seconds, samples)."""
    start = time.monotonic()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, **kw)
        samples = []
        while p.poll() is None:
            value = rss(p.pid)
            if value is not None:
                samples.append(value)
            time.sleep(1)
        err.seek(0)
        return p.returncode, err.read().decode(errors="replace"), time.monotonic() - start, samples


def flat(samples):
    if len(samples) < 4:
        return max(samples or [0]), max(samples or [0]), True
    window = max(1, min(60, len(samples) // 4))
    first, last = max(samples[:window]), max(samples[-window:])
    return first, last, last - first <= 16 * MiB


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--seconds", type=int, default=600, help="guest time to record")
    ap.add_argument("--backend", default="interp")
    ap.add_argument("--keep", help="directory to copy the trace and the replay's messages to when replay fails")
    args = ap.parse_args()
    deja = os.path.join(args.build, "deja")
    guest = os.path.join(args.build, "guest-tests", "soak.elf")
    with tempfile.TemporaryDirectory() as tmp:
        trace, fifo = os.path.join(tmp, "soak.trace"), os.path.join(tmp, "in.fifo")
        os.mkfifo(fifo)
        sent = [0]

        def feed():  # about 200 bytes a second, in small bursts, as a person or a slow peer would
            with open(fifo, "wb", buffering=0) as f:
                for i in range(args.seconds * 20):
                    try:
                        f.write(f"line {i:08d}\n".encode())
                        sent[0] += 14
                    except BrokenPipeError:
                        return
                    time.sleep(0.05)

        threading.Thread(target=feed, daemon=True).start()
        rc, err, rec_s, rec_rss = sampled_run([deja, "record", "-o", trace, "--backend", args.backend, "--serial-in",
                                               fifo, "--cmdline", f"seconds={args.seconds}", guest])
        if rc != 1:
            print(f"soak: recording exited {rc}:\n{err}", file=sys.stderr)
            return 1
        events = err.split("recorded ")[1].split()[0]
        rep_rc, rep_err, rep_s, rep_rss = sampled_run([deja, "replay", "--digest", trace])
        ok = rep_rc == 1 and "replay OK" in rep_err
        if not ok and args.keep:
            os.makedirs(args.keep, exist_ok=True)
            shutil.copy(trace, args.keep)
            with open(os.path.join(args.keep, "replay.err"), "w") as f:
                f.write(rep_err)
        size = os.path.getsize(trace)
        r_first, r_last, r_flat = flat(rec_rss)
        p_first, p_last, p_flat = flat(rep_rss)
        print(f"soak: {args.seconds} s of guest time on {args.backend}: {sent[0]} bytes of serial input streamed")
        print(f"  record  {rec_s:7.1f} s  {events} events, trace {size / 1024:.0f} KiB "
              f"({size / args.seconds:.0f} B/s of guest time)")
        print(f"  replay  {rep_s:7.1f} s  {'exact' if ok else 'FAILED'}: {rep_err.strip().splitlines()[-1]}")
        print(f"  RSS record: first minute {r_first / MiB:.1f} MiB, last minute {r_last / MiB:.1f} MiB, "
              f"max {max(rec_rss) / MiB:.1f} MiB: {'flat' if r_flat else 'GROWING'}")
        print(f"  RSS replay: first minute {p_first / MiB:.1f} MiB, last minute {p_last / MiB:.1f} MiB, "
              f"max {max(rep_rss or [0]) / MiB:.1f} MiB: {'flat' if p_flat else 'GROWING'}")
        return 0 if ok and r_flat and p_flat else 1


if __name__ == "__main__":
    sys.exit(main())
