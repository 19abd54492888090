#!/usr/bin/env python3
"""Time-travel figures (docs/debugging.md), each beside its aim in issue 14, and QEMU's reverse debugging on the
same image measured in the same run.

On a trace of about a minute of guest execution on the software CPU (threads-race scaled up with increments=N):
  - checkpoint restores against dirty pages (build/bench/restore_bench)        aim >= 1,000/s at a few hundred pages
  - the overhead automatic checkpoints add to a plain forward replay           aim < 10%
  - reverse-stepi latency at points across the trace (worst: a step before
    a checkpoint boundary, which replays a whole checkpoint interval)           aim < 100 ms anywhere
  - reverse-continue from the end to a watchpoint written half-way (30 s back)
  - the memory checkpoints take
  - QEMU: -icount shift=auto,rr=record/replay,rrsnapshot=init with gdb reverse-stepi at the same points
CPU times (user+sys of the child processes) are given beside wall times: this machine is shared.
Usage: bench/timetravel_bench.py [--build build] [--increments 20000000]
"""
import argparse
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def cpu_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd, timeout=7200, **kw):
    c0, w0 = cpu_children(), time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    return time.monotonic() - w0, cpu_children() - c0, p


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def gdb_session(elf, port, body, timeout=3600):
    script = f"""
import gdb, json, time
def emit(**kw):
    print("JSON " + json.dumps(kw), flush=True)
def mon(cmd):
    return gdb.execute("monitor " + cmd, to_string=True)
def timed(cmd):
    t = time.monotonic()
    gdb.execute(cmd, to_string=True)
    return time.monotonic() - t
gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("file {elf}")
gdb.execute("target remote 127.0.0.1:{port}")
{body}
"""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        r = subprocess.run(["gdb", "-nx", "-batch", "-x", path], capture_output=True, text=True, timeout=timeout)
    finally:
        os.unlink(path)
    facts = {}
    for line in r.stdout.splitlines():
        if line.startswith("JSON "):
            facts.update(json.loads(line[5:]))
    return facts, r.stdout + r.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--increments", type=int, default=20_000_000)
    ap.add_argument("--interval", type=int, default=1_000_000)
    ap.add_argument("--no-qemu", action="store_true")
    # QEMU's icount record/replay runs threads-race at about 1 M instructions/s here (measured: 200000 increments,
    # 32 M instructions, take 30-100 s to record), so it gets a shorter run of the same image.
    ap.add_argument("--qemu-increments", type=int, default=200_000)
    args = ap.parse_args()
    deja = os.path.join(args.build, "deja")
    guests = os.path.join(args.build, "guest-tests")
    image, elf = os.path.join(guests, "threads-race.elf"), os.path.join(guests, "threads-race.elf64")
    cmdline = f"increments={args.increments}"
    work = tempfile.mkdtemp(prefix="deja-tt-bench-")
    trace = os.path.join(work, "race.trace")
    print(f"# threads-race {cmdline} (3 threads, PIT at 1000 Hz), software CPU; work dir {work}")

    restore = subprocess.run([os.path.join(args.build, "bench", "restore_bench")], capture_output=True, text=True)
    print("\n## checkpoint restore against dirty pages (256 MiB guest, 16 MiB touched)\n" + restore.stdout)

    wall, cpu, p = timed([deja, "record", "--backend", "interp", "--cmdline", cmdline, "-o", trace, image])
    print(f"record: {wall:.1f} s wall, {cpu:.1f} s CPU; {p.stdout.strip().splitlines()[-1] if p.stdout else p.stderr}")
    wall_replay, cpu_replay, p = timed([deja, "replay", trace, "--quiet", "--serial-out", "/dev/null"])
    print(f"plain replay (deja replay): {wall_replay:.1f} s wall, {cpu_replay:.1f} s CPU")
    wall_none, cpu_none, p = timed([deja, "query", trace, "--at", "end", "--regs", "--checkpoint-memory", "0"])
    steps = int(re.search(r"steps (\d+)", p.stdout).group(1))
    print(f"steppable replay to the end, no checkpoints: {wall_none:.1f} s wall, {cpu_none:.1f} s CPU, {steps} steps")
    wall_ck, cpu_ck, p = timed([deja, "query", trace, "--at", "end", "--regs", "--checkpoint-interval",
                                str(args.interval)])
    print(f"the same with a checkpoint every {args.interval} steps: {wall_ck:.1f} s wall, {cpu_ck:.1f} s CPU: "
          f"overhead {100 * (cpu_ck / cpu_none - 1):+.1f}% CPU against no checkpoints, "
          f"{100 * (cpu_ck / cpu_replay - 1):+.1f}% against deja replay (aim < 10%)")

    port = free_port()
    dbg = subprocess.Popen([deja, "debug", trace, "--gdb", f"127.0.0.1:{port}", "--checkpoint-interval",
                            str(args.interval)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.5)
    fractions = [0.1, 0.3, 0.5, 0.7, 0.9, 1.0]
    # Worst case: a step before a checkpoint boundary replays a whole interval from the checkpoint before.
    points = [max(args.interval, (int(steps * f) // args.interval) * args.interval) for f in fractions]
    body = f"""
t = time.monotonic()
gdb.execute("continue", to_string=True)
emit(forward_to_end=time.monotonic() - t)
lat = {{}}
for p in {points}:
    mon("seek %d" % p)
    gdb.execute("maintenance flush register-cache")
    lat[p] = [timed("reverse-stepi") for _ in range(3)]
emit(reverse_stepi=lat)
mon("seek {steps}")
gdb.execute("maintenance flush register-cache")
gdb.execute("continue", to_string=True)
gdb.execute("watch halfway_mark")
t = time.monotonic()
gdb.execute("reverse-continue", to_string=True)
emit(reverse_continue=time.monotonic() - t, landed=mon("when"))
emit(checkpoints=mon("info checkpoints"))
gdb.execute("detach")
"""
    facts, out = gdb_session(elf, port, body)
    dbg.wait(timeout=600)
    if "reverse_stepi" not in facts:
        print("gdb session failed:\n" + out[-3000:])
        return 1
    print(f"\n## deja debug (gdb), checkpoint interval {args.interval} steps, --checkpoint-memory 512M")
    print(f"continue from the start to the end (taking checkpoints): {facts['forward_to_end']:.1f} s wall")
    worst = 0
    for p, times in facts["reverse_stepi"].items():
        ms = [1000 * x for x in times]
        worst = max(worst, max(ms))
        print(f"reverse-stepi at step {int(p):>12} ({100 * int(p) / steps:5.1f}%): " +
              ", ".join(f"{m:.1f}" for m in ms) + " ms")
    print(f"reverse-stepi worst: {worst:.1f} ms (aim < 100 ms)")
    landed = int(re.search(r"steps (\d+)", facts["landed"]).group(1))
    print(f"reverse-continue from the end to the watchpoint on halfway_mark, {100 * (steps - landed) / steps:.0f}% of "
          f"the trace back (~{(steps - landed) / steps * cpu_replay:.0f} s of replay): {facts['reverse_continue']:.1f} s wall")
    print("checkpoints: " + facts["checkpoints"].strip().replace("\n", "; "))

    if args.no_qemu:
        return 0
    print(f"\n## QEMU (same image, increments={args.qemu_increments}: -icount shift=auto,rr=record|replay,"
          f"rrsnapshot=init, gdb reverse-stepi)")
    qemu = shutil.which("qemu-system-x86_64")
    if not qemu:
        print("not measured: qemu-system-x86_64 is not installed")
        return 0
    disk = os.path.join(work, "snap.qcow2")
    subprocess.run(["qemu-img", "create", "-f", "qcow2", disk, "16M"], capture_output=True)
    rrfile = os.path.join(work, "qemu.rr")

    def qemu_cmd(mode, extra=()):
        return [qemu, "-accel", "tcg", "-m", "256M", "-kernel", image, "-append", f"increments={args.qemu_increments}",
                "-icount", f"shift=auto,rr={mode},rrfile={rrfile},rrsnapshot=init",
                "-drive", f"file={disk},if=none,id=img-direct",
                "-drive", "driver=blkreplay,if=none,image=img-direct,id=img-blkreplay",
                "-device", "ide-hd,drive=img-blkreplay", "-net", "none",
                "-device", "isa-debug-exit,iobase=0xf4,iosize=4", "-serial", "null", "-display", "none",
                "-no-reboot", *extra]
    wall_q, cpu_q, p = timed(qemu_cmd("record"), timeout=3600)
    print(f"QEMU record: {wall_q:.1f} s wall, {cpu_q:.1f} s CPU (exit {p.returncode}) {p.stderr.strip()[-300:]}")
    wall_q, cpu_q, p = timed(qemu_cmd("replay"), timeout=3600)
    print(f"QEMU replay: {wall_q:.1f} s wall, {cpu_q:.1f} s CPU (exit {p.returncode}) {p.stderr.strip()[-300:]}")
    qport = free_port()
    qp = subprocess.Popen(qemu_cmd("replay", ["-gdb", f"tcp:127.0.0.1:{qport}", "-S"]), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    # QEMU has no step counter gdb can seek by: go forward by breakpoint hits on the worker loop, then time one
    # reverse-stepi (QEMU reloads its only snapshot, at the start, and replays forward to the previous step).
    body = """
gdb.execute("break worker")
lat = []
for i in range(3):
    t = time.monotonic()
    gdb.execute("continue", to_string=True)
    fwd = time.monotonic() - t
    lat.append((fwd, timed("reverse-stepi")))
    gdb.execute("stepi", to_string=True)
emit(qemu=lat)
gdb.execute("delete")
t = time.monotonic()
gdb.execute("watch halfway_mark")
gdb.execute("continue", to_string=True)
emit(qemu_to_half=time.monotonic() - t)
t = time.monotonic()
gdb.execute("stepi", to_string=True)
emit(qemu_rsi_half=timed("reverse-stepi"))
gdb.execute("kill")
"""
    facts, out = gdb_session(elf, qport, body, timeout=3600)
    qp.kill()
    qp.wait()
    if "qemu" in facts:
        for fwd, rsi in facts["qemu"]:
            print(f"QEMU: continue to the next thread start {fwd:.2f} s, then reverse-stepi {1000 * rsi:.1f} ms")
    if "qemu_rsi_half" in facts:
        print(f"QEMU: forward to the half-way write {facts['qemu_to_half']:.1f} s, reverse-stepi there "
              f"{1000 * facts['qemu_rsi_half']:.1f} ms (deja at 50%: see above)")
    else:
        print("QEMU reverse debugging did not complete:\n" + out[-2500:] + "\n" + (qp.stderr.read() or "")[-1500:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
