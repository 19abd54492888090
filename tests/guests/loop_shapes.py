#!/usr/bin/env python3
"""Time travel on loops without a conditional branch (issue 21): `deja query --at end|10|event:2` and a gdb `continue`
answer on traces whose events land in such loops, in time comparable to `deja replay` of the same trace.

One case per loop shape and progress mode: the hostile guest is recorded on the software CPU for two seconds and
stopped with SIGINT; `deja replay` of it is timed; then each query and a `continue` over the gdb remote protocol
must answer within a generous multiple of that time (a hang fails; no timing is asserted beyond that).
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

SHAPES = {
    "incq-jmp": "cli-spin",            # cli; 1: incq counter(%rip); jmp 1b
    "jmp-self": "jmp-self",            # cli; 1: jmp 1b
    "pause-jmp": "pause-spin",         # cli; 1: pause (rep nop); jmp 1b
    "rep-stosb": "stosb-loop",         # rep stosb over a page, again and again
    "sti-hlt": "pit-hlt",              # sti; hlt with the PIT at its fastest
    "timer-jmp-self": "timer-jmp-self",  # jmp . under a 1 kHz PIT
}
MODES = ("exact", "exit-sync")


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run(args, timeout, what):
    start = time.time()
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        fail(f"{what}: no answer after {timeout:.0f} s (hang): {' '.join(args)}")
    if r.returncode < 0:
        fail(f"{what}: died with signal {-r.returncode}\n{r.stderr}")
    return r, time.time() - start


def record(deja, image, trace, progress):
    p = subprocess.Popen([deja, "record", "--backend", "interp", "--progress", progress, "-o", trace, image],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        fail(f"recording {image} did not stop after SIGINT")
    if p.returncode != 12:
        fail(f"recording {image} ({progress}): exit {p.returncode}, expected 12 (interrupted)\n{err}")


def gdb_continue(deja, trace, timeout):
    """`deja debug`, then a `continue` over the remote protocol: the stop reply must come (at the end of the trace)."""
    d = subprocess.Popen([deja, "debug", trace, "--gdb", "127.0.0.1:0"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        port = None
        deadline = time.time() + 120
        lines = []
        while time.time() < deadline and port is None:
            line = d.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"waiting for gdb on 127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
        if port is None:
            fail("deja debug did not start: " + "".join(lines))
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        buf = b""

        def reply():
            nonlocal buf
            while True:
                m = re.search(rb"\$([^#]*)#[0-9a-f]{2}", buf)
                if m:
                    buf = buf[m.end():]
                    return m.group(1)
                try:
                    data = s.recv(65536)
                except socket.timeout:
                    fail(f"gdb continue: no stop reply after {timeout:.0f} s (hang)")
                if not data:
                    return None
                buf += data

        def packet(p):
            s.sendall(b"$" + p + b"#" + b"%02x" % (sum(p) & 0xff))

        start = time.time()
        packet(b"vCont;c")
        stop = reply()
        took = time.time() - start
        if stop is None or not stop.startswith(b"T"):
            fail(f"gdb continue: stop reply {stop!r}")
        packet(b"D")
        reply()
        s.close()
        d.wait(timeout=60)
        return stop, took
    finally:
        if d.poll() is None:
            d.kill()
            d.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--hostile", required=True, help="directory of the hostile guest images")
    ap.add_argument("--shape", choices=SHAPES, required=True)
    ap.add_argument("--progress", choices=MODES, required=True)
    args = ap.parse_args()
    image = os.path.join(args.hostile, SHAPES[args.shape] + ".elf")
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "loop.trace")
        record(args.deja, image, trace, args.progress)
        rep, replay_s = run([args.deja, "replay", "--serial-out", "/dev/null", trace], 600, "deja replay")
        if rep.returncode != 12 or "replay OK" not in rep.stderr:
            fail(f"deja replay: exit {rep.returncode}\n{rep.stderr}")
        # Generous: a query replays the trace once more, with checkpoints on the way; a hang never answers.
        limit = max(120.0, 30 * replay_s)
        print(f"{args.shape} ({args.progress}): replay {replay_s:.2f} s; answers within {limit:.0f} s required")
        for at in ("end", "10", "event:2"):
            r, took = run([args.deja, "query", trace, "--at", at, "--regs"], limit, f"query --at {at}")
            if at != "end" and r.returncode == 2 and "ends before" in r.stderr:
                print(f"  query --at {at}: {took:.2f} s (the trace ends before it)")
                continue
            if r.returncode != 0 or not re.search(r"^rip\s+0x", r.stdout, re.M):
                fail(f"query --at {at}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
            print(f"  query --at {at}: {took:.2f} s")
        stop, took = gdb_continue(args.deja, trace, limit)
        print(f"  gdb continue: {took:.2f} s, stop reply {stop.decode(errors='replace')}")
    print("PASS")


if __name__ == "__main__":
    main()
