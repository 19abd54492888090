#!/usr/bin/env python3
"""Time-travel debugging through Debian's stock gdb: `gdb -batch` sessions against `deja debug` on the bundled guests.

Each scenario records a guest on the software CPU, starts `deja debug --gdb 127.0.0.1:0`, and drives gdb with a
Python script (gdb's own API) that prints one JSON line per fact checked here. Scenarios:
  step:      break, continue, step; stepi 1000 then reverse-stepi 1000 (registers equal the forward run's at
             every point); reverse-finish lands in the caller
  watch:     threads-race, a watchpoint on the shared counter, continue, reverse-continue stops before the
             previous write: checked against `deja query --writes`
  begin:     reverse-continue all the way back reports replaylog:begin at _start; monitor checkpoint/restart
  hostile:   malformed, oversized and unknown packets on a raw socket get errors or empty replies, and the
             server still answers afterwards
  interrupt: Ctrl-C interrupts a long continue and a long reverse-continue
  smp:       smp-counter with 2 vCPUs and tiny slices: both vCPUs are threads (info threads, thread N, each its own
             registers); a breakpoint in ap_main stops on thread 2; stepi across schedule switches and reverse-stepi
             back give the same thread and registers at every point; a watchpoint fires on whichever vCPU writes
  damaged:   a checkpoint file saved beside the trace, then damaged, is refused naming the file; the session
             falls back to the trace; checkpoints past the end of a trace cut short are dropped when used
  memory:    `dump binary memory` of 8 KiB is one m packet and equals `deja query --mem`; 100 packets with
             acknowledgements cost about what they cost without (no delayed ACK per packet)
"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def record(deja, image, trace, extra=()):
    r = subprocess.run([deja, "record", "--backend", "interp", "-o", trace, *extra, image],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=600)
    if not os.path.exists(trace):
        sys.exit(f"recording {image} failed: {r.stderr}")


class Debug:
    """A `deja debug` process listening on a free loopback port."""

    def __init__(self, deja, trace, extra=()):
        self.proc = subprocess.Popen([deja, "debug", trace, "--gdb", "127.0.0.1:0", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        deadline = time.time() + 120
        self.port = None
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"waiting for gdb on 127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            sys.exit("deja debug did not start: " + "".join(self.lines))

    def finish(self):
        try:
            out, _ = self.proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self.lines.append(out or "")
        return self.proc.returncode, "".join(self.lines)


def run_gdb(gdb, elf, port, body, timeout=600, setup=""):
    script = f"""
import gdb, json
def emit(**kw):
    print("JSON " + json.dumps(kw), flush=True)
def reg(name):
    return int(gdb.parse_and_eval("$" + name)) & 0xffffffffffffffff
