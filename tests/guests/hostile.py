#!/usr/bin/env python3
"""Hostile guests, traces and files through the deja binary (issue 11): each case runs under the memory budget."""
import argparse
import hashlib
import json
import os
import resource
import stat
import threading
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memory_budget  # noqa: E402

DEJA = HOSTILE = GUESTS = FORGE = SOURCES = None
TMP = None
CASES = {}


def case(fn):
    CASES[fn.__name__.replace("_", "-")] = fn
    return fn


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def deja(*args, **kw):
    """Runs deja under the memory budget; a crash, a hang or going over the budget fails the case."""
    r = memory_budget.run([DEJA, *args], **kw)
    what = "deja " + " ".join(args)
    if r.hung:
        fail(f"hang: {what}\n{r.err}")
    if r.over_budget:
        fail(f"over the memory budget: {what}: {r.figures()}\n{r.err}")
    if r.returncode < 0:
        fail(f"crash: {what} died with signal {-r.returncode}\n{r.err}")
    return r


def hostile(name):
    return os.path.join(HOSTILE, name + ".elf")


def path(name):
    return os.path.join(TMP, name)


def digest_line(r):
    for line in r.err.splitlines():
        if line.startswith("deja: digest "):
            return line.split()[2]
    fail(f"no digest printed:\n{r.err}")


def expect(r, status, words=(), what=""):
    if r.returncode != status or any(w not in r.err for w in words):
        fail(f"{what}: expected exit {status} and {list(words)}; got {r.figures()}\n{r.err}")


# ---- 1, 2: replay correctness ----------------------------------------------------------------------

@case
def interrupted_spin_replays_to_its_state():
    """1: `cli; 1: incq mem; jmp 1b` stopped by SIGINT: replay reaches the recorded state, not the first RIP match."""
    trace = path("cli-spin.trace")
    rec = deja("record", "--digest", "-o", trace, "--backend", "interp", hostile("cli-spin"), interrupt_after=2)
    expect(rec, 12, ["interrupted"], "recording cli-spin")
    rep = deja("replay", "--digest", trace)
    expect(rep, 12, ["replay OK"], "replaying cli-spin")
    if digest_line(rep) != digest_line(rec):
        fail(f"replay said OK with digest {digest_line(rep)}, the recording ended at {digest_line(rec)}\n{rep.err}")
    print("cli-spin interrupted:", rec.figures(), "| replay", rep.figures(), "digest", digest_line(rep))


@case
def interrupted_spin_in_exit_sync_replays_to_its_state():
    """1: in exit-sync mode no coordinate tells the spin's turns apart; the End's instruction count does (interp)."""
    trace = path("cli-spin-xs.trace")
    rec = deja("record", "--digest", "-o", trace, "--backend", "interp", "--progress", "exit-sync",
               hostile("cli-spin"), interrupt_after=1.5)
    expect(rec, 12, [], "recording cli-spin exit-sync")
    rep = deja("replay", "--digest", trace)
    expect(rep, 12, ["replay OK"], "replaying cli-spin exit-sync")
    if digest_line(rep) != digest_line(rec):
        fail(f"replay said OK with digest {digest_line(rep)}, the recording ended at {digest_line(rec)}\n{rep.err}")
    print("cli-spin exit-sync: replay", rep.figures())


@case
def end_mismatch_is_a_divergence():
    """1: an End whose digest, instruction count, exit count or status the replay does not reach: exit 6, never OK."""
    for name in ("hello", "cli-spin"):
        trace = path(f"{name}-end.trace")
        image = os.path.join(GUESTS, "hello.elf") if name == "hello" else hostile(name)
        rec = deja("record", "-o", trace, "--backend", "interp", image,
                   interrupt_after=None if name == "hello" else 1)
        if rec.returncode not in (1, 12):
            fail(f"recording {name}: {rec.figures()}\n{rec.err}")
        for field, words in (("digest", "final machine state differs"), ("instructions", "instructions"),
                             ("guest-exits", "exits"), ("status", "exit status differs")):
            if name == "cli-spin" and field == "status":
                continue  # an interrupted recording's End gives the status replay ends with
            forged = path(f"{name}-end-{field}.trace")
            f = memory_budget.run([FORGE, trace, forged, "--end-field", field])
            if f.returncode != 0:
                fail(f"trace_forge: {f.err}")
            rep = deja("replay", forged)
            expect(rep, 6, [words], f"replaying {name} with a changed End {field}")
        print(f"{name}: an End with another digest, instruction count, exit count or status is a divergence")


