#!/usr/bin/env python3
"""`deja query --dump`: memory images that gdb and readelf read as QEMU's dump-guest-memory cores.

Records the `memory` guest on the software CPU, then at the end of the trace and at an event in the middle:
  - readelf: an ELF64 little-endian x86-64 core, one PT_NOTE and one PT_LOAD at guest-physical 0 whose size is
    the guest's RAM right after the notes (p_align 0, as QEMU writes it: crash reads it as a QEMU core); notes "CORE" NT_PRSTATUS and "QEMU" (QEMUCPUState) for the one vCPU;
  - gdb opens the core with no executable: the bytes it reads at guest-physical addresses equal `deja query --mem
    --phys` at the same point (the guest's code and the stack the guest wrote), and its RIP and RSP equal `--regs`;
  - the raw image has the same bytes at the same offsets, and is exactly RAM's size;
  - the output-file rules: a dump is never one of the replay's inputs (the trace, by path, hard link or symbolic
    link; the image), never written through a symbolic link or into a device; a failed dump leaves no .partial;
    an earlier file at the path is replaced only by a complete dump;
  - --progress-json: the query's progress as JSON lines on stderr, the last one "done".
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)


def query_bytes(deja, trace, at, addr, length):
    r = run([deja, "query", trace, "--at", at, "--mem", f"{addr:#x}:{length}", "--phys", "--json"])
    if r.returncode != 0:
        sys.exit(f"query --mem failed: {r.stderr}")
    return bytes.fromhex(json.loads(r.stdout)["bytes"])


def query_regs(deja, trace, at):
    r = run([deja, "query", trace, "--at", at, "--regs", "--json"])
    return {k: int(v, 16) for k, v in json.loads(r.stdout)["registers"].items()}


def gdb_read(core, addr, length, registers=()):
    cmds = ["-ex", "set pagination off", "-ex", f"core-file {core}", "-ex", f"x/{length}xb {addr:#x}"]
    for reg in registers:
        cmds += ["-ex", f"p/x ${reg}"]
    r = run(["gdb", "-nx", "-batch", *cmds])
    data = bytes(int(b, 16) for b in re.findall(r"0x([0-9a-f]{2})(?![0-9a-f])", r.stdout.split("\n$")[0]
                                                 if "$1" in r.stdout else r.stdout))
    regs = {m.group(1): int(m.group(2), 16) for m in re.finditer(r"\$(\d+) = 0x([0-9a-f]+)", r.stdout)}
    return data[:length], [regs.get(str(i + 1)) for i in range(len(registers))], r


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deja", required=True)
    parser.add_argument("--guests", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="deja-dump-")
    try:
        image = os.path.join(args.guests, "memory.elf")
        trace = os.path.join(work, "memory.trace")
        r = run([args.deja, "record", "--backend", "interp", "--mem", "64M", "-o", trace, image])
        check(os.path.exists(trace), f"record memory.elf ({r.stderr.strip()[-200:]})")
        events = json.loads(run([args.deja, "inspect", "--json", trace]).stdout)["footer"]["total_events"]
        ram = 64 << 20

        for at in ("end", f"event:{max(1, int(events) // 2)}"):
            core = os.path.join(work, f"dump-{at.replace(':', '-')}.elf")
            r = run([args.deja, "query", trace, "--at", at, "--dump", core, "--progress-json"])
            check(r.returncode == 0 and os.path.exists(core), f"{at}: query --dump writes {core} ({r.stderr[-300:]})")
            progress = [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]
            check(bool(progress) and progress[-1].get("done") is True and progress[-1].get("progress") == "query",
                  f"{at}: --progress-json ends with a done line ({progress[-1:] if progress else r.stderr[-200:]})")
            check(not os.path.exists(core + ".partial"), f"{at}: no .partial left")

            h = run(["readelf", "-h", core]).stdout
            check("ELF64" in h and "2's complement, little endian" in h and "CORE (Core file)" in h and
                  "X86-64" in h, f"{at}: readelf -h: an ELF64 little-endian x86-64 core")
            lines = run(["readelf", "-lW", core]).stdout
            loads = re.findall(r"^\s+LOAD\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+"
                               r"(0x[0-9a-f]+)", lines, re.M)
            notes_ph = re.findall(r"^\s+NOTE\s+", lines, re.M)
            check(len(notes_ph) == 1 and len(loads) == 1, f"{at}: readelf -l: one NOTE and one LOAD ({lines[-600:]})")
            if loads:
                offset, vaddr, paddr, filesz, memsz = (int(x, 16) for x in loads[0])
                check(paddr == 0 and vaddr == 0 and filesz == ram and memsz == ram and offset < 4096,
                      f"{at}: PT_LOAD at guest-physical 0, {ram} bytes, right after the notes (offset {offset:#x})")
                check(os.path.getsize(core) == offset + ram, f"{at}: the file ends with RAM")
            notes = run(["readelf", "-nW", core]).stdout
            check(re.search(r"CORE\s+0x00000150\s+NT_PRSTATUS", notes) is not None,
                  f"{at}: an NT_PRSTATUS note of 336 bytes ({notes.strip()[-300:]})")
            check(re.search(r"QEMU\s+0x000001b8\s+", notes) is not None, f"{at}: a QEMU CPU-state note of 440 bytes")
            # The memory guest's own pattern over RAM from 16 MiB: known bytes, read by gdb from the core.
            pattern = ((0x1000000 ^ 0x5a5a5a5a5a5a5a5a) * 0x9e3779b97f4a7c15) & (2 ** 64 - 1)
            got, _, _ = gdb_read(core, 0x1000000, 8)
            if at == "end":
                check(got == struct.pack("<Q", pattern), f"{at}: gdb reads the guest's pattern at 16 MiB "
                                                         f"({got.hex()} vs {struct.pack('<Q', pattern).hex()})")

            regs = query_regs(args.deja, trace, at)
            for addr, length in ((0x100000, 64), (regs["rsp"] & ~0xf, 32)):
                want = query_bytes(args.deja, trace, at, addr, length)
                got, _, g = gdb_read(core, addr, length)
                check(got == want, f"{at}: gdb reads {length} bytes at {addr:#x} as query --mem --phys does "
                                   f"({got.hex()[:32]} vs {want.hex()[:32]}; {g.stderr.strip()[-200:]})")
            _, (rip, rsp), g = gdb_read(core, 0x100000, 1, ("rip", "rsp"))
            check(rip == regs["rip"] and rsp == regs["rsp"],
                  f"{at}: gdb's $rip/$rsp from NT_PRSTATUS ({rip}, {rsp}) are query --regs' "
                  f"({regs['rip']:#x}, {regs['rsp']:#x})")

            # `info registers` as a user types it: every general register of NT_PRSTATUS is query --regs' value.
            info = run(["gdb", "-nx", "-batch", "-ex", f"core-file {core}", "-ex", "info registers"]).stdout
            shown = {m.group(1): int(m.group(2), 16) for m in re.finditer(r"^(\w+)\s+0x([0-9a-f]+)", info, re.M)}
            gprs = ["rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", *(f"r{i}" for i in range(8, 16)), "rip"]
            wrong = [n for n in gprs if shown.get(n) != regs.get(n)]
            check(not wrong, f"{at}: gdb's info registers shows query --regs' values (differ: {wrong}; {info[:200]!r})")

            raw = os.path.join(work, f"dump-{at.replace(':', '-')}.raw")
            r = run([args.deja, "query", trace, "--at", at, "--dump", raw, "--format", "raw"])
            check(r.returncode == 0 and os.path.getsize(raw) == ram, f"{at}: --format raw is RAM, {ram} bytes")
            with open(raw, "rb") as f:
                f.seek(0x100000)
                check(f.read(64) == query_bytes(args.deja, trace, at, 0x100000, 64),
                      f"{at}: the raw image holds RAM at its own offsets")

        # The output-file rules.
        with open(trace, "rb") as f:
            before = f.read()
        link = os.path.join(work, "link.trace")
        os.symlink(trace, link)
        hard = os.path.join(work, "hard.trace")
        os.link(trace, hard)
        for target, why in ((trace, "the trace"), (link, "a symbolic link to the trace"), (hard, "a hard link to it"),
                            (image, "the guest image"), ("/dev/null", "a device")):
            r = run([args.deja, "query", trace, "--at", "end", "--dump", target])
            check(r.returncode == 2, f"--dump onto {why} is refused with status 2 ({r.stderr.strip()[-160:]})")
        dangling = os.path.join(work, "dangling")
        os.symlink(os.path.join(work, "nowhere"), dangling)
        r = run([args.deja, "query", trace, "--at", "end", "--dump", dangling])
        check(r.returncode == 2 and not os.path.exists(os.path.join(work, "nowhere")),
              "--dump through a dangling symbolic link is refused, nothing created")
        with open(trace, "rb") as f:
            check(f.read() == before, "the trace is unchanged")
        old = os.path.join(work, "old.elf")
        with open(old, "w") as f:
            f.write("an earlier file")
        r = run([args.deja, "query", trace, "--at", "event:999999999", "--dump", old])
        check(r.returncode == 2 and open(old).read() == "an earlier file" and not os.path.exists(old + ".partial"),
              "a query that fails leaves an earlier file at the path as it was, and no .partial")
        r = run([args.deja, "query", trace, "--at", "end", "--dump", old, "--format", "bogus"])
        check(r.returncode == 2, "--format other than elf or raw is refused")
    finally:
        if not FAILURES:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    print(f"{'FAILED' if FAILURES else 'passed'}: {len(FAILURES)} failures")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
