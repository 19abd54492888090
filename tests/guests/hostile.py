#!/usr/bin/env python3
"""Hostile guests, traces and files through the deja binary (issue 11): each case runs under the memory budget."""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memory_budget  # noqa: E402

DEJA = HOSTILE = GUESTS = FORGE = None
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


def main():
    global DEJA, HOSTILE, GUESTS, FORGE, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--hostile", required=True, help="directory of the hostile guest images")
    ap.add_argument("--guests", required=True, help="directory of the ordinary guest images")
    ap.add_argument("--forge", help="tests/tools/trace_forge")
    ap.add_argument("--case", action="append", help="run only these cases (default: all)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        print("\n".join(CASES))
        return
    DEJA, HOSTILE, GUESTS, FORGE = args.deja, args.hostile, args.guests, args.forge
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