@case
def digest_interval_and_parts():
    """1: a trace recorded with --digest-every replays at its digests; one whose digest differs names the part."""
    trace = path("hello-digests.trace")
    rec = deja("record", "-o", trace, "--backend", "interp", "--digest-every", "3", os.path.join(GUESTS, "hello.elf"))
    expect(rec, 1, [], "recording hello with a digest every 3 events")
    expect(deja("replay", trace), 1, ["replay OK"], "replaying hello with a digest every 3 events")
    for part, words in (("rflags", "rflags recorded"), ("ram", "RAM in [0x"),
                        ("device", "machine state differs: device ")):
        forged = path(f"hello-digest-{part}.trace")
        f = memory_budget.run([FORGE, trace, forged, "--digest-part", part])
        if f.returncode != 0:
            fail(f"trace_forge: {f.err}")
        expect(deja("replay", forged), 6, [words], f"replaying hello with another {part} in a digest")
    print("hello: digests every 3 events replay; a differing digest names rflags, the RAM region, the device")


@case
def interrupted_serial_flood_replays_its_output():
    """1: a guest flooding COM1, stopped by SIGINT: replay must produce all the recorded output."""
    trace, out, replayed = path("flood.trace"), path("flood.out"), path("flood.replayed")
    rec = deja("record", "-o", trace, "--backend", "interp", "--serial-out", out, hostile("serial-flood"),
               interrupt_after=2)
    expect(rec, 12, [], "recording serial-flood")
    rep = deja("replay", "--serial-out", replayed, trace)
    expect(rep, 12, ["replay OK"], "replaying serial-flood")
    a, b = open(out, "rb").read(), open(replayed, "rb").read()
    if a != b:
        fail(f"replay said OK but produced {len(b)} bytes of the {len(a)} recorded\n{rep.err}")
    print(f"serial-flood interrupted: {len(a)} bytes recorded and replayed;", rep.figures())


def pit_hlt(progress):
    trace = path(f"pit-hlt-{progress}.trace")
    rec = deja("record", "-o", trace, "--backend", "interp", "--progress", progress, hostile("pit-hlt"),
               interrupt_after=4)
    expect(rec, 12, [], f"recording pit-hlt ({progress})")
    v = deja("verify", trace)
    if v.returncode != 0:
        fail(f"verify of a genuine pit-hlt recording: {v.figures()}\n{v.err}")
    rep = deja("replay", trace, timeout=300)
    expect(rep, 12, ["replay OK"], f"replaying pit-hlt ({progress})")
    print(f"pit-hlt {progress}: record", rec.figures(), "| replay", rep.figures())


@case
def pit_hlt_exact():
    """2: PIT at its fastest rate, `sti; hlt` idle loop, exact mode: every event at the same registers."""
    pit_hlt("exact")


@case
def pit_hlt_exit_sync():
    """2: the same in exit-sync mode."""
    pit_hlt("exit-sync")


# ---- 3-6: bounded memory -----------------------------------------------------------------------------

