#!/usr/bin/env python3
"""Runs a bundled guest through deja and checks it: plain run, record -> replay -> compare, cross-backend replay."""
import argparse
import os
import re
import subprocess
import sys
import tempfile


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, timeout, stdin=subprocess.DEVNULL):
    print("+ " + " ".join(cmd), file=sys.stderr)
    try:
        p = subprocess.run(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        fail(f"timed out after {timeout}s: {' '.join(cmd)}")
    sys.stderr.write(p.stderr.decode(errors="replace"))
    return p


def check_expected(expected_path, output):
    """Exact match for .expected files; per-line full regex match for .expected-re files."""
    with open(expected_path, "rb") as f:
        expected = f.read()
    if expected_path.endswith("-re"):
        exp_lines = expected.decode().split("\n")
        out_lines = output.decode(errors="replace").split("\n")
        if len(exp_lines) != len(out_lines):
            fail(f"{expected_path}: expected {len(exp_lines)} lines, got {len(out_lines)}:\n{output.decode(errors='replace')}")
        for i, (e, o) in enumerate(zip(exp_lines, out_lines)):
            if not re.fullmatch(e, o):
                fail(f"{expected_path}:{i + 1}: line {o!r} does not match {e!r}")
    elif expected != output:
        exp_lines = expected.split(b"\n")
        out_lines = output.split(b"\n")
        for i in range(max(len(exp_lines), len(out_lines))):
            e = exp_lines[i] if i < len(exp_lines) else b"<end>"
            o = out_lines[i] if i < len(out_lines) else b"<end>"
            if e != o:
                fail(f"{expected_path}:{i + 1}: expected {e!r}, got {o!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--expected", required=True)
    ap.add_argument("--mode", choices=["run", "record-replay", "cross", "digest-vs-interp"], default="run")
    ap.add_argument("--backend", default="interp")
    ap.add_argument("--replay-backend", default=None)
    ap.add_argument("--interp-mode", default=None, help="the software CPU's executor for run and record")
    ap.add_argument("--replay-interp-modes", default=None,
                    help="comma-separated executors to replay the trace on, one replay each (the trace must not "
                         "depend on the mode it was recorded in)")
    ap.add_argument("--progress", default=None)
    ap.add_argument("--machine", default=None, help="--machine for run and record (replay takes the trace's)")
    ap.add_argument("--cmdline", default=None)
    ap.add_argument("--cpu", default=None, help="CPU model (deja run --cpu)")
    ap.add_argument("--serial-in", default=None)
    ap.add_argument("--status", type=int, default=1, help="expected guest exit status")
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args()

    opts = ["--backend", args.backend]
    if args.cmdline is not None:
        opts += ["--cmdline", args.cmdline]
    if args.cpu:
        opts += ["--cpu", args.cpu]
    if args.serial_in:
        opts += ["--serial-in", args.serial_in]
    if args.progress:
        opts += ["--progress", args.progress]
    if args.machine:
        opts += ["--machine", args.machine]
    if args.interp_mode:
        opts += ["--interp-mode", args.interp_mode]

    if args.mode == "run":
        p = run([args.deja, "run", *opts, args.image], args.timeout)
        if p.returncode != args.status:
            fail(f"exit status {p.returncode}, expected {args.status}")
        check_expected(args.expected, p.stdout)
        print("PASS")
        return

    if args.mode == "digest-vs-interp":
        digests = {}
        for backend in (args.backend, "interp"):
            o = ["--backend", backend] + opts[2:]
            p = run([args.deja, "run", "--digest", *o, args.image], args.timeout)
            if p.returncode != args.status:
                fail(f"{backend}: exit status {p.returncode}, expected {args.status}")
            m = re.search(rb"deja: digest ([0-9a-f]{32})", p.stderr)
            if not m:
                fail(f"{backend}: no digest printed")
            digests[backend] = m.group(1).decode()
        if len(set(digests.values())) != 1:
            fail(f"final state digests differ: {digests}")
        print(f"PASS digest {digests}")
        return

    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "guest.trace")
        p = run([args.deja, "record", "-o", trace, *opts, args.image], args.timeout)
        if p.returncode != args.status:
            fail(f"record: exit status {p.returncode}, expected {args.status}")
        check_expected(args.expected, p.stdout)
        recorded = p.stdout
        mode = os.stat(trace).st_mode & 0o777
        if mode != 0o600:
            fail(f"trace mode is {oct(mode)}, expected 0o600")
        v = run([args.deja, "verify", trace], 120)
        if v.returncode != 0:
            fail(f"verify failed: {v.stdout.decode()}")
        replay_backend = args.replay_backend or args.backend
        modes = args.replay_interp_modes.split(",") if args.replay_interp_modes else [None]
        for interp_mode in modes:
            # Replay never attaches serial input: every input byte must come from the trace.
            cmd = [args.deja, "replay", "--backend", replay_backend]
            if interp_mode:
                cmd += ["--interp-mode", interp_mode]
            where = replay_backend + (f" ({interp_mode})" if interp_mode else "")
            r = run(cmd + [trace], args.timeout)
            if r.returncode != args.status:
                fail(f"replay on {where}: exit status {r.returncode}, expected {args.status}")
            if r.stdout != recorded:
                fail(f"replayed serial output on {where} differs from the recording:\n--- recorded\n"
                     f"{recorded.decode(errors='replace')}\n--- replayed\n{r.stdout.decode(errors='replace')}")
            if b"deja: replay OK" not in r.stderr:
                fail(f"replay on {where} printed no 'replay OK' summary")
        print("PASS")


if __name__ == "__main__":
    main()
