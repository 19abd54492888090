#!/usr/bin/env python3
"""Record/replay scenarios through the deja binary: timing-dependent outcomes, refusals, divergence, damaged traces."""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

DEJA = GUESTS = SOURCES = None
TMP = None


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def deja(*args, timeout=300, stdin=subprocess.DEVNULL):
    cmd = [DEJA, *args]
    try:
        p = subprocess.run(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        fail(f"hang: {' '.join(cmd)} did not finish in {timeout}s")
    if p.returncode < 0:
        fail(f"crash: {' '.join(cmd)} died with signal {-p.returncode}\n{p.stderr.decode(errors='replace')}")
    return p


def guest(name):
    return os.path.join(GUESTS, name + ".elf")


def record(name, trace, *extra):
    p = deja("record", "-o", trace, "--backend", "interp", *extra, guest(name))
    if p.returncode != 1:
        fail(f"recording {name} exited {p.returncode}: {p.stderr.decode(errors='replace')}")
    return p


def spinning_guest_in_exit_sync_mode():
    """timer spins waiting for ticks; exit-synchronous recording cannot deliver them and must stop, not hang."""
    trace = os.path.join(TMP, "spin.trace")
    start = time.monotonic()
    p = deja("record", "-o", trace, "--backend", "interp", "--progress", "exit-sync", guest("timer"), timeout=120)
    err = p.stderr.decode(errors="replace")
    if p.returncode != 4 or "without I/O" not in err:
        fail(f"a guest spinning without I/O in exit-sync recording: exit {p.returncode}: {err}")
    r = deja("replay", trace)
    if r.returncode != 4 or r.stdout != p.stdout:
        fail(f"the stopped recording does not replay to the same stop: exit {r.returncode}: "
             f"{r.stderr.decode(errors='replace')}")
    print(f"spinning guest, exit-sync: stopped after {time.monotonic() - start:.1f} s and replays to the same stop")


def progress_options():
    """--progress values are checked, with messages naming the value."""
    for args, words in [
        (["record", "-o", os.path.join(TMP, "x.trace"), "--backend", "interp", "--progress", "sometimes"],
         "'sometimes' is not one of"),
        (["record", "-o", os.path.join(TMP, "x.trace"), "--backend", "interp", "--progress", "emulated-pmu:lots"],
         "the skid 'lots' is not"),
        (["run", "--backend", "interp", "--progress", "emulated-pmu:5:-1"], "the seed '-1' is not"),
        (["run", "--backend", "kvm", "--progress", "emulated-pmu:5"], "use --backend interp"),
    ]:
        p = deja(*args, guest("hello"))
        err = p.stderr.decode(errors="replace")
        if p.returncode != 2 or words not in err:
            fail(f"deja {' '.join(args)}: exit {p.returncode}, expected 2 and '{words}': {err}")
    trace = os.path.join(TMP, "exact.trace")
    record("hello", trace)
    p = deja("replay", "--progress", "exit-sync", trace)
    if p.returncode != 2 or "can only choose the counter" not in p.stderr.decode(errors="replace"):
        fail(f"replay --progress exit-sync of an exact trace: exit {p.returncode}: {p.stderr.decode(errors='replace')}")
    print("progress options: bad values refused with their names")


def changed_image_refused():
    trace = os.path.join(TMP, "hello.trace")
    record("hello", trace)
    p = deja("replay", "--image", guest("cpuid"), trace)
    err = p.stderr.decode(errors="replace")
    if p.returncode != 2 or "SHA-256" not in err or "cpuid.elf" not in err:
        fail(f"a changed image was not refused clearly (exit {p.returncode}): {err}")
    print("changed image: refused:", err.strip().splitlines()[-1])


def device_semantics_divergence():
    trace = os.path.join(TMP, "hello.trace")
    p = deja("replay", "--test-device-semantics", "test:uart-lsr-temt", trace)
    err = p.stderr.decode(errors="replace")
    if p.returncode != 6 or "diverged at event" not in err or "port=0x3fd" not in err:
        fail(f"a changed device model was not reported as divergence at the LSR read (exit {p.returncode}): {err}")
    print("device semantics change: reported:", err.strip().splitlines()[0])


def inspect_trace():
    trace = os.path.join(TMP, "hello.trace")
    p = deja("inspect", "--serial", trace)
    if p.returncode != 0 or b"Hello" not in p.stdout:
        fail(f"inspect --serial does not show the serial output: {p.stdout.decode(errors='replace')}")
    p = deja("inspect", "--json", trace)
    try:
        json.loads(p.stdout)
    except ValueError as e:
        fail(f"inspect --json is not JSON: {e}")
    p = deja("inspect", "--events", trace)
    if p.returncode != 0 or b"port_read" not in p.stdout:
        fail("inspect --events shows no timeline")


def bad_traces():
    empty = os.path.join(TMP, "empty.trace")
    open(empty, "wb").close()
    notrace = os.path.join(TMP, "not.trace")
    with open(notrace, "wb") as f:
        f.write(b"this is not a trace\n" * 10)
    for path in (empty, notrace, os.path.join(TMP, "missing.trace")):
        p = deja("replay", path)
        err = p.stderr.decode(errors="replace")
        if p.returncode != 2 or os.path.basename(path) not in err:
            fail(f"replay of {path} exited {p.returncode} without naming the file: {err}")
        v = deja("verify", path)
        if v.returncode != 2:
            fail(f"verify of {path} exited {v.returncode}, not 2 (not a trace)")


def damaged_traces():
    trace = os.path.join(TMP, "timer.trace")
    record("timer", trace)
    data = open(trace, "rb").read()
    damaged = os.path.join(TMP, "damaged.trace")
    cuts = sorted(set([1, 8, 16, 40, len(data) - 1, len(data) - 8, len(data) - 40] +
                      [len(data) * k // 25 for k in range(1, 25)]))
    prefixes = 0
    for cut in cuts:
        with open(damaged, "wb") as f:
            f.write(data[:cut])
        if deja("verify", damaged).returncode not in (2, 8):
            fail(f"verify accepted a trace truncated at byte {cut}")
        p = deja("replay", damaged, timeout=120)
        if p.returncode == 1 and b"no valid index" in p.stderr:
            continue  # every event survived; only the footer index was cut, and replay says so
        if p.returncode not in (2, 8):
            fail(f"trace truncated at byte {cut}/{len(data)}: replay exited {p.returncode}\n"
                 f"{p.stderr.decode(errors='replace')}")
        if p.returncode == 8:
            prefixes += 1
            if b"valid prefix" not in p.stderr and b"trace" not in p.stderr:
                fail(f"truncated replay did not say where the trace ends: {p.stderr.decode(errors='replace')}")
    for k in range(1, 30):
        pos = len(data) * k // 30
        flipped = bytearray(data)
        flipped[pos] ^= 0x5A
        with open(damaged, "wb") as f:
            f.write(flipped)
        if deja("verify", damaged).returncode not in (2, 8):
            fail(f"verify accepted a trace with byte {pos} flipped")
        p = deja("replay", damaged, timeout=120)
        if p.returncode == 1 and b"no valid index" in p.stderr:
            continue
        if p.returncode not in (2, 6, 8):
            fail(f"byte {pos} flipped: replay exited {p.returncode}\n{p.stderr.decode(errors='replace')}")
    print(f"damaged traces: {len(cuts)} truncations ({prefixes} replayed a valid prefix), 29 flipped bytes: all handled")


def killed_recording():
    trace = os.path.join(TMP, "killed.trace")
    proc = subprocess.Popen([DEJA, "record", "-o", trace, "--backend", "interp", "--cmdline", "n=100000000000",
                             guest("cpu-bound")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if os.path.exists(trace):
        fail("a killed recording left a file at the trace's own path: only complete traces go there")
    trace += ".partial"  # where a recording is written until it is complete
    p = deja("replay", trace, timeout=600)
    err = p.stderr.decode(errors="replace")
    if p.returncode != 8:
        fail(f"replay of a SIGKILLed recording exited {p.returncode}: {err}")
    v = deja("verify", trace)
    if v.returncode != 8:
        fail(f"verify of a SIGKILLed recording exited {v.returncode}, not 8 (trace ended early)")
    print("SIGKILLed recording:", err.strip().splitlines()[-1])


def main():
    global DEJA, GUESTS, SOURCES, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--guests", required=True)
    ap.add_argument("--sources", required=True)
    args = ap.parse_args()
    DEJA, GUESTS, SOURCES = args.deja, args.guests, args.sources
    with tempfile.TemporaryDirectory() as tmp:
        TMP = tmp
        changed_image_refused()
        device_semantics_divergence()
        inspect_trace()
        bad_traces()
        damaged_traces()
        killed_recording()
        spinning_guest_in_exit_sync_mode()
        progress_options()
    print("PASS")


if __name__ == "__main__":
    main()