@case
def trace_with_huge_serial_output():
    """3: a small trace whose events claim 768 MiB of serial output: replay stays in budget and says it diverged."""
    trace, forged = path("hello-3.trace"), path("serial-bomb.trace")
    rec = deja("record", "-o", trace, "--backend", "interp", os.path.join(GUESTS, "hello.elf"))
    expect(rec, 1, [], "recording hello")
    f = memory_budget.run([FORGE, trace, forged, "--serial-events", "24", str(32 << 20)], budget=1 << 40)
    if f.returncode != 0:
        fail(f"trace_forge: {f.err}")
    rep = deja("replay", "--serial-out", "/dev/null", forged)
    expect(rep, 6, ["serial output differs"], "replaying a trace with 768 MiB of recorded output")
    print(f"serial bomb ({os.path.getsize(forged)} bytes of trace, 768 MiB of output):", rep.figures())


@case
def nop_sled():
    """4: 64 MiB of NOPs run in a loop: the decode cache stays within its capacity."""
    r = deja("run", "--backend", "interp", hostile("nop-sled"), interrupt_after=8)
    expect(r, 12, ["interrupted"], "nop-sled")
    print("nop-sled for 8 s:", r.figures())


@case
def zeroed_ram():
    """4: executing zeroed RAM (add %al,(%rax)) up to the end of RAM: bounded, then a clean stop."""
    r = deja("run", "--backend", "interp", "--mem", "48M", hostile("zero-run"), guest_ram=48 << 20, timeout=300)
    expect(r, 4, ["outside RAM"], "zero-run")
    print("zero-run to the end of RAM:", r.figures())


@case
def mmio_scan():
    """5: reading upward through the unmapped space above RAM: statistics keep a bounded sample."""
    r = deja("run", "--backend", "interp", "--stats", hostile("mmio-scan"), interrupt_after=6)
    expect(r, 12, ["more unknown MMIO accesses"], "mmio-scan")
    listed = sum(1 for line in r.err.splitlines() if "unmapped MMIO" in line)
    if listed > 256:
        fail(f"--stats lists {listed} unmapped MMIO addresses; the sample is 256")
    print(f"mmio-scan for 6 s: {listed} addresses listed;", r.figures())


@case
def trace_naming_many_modules():
    """6: a header naming 20,000 modules of 1 MiB: refused before any is read; no hash of a named file printed."""
    trace, forged, big = path("hello-6.trace"), path("modules.trace"), path("one-mib.bin")
    with open(big, "wb") as f:
        f.write(os.urandom(1 << 20))
    rec = deja("record", "-o", trace, "--backend", "interp", os.path.join(GUESTS, "hello.elf"))
    expect(rec, 1, [], "recording hello")
    if memory_budget.run([FORGE, trace, forged, "--modules", "20000", big], budget=1 << 40).returncode != 0:
        fail("trace_forge --modules failed")
    rep = deja("replay", forged)
    expect(rep, 2, ["20000 boot modules"], "replaying a trace naming 20,000 modules")
    print("20,000 modules:", rep.figures(), "|", rep.err.strip().splitlines()[-1])
    # One module that is some file on this host: refused, and its hash never shown.
    secret = path("secret")
    with open(secret, "wb") as f:
        f.write(b"not for the trace's author\n")
    if memory_budget.run([FORGE, trace, forged + "2", "--modules", "1", secret], budget=1 << 40).returncode != 0:
        fail("trace_forge --modules failed")
    rep = deja("replay", forged + "2")
    expect(rep, 2, ["differs from the module"], "replaying a trace naming a host file as its module")
    if hashlib.sha256(open(secret, "rb").read()).hexdigest() in rep.err:
        fail(f"replay printed the SHA-256 of a file the trace merely names:\n{rep.err}")
    print("a named host file:", rep.err.strip().splitlines()[-1][:160])


# ---- 7-14: inputs and files --------------------------------------------------------------------------