def regs():
    return {{n: reg(n) for n in ("rip", "rsp", "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "r8", "r15", "eflags")}}
def mon(cmd):
    return gdb.execute("monitor " + cmd, to_string=True)
gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("file {elf}")
{setup}
gdb.execute("target remote 127.0.0.1:{port}")
{body}
gdb.execute("detach")
"""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        r = subprocess.run([gdb, "-nx", "-batch", "-x", path], capture_output=True, text=True, timeout=timeout)
    finally:
        os.unlink(path)
    facts = [json.loads(l[5:]) for l in r.stdout.splitlines() if l.startswith("JSON ")]
    return facts, r.stdout + r.stderr


def fact(facts, key):
    for f in facts:
        if key in f:
            return f[key]
    return None


def scenario_step(args, work):
    trace = os.path.join(work, "hello.trace")
    record(args.deja, os.path.join(args.guests, "hello.elf"), trace)
    d = Debug(args.deja, trace, ["--checkpoint-interval", "300"])
    body = """
gdb.execute("break guest_main")
gdb.execute("continue")
emit(at_main=reg("rip") == int(gdb.parse_and_eval("(long)&guest_main")))
gdb.execute("next")
emit(after_next=reg("rip"))
forward = []
for i in range(1000):
    forward.append(regs())
    gdb.execute("stepi", to_string=True)
end = regs()
back_ok = True
first_bad = None
for i in range(999, -1, -1):
    gdb.execute("reverse-stepi", to_string=True)
    if regs() != forward[i]:
        back_ok = False
        first_bad = first_bad if first_bad is not None else i
emit(reverse_stepi_1000=back_ok, first_bad=first_bad)
# And forward again over the same stretch: the same states (the checkpoints are a cache).
again = True
for i in range(1000):
    if regs() != forward[i]:
        again = False
        break
    gdb.execute("stepi", to_string=True)
emit(forward_again=again and regs() == end)
# reverse-finish: from inside a function called by guest_main, back to the call in the caller.
gdb.execute("break serial_putc")
gdb.execute("continue")
inner = gdb.selected_frame().name()
gdb.execute("reverse-finish")
emit(reverse_finish_from=inner, reverse_finish_to=gdb.selected_frame().name())
emit(when=mon("when"))
"""
    facts, out = run_gdb(args.gdb, os.path.join(args.guests, "hello.elf64"), d.port, body)
    rc, log = d.finish()
    check(fact(facts, "at_main") is True, "step: break guest_main; continue stops there")
    check(fact(facts, "after_next") is not None, "step: next")
    check(fact(facts, "reverse_stepi_1000") is True,
          f"step: 1000 reverse-stepi give the forward registers at every point (first bad {fact(facts, 'first_bad')})")
    check(fact(facts, "forward_again") is True, "step: stepping forward again gives the same states")
    frm, to = fact(facts, "reverse_finish_from"), fact(facts, "reverse_finish_to")
    check(frm == "serial_putc" and to is not None and to != frm, f"step: reverse-finish from {frm} lands in {to}")
    if FAILURES:
        print(out[-3000:], log[-2000:])


def scenario_watch(args, work):
    trace = os.path.join(work, "race.trace")
    record(args.deja, os.path.join(args.guests, "threads-race.elf"), trace)
    elf = os.path.join(args.guests, "threads-race.elf64")
    nm = subprocess.run(["nm", elf], capture_output=True, text=True).stdout
    addr = int(re.search(r"^([0-9a-f]+) [bBdD] shared_counter$", nm, re.M).group(1), 16)
    q = subprocess.run([args.deja, "query", trace, "--writes", f"{addr:#x}:8", "--json"], capture_output=True,
                       text=True, timeout=900)
    check(q.returncode == 0, f"watch: deja query --writes exits 0 ({q.stderr.strip()[-200:]})")
    writes = json.loads(q.stdout) if q.returncode == 0 else []
    check(len(writes) > 1000, f"watch: query lists the writes to shared_counter ({len(writes)})")
    d = Debug(args.deja, trace)
    body = """
gdb.execute("break worker")
gdb.execute("continue")
gdb.execute("delete")
gdb.execute("watch shared_counter")
for i in range(40):
    gdb.execute("continue", to_string=True)
after = int(gdb.parse_and_eval("shared_counter"))
steps_after = int(mon("when").split()[1])
gdb.execute("reverse-continue", to_string=True)
emit(after=after, steps_after=steps_after, back_value=int(gdb.parse_and_eval("shared_counter")),
     back_steps=int(mon("when").split()[1]), back_rip=reg("rip"))
gdb.execute("reverse-continue", to_string=True)
emit(back2_steps=int(mon("when").split()[1]), back2_value=int(gdb.parse_and_eval("shared_counter")))
"""
    facts, out = run_gdb(args.gdb, elf, d.port, body)
    rc, log = d.finish()
    steps_after, back = fact(facts, "steps_after"), fact(facts, "back_steps")
    ok = steps_after is not None and back is not None
    check(ok, "watch: gdb stopped at writes forward and in reverse")
    if ok:
        # The forward stop is just after the 40th write; reverse-continue lands just before that same write.
        by_step = {w["step"]: w for w in writes}
        w = by_step.get(back)
        check(w is not None and back == steps_after - 1,
              f"watch: reverse-continue stops at step {back}, before the write query lists there")
        if w is not None:
            check(int(w["rip"], 16) == fact(facts, "back_rip"), "watch: the stop is at the writing instruction")
            check(int(w["old"], 16) == fact(facts, "back_value") and int(w["new"], 16) == fact(facts, "after"),
                  f"watch: old/new values match query ({w['old']} -> {w['new']})")
        earlier = [s for s in by_step if s < back]
        check(bool(earlier) and fact(facts, "back2_steps") == max(earlier),
              f"watch: the next reverse-continue stops at the previous write (step {fact(facts, 'back2_steps')})")
    if FAILURES:
        print(out[-3000:], log[-2000:])


def scenario_begin(args, work):
    trace = os.path.join(work, "hello2.trace")
    record(args.deja, os.path.join(args.guests, "hello.elf"), trace)
    d = Debug(args.deja, trace)
    body = """
gdb.execute("break serial_putc")
gdb.execute("continue")
out = mon("checkpoint")
emit(checkpoint=out)
cp_rip = reg("rip")
gdb.execute("delete")
gdb.execute("continue", to_string=True)
emit(at_end=mon("when"))
text = gdb.execute("reverse-continue", to_string=True)
emit(begin_text=text, begin_rip=reg("rip"), start=int(gdb.parse_and_eval("(long)&_start")))
mon("restart 1")
gdb.execute("maintenance flush register-cache")
emit(restart_rip=reg("rip") == cp_rip)
emit(bad_restart=mon("restart 99"))
"""
    facts, out = run_gdb(args.gdb, os.path.join(args.guests, "hello.elf64"), d.port, body)
    rc, log = d.finish()
    check("checkpoint 1" in (fact(facts, "checkpoint") or ""), "begin: monitor checkpoint names checkpoint 1")
    check("end of trace" in (fact(facts, "at_end") or ""), "begin: continue runs to the end of the trace")
    check("No more reverse-execution history" in out and fact(facts, "begin_rip") == fact(facts, "start"),
          "begin: reverse-continue reaches replaylog:begin at _start")
    check(fact(facts, "restart_rip") is True, "begin: monitor restart 1 returns to the checkpoint")
    check("no checkpoint 99" in (fact(facts, "bad_restart") or ""), "begin: restart of an unknown checkpoint is refused")
    if FAILURES:
        print(out[-3000:], log[-2000:])


def scenario_smp(args, work):
    trace = os.path.join(work, "smp.trace")
    # Slices of 50 to 150 instructions: a few hundred steps cross several switches between the vCPUs.
    record(args.deja, os.path.join(args.guests, "smp-counter.elf"), trace,
           ["--machine", "pc-apic", "--cpus", "2", "--schedule-seed", "3", "--schedule-quantum", "100",
            "--append", "increments=3000"])
    d = Debug(args.deja, trace, ["--checkpoint-interval", "200"])
    body = """
gdb.execute("break ap_main")
gdb.execute("continue")
emit(ap_thread=gdb.selected_thread().num, at_ap_main=reg("rip") == int(gdb.parse_and_eval("(long)&ap_main")))
emit(threads=sorted(t.num for t in gdb.selected_inferior().threads()))
emit(info_threads=gdb.execute("info threads", to_string=True))
ap_rip = reg("rip")
gdb.execute("thread 1")
emit(bsp_rip_differs=reg("rip") != ap_rip)
gdb.execute("thread 2")
emit(ap_rip_again=reg("rip") == ap_rip)
gdb.execute("delete")
def here():
    return (gdb.selected_thread().num, regs())
forward = []
for i in range(400):
    forward.append(here())
    gdb.execute("stepi", to_string=True)
emit(step_threads=sorted(set(t for t, _ in forward)))
back_ok, first_bad = True, None
for i in range(399, -1, -1):
    gdb.execute("reverse-stepi", to_string=True)
    if here() != forward[i]:
        back_ok = False
        first_bad = i if first_bad is None else first_bad
emit(reverse_stepi=back_ok, first_bad=first_bad)
gdb.execute("watch unlocked_counter")
writers = []
for i in range(300):  # the BSP prints a line before it starts writing: the AP writes first
    gdb.execute("continue", to_string=True)
    writers.append(gdb.selected_thread().num)
    if len(set(writers)) == 2 and writers[-1] != writers[0]:
        break
emit(writers=sorted(set(writers)))
steps_after = int(mon("when").split()[1])
gdb.execute("reverse-continue", to_string=True)
emit(back_steps=int(mon("when").split()[1]), steps_after=steps_after, back_thread=gdb.selected_thread().num,
     last_writer=writers[-1])
"""
    facts, out = run_gdb(args.gdb, os.path.join(args.guests, "smp-counter.elf64"), d.port, body)
    rc, log = d.finish()
    check(fact(facts, "at_ap_main") is True and fact(facts, "ap_thread") == 2,
          f"smp: break ap_main stops there on thread 2 (thread {fact(facts, 'ap_thread')})")
    check(fact(facts, "threads") == [1, 2], f"smp: gdb sees threads {fact(facts, 'threads')}")
    check("vCPU 1" in (fact(facts, "info_threads") or ""), "smp: info threads names the vCPUs")
    check(fact(facts, "bsp_rip_differs") is True and fact(facts, "ap_rip_again") is True,
          "smp: thread 1 and thread 2 show their own registers")
    check(fact(facts, "step_threads") == [1, 2], f"smp: 400 stepi ran on threads {fact(facts, 'step_threads')}")
    check(fact(facts, "reverse_stepi") is True,
          f"smp: reverse-stepi gives the forward thread and registers at every point (first bad "
          f"{fact(facts, 'first_bad')})")
    check(fact(facts, "writers") == [1, 2], f"smp: the watchpoint fired on threads {fact(facts, 'writers')}")
    check(fact(facts, "back_steps") is not None and fact(facts, "back_steps") == fact(facts, "steps_after") - 1
          and fact(facts, "back_thread") == fact(facts, "last_writer"),
          "smp: reverse-continue stops just before the last write, on the thread that made it")
    if FAILURES:
        print(out[-3000:], log[-2000:])


def frame(payload):
    return b"$" + payload + b"#" + b"%02x" % (sum(payload) & 0xff)


def replies(s):
    """A function returning the payload of the next packet arriving on socket s (None once it closes)."""
    buf = b""

    def reply():
        nonlocal buf
        while True:
            m = re.search(rb"\$([^#]*)#[0-9a-f]{2}", buf)
            if m:
                buf = buf[m.end():]
                return m.group(1)
            data = s.recv(65536)
            if not data:
                return None
            buf += data

    return reply


def scenario_hostile(args, work):
    trace = os.path.join(work, "hello3.trace")
    record(args.deja, os.path.join(args.guests, "hello.elf"), trace)
    d = Debug(args.deja, trace)
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    reply = replies(s)

    hostile = [
        b"m" + b"f" * 40 + b",4",              # address too long
        b"mzz,10",                             # malformed hex
        b"m0,ffffffffffff",                    # absurd length
        b"m100000,",                           # missing length
        b"Z0,zz,1", b"Z2,0,0", b"Z9,0,1",     # bad breakpoints
        b"p" + b"1" * 30, b"pfff",            # bad register numbers
        b"G" + b"00" * 100, b"M0,1:00", b"P0=00",  # writes: refused
        b"qXfer:features:read:other.xml:0,100", b"qXfer:features:read:target.xml:zz",
        b"qRcmd,zz", b"vCont;x", b"vCont;", b"unknown-packet", b"\x00\xff",
    ]
    s.sendall(frame(b"qRcmd," + b"00" * 10))   # a monitor command of NULs: the help text, hex-encoded
    check(reply().startswith(b"756e6b6e6f776e"), "hostile: a monitor command of NUL bytes gets the help text")
    answers = []
    for p in hostile:
        s.sendall(frame(p))
        answers.append(reply())
    s.sendall(b"$" + b"A" * 40000 + b"#00")    # oversized, bad checksum
    s.sendall(b"$g#00")                        # bad checksum
    s.sendall(b"garbage outside packets")
    s.sendall(frame(b"qSupported"))
    supported = reply()
    s.sendall(frame(b"g"))
    regs = reply()
    s.sendall(frame(b"D"))
    reply()
    s.close()
    rc, log = d.finish()
    check(all(a is not None for a in answers), "hostile: every hostile packet got a reply")
    check(all(a == b"" or a.startswith(b"E") or a.startswith(b"l") for a in answers),
          f"hostile: the replies are errors or empty ({[a[:20] for a in answers if a]})")
    check(supported is not None and b"ReverseContinue+" in supported, "hostile: the server still answers qSupported")
    check(regs is not None and len(regs) > 500, "hostile: and reads registers")
    check(rc == 0, f"hostile: deja debug exits cleanly (status {rc})")


def scenario_interrupt(args, work):
    """Ctrl-C (0x03) interrupts a long continue and a long reverse-continue."""
    trace = os.path.join(work, "race3.trace")
    record(args.deja, os.path.join(args.guests, "threads-race.elf"), trace)
    # The reference executor: the JIT replays this whole trace backwards in less than the 0.3 s the Ctrl-C waits.
    d = Debug(args.deja, trace, ["--interp-mode", "reference"])
    s = socket.create_connection(("127.0.0.1", d.port), timeout=120)
    reply = replies(s)

    def when():
        s.sendall(frame(b"qRcmd," + b"when".hex().encode()))
        return bytes.fromhex(reply().decode()).decode()

    s.sendall(frame(b"Z2,10,8"))  # a watchpoint nothing writes: the run would go to the end
    reply()
    start = time.time()
    s.sendall(frame(b"vCont;c"))
    time.sleep(0.3)
    s.sendall(b"\x03")
    stop = reply()
    forward_at = when()
    check(stop is not None and stop.startswith(b"T02") and "end of trace" not in forward_at,
          f"interrupt: Ctrl-C stops a long continue ({stop}, {forward_at.strip()}, {time.time() - start:.1f} s)")
    s.sendall(frame(b"vCont;c"))
    reply()  # to the end
    start = time.time()
    s.sendall(frame(b"bc"))
    time.sleep(0.3)
    s.sendall(b"\x03")
    stop = reply()
    back_at = when()
    check(stop is not None and stop.startswith(b"T02") and not back_at.startswith("steps 0 "),
          f"interrupt: Ctrl-C stops a long reverse-continue ({stop}, {back_at.strip()}, {time.time() - start:.1f} s)")
    s.sendall(frame(b"D"))
    reply()
    s.close()
    rc, log = d.finish()
    check(rc == 0, f"interrupt: deja debug exits cleanly (status {rc})")


def scenario_damaged(args, work):
    trace = os.path.join(work, "race2.trace")
    record(args.deja, os.path.join(args.guests, "threads-race.elf"), trace)
    d = Debug(args.deja, trace, ["--save-checkpoints", "--checkpoint-interval", "2000000"])
    body = """
gdb.execute("continue", to_string=True)
emit(end=mon("when"))
"""
    facts, out = run_gdb(args.gdb, os.path.join(args.guests, "threads-race.elf64"), d.port, body)
    rc, log = d.finish()
    files = sorted(f for f in os.listdir(work) if f.startswith("race2.trace.") and f.endswith(".ckpt"))
    check(rc == 0 and len(files) > 3, f"damaged: --save-checkpoints wrote checkpoint files ({len(files)})")
    if len(files) < 3:
        return
    d = Debug(args.deja, trace)
    check(any(f"loaded {len(files) - 1} checkpoints" in l or f"loaded {len(files)} checkpoints" in l for l in d.lines),
          "damaged: intact checkpoint files are loaded")
    body = "emit(x=1)\n"
    run_gdb(args.gdb, os.path.join(args.guests, "threads-race.elf64"), d.port, body)
    d.finish()
    victim = os.path.join(work, files[2])
    with open(victim, "r+b") as f:
        f.seek(os.path.getsize(victim) // 2)
        f.write(b"\xde\xad\xbe\xef")
    other = os.path.join(work, files[1])
    with open(other, "r+b") as f:
        f.truncate(100)
    d = Debug(args.deja, trace)
    body = """
gdb.execute("watch shared_counter")
for i in range(3):
    gdb.execute("continue", to_string=True)
gdb.execute("delete")
gdb.execute("continue", to_string=True)
emit(end=mon("when"))
gdb.execute("reverse-stepi", to_string=True)
emit(back=mon("when"))
"""
    facts, out = run_gdb(args.gdb, os.path.join(args.guests, "threads-race.elf64"), d.port, body)
    rc, log = d.finish()
    check(f"checkpoint file {victim}: checksum mismatch" in log, "damaged: a damaged file is refused, naming it")
    check(f"checkpoint file {other}:" in log and "truncated" in log or "checksum" in log,
          "damaged: a truncated file is refused, naming it")
    check("end of trace" in (fact(facts, "end") or "") and fact(facts, "back") is not None,
          "damaged: debugging goes on from the trace")
    # A trace cut short after its checkpoints were saved: those past its end are dropped when used.
    end_steps = int(re.search(r"steps (\d+)", fact(facts, "end") or "steps 0").group(1))
    with open(trace, "r+b") as f:
        f.truncate(os.path.getsize(trace) * 6 // 10)
    d = Debug(args.deja, trace)
    body = f"""
emit(seek=mon("seek {end_steps - 10}"))
gdb.execute("maintenance flush register-cache")
gdb.execute("reverse-stepi", to_string=True)
emit(back=mon("when"))
"""
    facts, out = run_gdb(args.gdb, os.path.join(args.guests, "threads-race.elf64"), d.port, body)
    rc, log = d.finish()
    check("dropping the checkpoint" in log and "the trace ends" in log,
          "damaged: checkpoints past the end of a truncated trace are dropped, naming why")
    check("end of trace" in (fact(facts, "seek") or "") and fact(facts, "back") is not None,
          "damaged: and the truncated trace still debugs to its end and back")


def scenario_memory(args, work):
    """gdb reads 8 KiB in one packet (`dump binary memory`); packets in acknowledgement mode wait for no delayed ACK."""
    trace = os.path.join(work, "hello4.trace")
    record(args.deja, os.path.join(args.guests, "hello.elf"), trace)
    q = subprocess.run([args.deja, "query", trace, "--at", "0", "--mem", "0x100000:8192", "--phys", "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    expected = bytes.fromhex(json.loads(q.stdout)["bytes"]) if q.returncode == 0 else None
    check(expected is not None and len(expected) == 8192, f"memory: deja query reads 8 KiB ({q.stderr.strip()})")
    dump = os.path.join(work, "dump.bin")
    timing = """
import time
start = time.time()
for i in range(100):
    gdb.execute("maintenance packet qC", to_string=True)
emit(seconds=time.time() - start)
"""
    d = Debug(args.deja, trace)
    body = f"""
gdb.execute("set debug remote 1")
gdb.execute("dump binary memory {dump} 0x100000 0x102000")
gdb.execute("set debug remote 0")
""" + timing
    facts, out = run_gdb(args.gdb, os.path.join(args.guests, "hello.elf64"), d.port, body)
    rc, log = d.finish()
    got = open(dump, "rb").read() if os.path.exists(dump) else b""
    check(got == expected, f"memory: gdb's dump binary memory of 8 KiB equals the memory ({len(got)} bytes)")
    check(re.search(r"m100000,2000", out) is not None,
          "memory: gdb asked for all 8 KiB in one m packet" + ("" if "m100000,2000" in out else f"\n{out[-1500:]}"))
    no_ack = fact(facts, "seconds")
    # The same 100 packets with acknowledgements (gdb's '+' after every reply, the server's '+' before it).
    d = Debug(args.deja, trace)
    facts, out = run_gdb(args.gdb, os.path.join(args.guests, "hello.elf64"), d.port, timing,
                         setup='gdb.execute("set remote noack-packet off")')
    d.finish()
    ack = fact(facts, "seconds")
    check(no_ack is not None and ack is not None and ack < 10 * no_ack + 1.0,
          f"memory: 100 packets take {ack} s with acknowledgements, {no_ack} s without (a delayed ACK per packet "
          f"would be 4 s)")
    # A client that leaves Nagle's algorithm on (gdb turns it off) and acknowledges each reply in its own write:
    # its next packet waits for deja's ACK of the '+', which must not be a delayed one (~40 ms).
    d = Debug(args.deja, trace)
    s = socket.create_connection(("127.0.0.1", d.port), timeout=60)
    reply = replies(s)

    def round_trips(ack):
        start = time.time()
        for _ in range(50):
            s.sendall(frame(b"qC"))
            reply()
            if ack:
                s.sendall(b"+")
        return time.time() - start

    acked = round_trips(True)
    s.sendall(frame(b"QStartNoAckMode"))
    reply()
    s.sendall(b"+")
    unacked = round_trips(False)
    s.sendall(frame(b"D"))
    reply()
    s.close()
    d.finish()
    check(acked < 10 * unacked + 0.5, f"memory: a client with Nagle on: 50 packets in {acked:.3f} s acknowledged, "
                                      f"{unacked:.3f} s not (a delayed ACK per packet would be 2 s)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--guests", required=True)
    ap.add_argument("--gdb", default=shutil.which("gdb") or "gdb")
    ap.add_argument("scenarios", nargs="*",
                    default=["step", "watch", "begin", "hostile", "interrupt", "damaged", "memory", "smp"])
    args = ap.parse_args()
    if not shutil.which(args.gdb):
        sys.exit("gdb is not installed (scripts/setup.sh installs it)")
    for name in args.scenarios:
        with tempfile.TemporaryDirectory() as work:
            start = time.time()
            globals()["scenario_" + name](args, work)
            print(f"---- {name}: {time.time() - start:.1f} s", flush=True)
    if FAILURES:
        print("FAILED:", *FAILURES, sep="\n  ")
        sys.exit(1)


if __name__ == "__main__":
    main()