@case
def text_that_is_not_utf8():
    """7: a --cmdline byte or an image name that is not UTF-8 is refused at record time: no unreadable trace."""
    hello = os.path.join(GUESTS, "hello.elf")
    trace = path("utf8.trace")
    r = deja("record", "-o", trace, "--backend", "interp", "--cmdline", b"n=\xff".decode("utf-8", "surrogateescape"),
             hello)
    expect(r, 2, ["--cmdline is not valid UTF-8"], "record --cmdline with byte 0xff")
    odd = os.path.join(TMP.encode(), b"caf\xe9.elf")
    with open(odd, "wb") as f:
        f.write(open(hello, "rb").read())
    r = deja("record", "-o", trace, "--backend", "interp", odd.decode("utf-8", "surrogateescape"))
    expect(r, 2, ["not valid UTF-8"], "record with an image name that is not UTF-8")
    if os.path.exists(trace) or os.path.exists(trace + ".partial"):
        fail("a refused recording left a trace behind")
    # Text that is UTF-8 goes into the trace and comes out of inspect --json unchanged (14).
    r = deja("record", "-o", trace, "--backend", "interp", "--cmdline", "café", hello)
    expect(r, 1, [], "record --cmdline café")
    j = deja("inspect", "--json", trace)
    doc = json.loads(j.stdout)
    if doc["header"]["config"]["cmdline"] != "café" or "café".encode() not in j.stdout:
        fail(f"inspect --json does not give the command line as café: {j.stdout[:400]}")
    print("not-UTF-8 text refused at record time; café kept as café")


@case
def serial_input_that_is_not_a_file():
    """8: --serial-in /dev/zero and a FIFO are streamed (recorded as events), not hashed up front."""
    hello, echo = os.path.join(GUESTS, "hello.elf"), os.path.join(GUESTS, "serial-echo.elf")
    trace = path("zero-in.trace")
    r = deja("record", "-o", trace, "--backend", "interp", "--serial-in", "/dev/zero", hello, timeout=60)
    expect(r, 1, [], "record --serial-in /dev/zero")
    v = deja("verify", trace)
    expect(v, 0, [], "verify of the /dev/zero recording")
    fifo = path("in.fifo")
    os.mkfifo(fifo)
    data = open(os.path.join(SOURCES, "serial-echo.input"), "rb").read()

    def writer():
        with open(fifo, "wb") as f:
            f.write(data)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    trace = path("fifo-in.trace")
    r = deja("record", "-o", trace, "--backend", "interp", "--serial-in", fifo, echo, timeout=60)
    t.join(5)
    expect(r, 1, [], "record --serial-in FIFO")
    expected = open(os.path.join(SOURCES, "serial-echo.expected"), "rb").read().splitlines()[-1]
    if expected not in r.stdout:
        fail(f"the guest did not receive the FIFO's bytes: {r.stdout[-300:]}")
    rep = deja("replay", trace)
    expect(rep, 1, ["replay OK"], "replay of the FIFO recording")
    print("serial in from /dev/zero and from a FIFO: recorded as events and replayed;", r.figures())


@case
def fifos_are_refused():
    """9: verify, inspect and replay of a FIFO, and a trace naming a FIFO as its image: a message, no hang."""
    fifo = path("trace.fifo")
    os.mkfifo(fifo)
    for cmd in (["verify"], ["inspect"], ["replay"]):
        r = deja(*cmd, fifo, timeout=20)
        expect(r, 2, ["FIFO"], f"deja {cmd[0]} of a FIFO")
    trace, forged = path("hello-9.trace"), path("fifo-image.trace")
    rec = deja("record", "-o", trace, "--backend", "interp", os.path.join(GUESTS, "hello.elf"))
    expect(rec, 1, [], "recording hello")
    if memory_budget.run([FORGE, trace, forged, "--image-path", fifo], budget=1 << 40).returncode != 0:
        fail("trace_forge --image-path failed")
    r = deja("replay", forged, timeout=20)
    expect(r, 2, ["FIFO"], "replay of a trace naming a FIFO as its image")
    print("FIFOs refused:", r.err.strip().splitlines()[-1][:160])


@case
def output_files_are_safe():
    """10: -o never follows a symlink, opens a device, overwrites an input, or destroys an old trace."""
    hello = os.path.join(GUESTS, "hello.elf")
    # A private copy of /dev/full (the same device numbers), so the host's own is never at risk.
    full = path("full")
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    mode = os.stat(full).st_mode
    r = deja("record", "-o", full, "--backend", "interp", hello)
    expect(r, 2, ["is a device"], "record -o DEVICE")
    if os.stat(full).st_mode != mode:
        fail(f"record -o changed the device's mode to {oct(os.stat(full).st_mode)}")
    image = path("image.elf")
    with open(image, "wb") as f:
        f.write(open(hello, "rb").read())
    before = open(image, "rb").read()
    r = deja("record", "-o", image, "--backend", "interp", image)
    expect(r, 2, ["also the guest image"], "record -o IMAGE")
    same = path("same.out")
    r = deja("record", "-o", same, "--serial-out", same, "--backend", "interp", hello)
    expect(r, 2, ["also the serial output"], "record -o X --serial-out X")
    if open(image, "rb").read() != before or os.path.exists(same):
        fail("a refused recording changed a file")
    target = path("target")
    with open(target, "w") as f:
        f.write("someone's file\n")
    link = path("link.trace")
    os.symlink(target, link)
    r = deja("record", "-o", link, "--backend", "interp", hello)
    expect(r, 2, ["symbolic link"], "record -o SYMLINK")
    if open(target).read() != "someone's file\n":
        fail("record -o SYMLINK wrote through the link")
    # A recording killed part-way leaves the old trace as it was and its own prefix beside it.
    trace = path("old.trace")
    expect(deja("record", "-o", trace, "--backend", "interp", hello), 1, [], "recording hello")
    old = open(trace, "rb").read()
    memory_budget.run([DEJA, "record", "-o", trace, "--backend", "interp", hostile("pit-hlt")], kill_after=2)
    if open(trace, "rb").read() != old:
        fail("a killed recording damaged the old trace at its path")
    rep = deja("replay", trace + ".partial")
    expect(rep, 8, ["valid prefix"], "replay of a killed recording's .partial")
    r = deja("record", "-o", trace, "--backend", "interp", hello)
    expect(r, 2, [".partial exists"], "record while an old .partial is there")
    print("output files: device, image, serial-out, symlink refused; a killed recording left", trace + ".partial")


@case
def verify_statuses():
    """11: verify uses deja's even statuses: 2 for what is not a trace, 8 for a damaged or cut one."""
    notrace = path("not.trace")
    with open(notrace, "wb") as f:
        f.write(b"not a trace\n" * 10)
    expect(deja("verify", notrace), 2, [], "verify of a file that is not a trace")
    expect(deja("verify", path("missing.trace")), 2, [], "verify of a missing file")
    trace = path("hello-11.trace")
    expect(deja("record", "-o", trace, "--backend", "interp", os.path.join(GUESTS, "hello.elf")), 1, [], "record")
    data = open(trace, "rb").read()
    with open(trace, "wb") as f:
        f.write(data[:len(data) - 60])
    expect(deja("verify", trace), 8, [], "verify of a truncated trace")
    print("verify: 2 for not a trace, 8 for a truncated one")


@case
def full_disks_and_bad_serial_files():
    """12: a file-size limit stops record with a message and a valid prefix; /dev/full and a directory are errors."""
    trace = path("limited.trace")
    limit = 6 << 20

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = deja("record", "--mem", "4M", "-o", trace, "--backend", "interp", hostile("pit-hlt"), preexec_fn=limited,
             guest_ram=4 << 20, timeout=120)
    expect(r, 10, ["File too large", trace + ".partial"], "record under ulimit -f")
    rep = deja("replay", trace + ".partial", guest_ram=4 << 20, timeout=300)
    expect(rep, 8, ["valid prefix"], "replay of the prefix left by a file-size limit")
    full = path("full")
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    r = deja("record", "-o", path("full-out.trace"), "--serial-out", full, "--backend", "interp",
             os.path.join(GUESTS, "hello.elf"))
    expect(r, 10, ["No space left on device"], "record --serial-out /dev/full")
    os.mkdir(path("adir"))
    r = deja("run", "--serial-in", path("adir"), "--backend", "interp", os.path.join(GUESTS, "hello.elf"))
    expect(r, 2, ["is a directory"], "run --serial-in DIRECTORY")
    print("ulimit -f: exit 10 with the prefix in .partial (replays to exit 8); /dev/full and a directory refused")


@case
def large_file_that_is_not_an_elf():
    """13: a 2 GiB file that is not an ELF is refused from its size or its first bytes, never read whole."""
    big = path("big.bin")
    with open(big, "wb") as f:
        f.truncate(2 << 30)
    r = deja("run", "--backend", "interp", big, timeout=30)
    expect(r, 2, ["larger"], "run of a 2 GiB file with 256 MiB of RAM")
    r2 = deja("run", "--backend", "interp", "--mem", "3G", big, guest_ram=3 << 30, timeout=30)
    expect(r2, 2, ["not an ELF"], "run of a 2 GiB file that is not an ELF")
    if r2.peak_rss > 64 << 20:
        fail(f"the 2 GiB file was read: {r2.figures()}")
    print("2 GiB non-ELF:", r.figures(), "(size) |", r2.figures(), "(magic)")


@case
def consistent_reports():
    """14: the event count record prints is verify's; the serial-in size is stored; a relative image path hints --image."""
    hello, echo = os.path.join(GUESTS, "hello.elf"), os.path.join(GUESTS, "serial-echo.elf")
    trace = path("echo-14.trace")
    serial_in = os.path.join(SOURCES, "serial-echo.input")
    r = deja("record", "-o", trace, "--backend", "interp", "--serial-in", serial_in, echo)
    expect(r, 1, [], "record serial-echo")
    recorded = int(r.err.split("recorded ")[1].split()[0])
    v = deja("verify", trace)
    verified = int(v.stdout.decode().split(" events")[0].split()[-1])
    if recorded != verified:
        fail(f"record said {recorded} events, verify counts {verified}")
    doc = json.loads(deja("inspect", "--json", trace).stdout)
    sizes = [i["size"] for i in doc["inputs"] if i["role"] == "serial-in"]
    if sizes != [os.path.getsize(serial_in)]:
        fail(f"the serial-in size is stored as {sizes}, the file has {os.path.getsize(serial_in)} bytes")
    here = path("rel")
    os.mkdir(here)
    with open(os.path.join(here, "hello.elf"), "wb") as f:
        f.write(open(hello, "rb").read())
    expect(deja("record", "-o", "rel.trace", "--backend", "interp", "hello.elf", cwd=here), 1, [], "record")
    r = deja("replay", os.path.join(here, "rel.trace"), cwd=TMP)
    expect(r, 2, ["--image"], "replay of a relative image path from another directory")
    print(f"record and verify both count {recorded} events; serial-in size stored; --image suggested")


def main(cases=None):
    """Runs the cases named on the command line from `cases` (default: this file's; hostile_files.py has more)."""
    global DEJA, HOSTILE, GUESTS, FORGE, SOURCES, TMP, CASES
    CASES = cases if cases is not None else CASES
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--hostile", required=True, help="directory of the hostile guest images")
    ap.add_argument("--guests", required=True, help="directory of the ordinary guest images")
    ap.add_argument("--forge", help="tests/tools/trace_forge")
    ap.add_argument("--sources", help="guest-tests/ (inputs and expected outputs)")
    ap.add_argument("--case", action="append", help="run only these cases (default: all)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        print("\n".join(CASES))
        return
    DEJA, HOSTILE, GUESTS, FORGE, SOURCES = args.deja, args.hostile, args.guests, args.forge, args.sources
    names = args.case or list(CASES)
    for name in names:
        if name not in CASES:
            fail(f"no case {name}; cases: {', '.join(CASES)}")
    with tempfile.TemporaryDirectory() as tmp:
        TMP = tmp
        for name in names:
            CASES[name]()
    print("PASS")


if __name__ == "__main__":
    main()
