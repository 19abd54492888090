#!/usr/bin/env python3
"""Several vCPUs (docs/smp.md) through the deja binary: smp-counter (a shared counter with and without LOCK) and
smp-ipi (IPIs of every destination kind, NMIs, self IPIs) recorded with --cpus 2 and 4 under several schedule seeds
and replayed exactly (every event checked, the final digest of every vCPU the recording's); the lost updates
differ between seeds and a seed's recording is the same trace twice (the schedule is a pure function of the seed);
`inspect` shows the schedule and each vCPU's counts; bad --cpus options are refused with exit status 2."""
import argparse
import os
import re
import sys
import tempfile

from checked_run import run


def record_and_replay(args, tmp, guest, cpus, seed, progress="exact", replay_modes=("default",), cmdline=None):
    """Records `guest` with `cpus` vCPUs under `seed`; replays it once per mode; returns (trace, serial output)."""
    image = os.path.join(args.guests, f"{guest}.elf")
    trace = os.path.join(tmp, f"{guest}-{cpus}-{seed}-{progress}.trace")
    argv = [args.deja, "record", "-o", trace, "--backend", "interp", "--machine", "pc-apic", "--cpus", str(cpus),
            "--schedule-seed", str(seed), "--progress", progress]
    if cmdline:
        argv += ["--append", cmdline]
    rec = run(argv + [image])
    if rec.returncode != 1:
        sys.exit(f"FAIL: recording {guest} --cpus {cpus} seed {seed} ({progress}) exited {rec.returncode}:\n"
                 f"{rec.stdout.decode(errors='replace')}\n{rec.stderr.decode(errors='replace')}")
    for mode in replay_modes:
        extra = [] if mode == "default" else ["--interp-mode", mode]
        rep = run([args.deja, "replay", *extra, trace])
        err = rep.stderr.decode(errors="replace")
        if rep.returncode != 1 or rep.stdout != rec.stdout or "replay OK" not in err:
            sys.exit(f"FAIL: {guest} --cpus {cpus} seed {seed} ({progress}) did not replay ({mode}) exactly (exit "
                     f"{rep.returncode}):\n{rec.stdout.decode()}\n---\n{rep.stdout.decode()}\n{err}")
    return trace, rec.stdout.decode(errors="replace")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--guests", required=True, help="the build's guest-tests/ directory")
    ap.add_argument("--trace-same", required=True, help="the trace_same tool")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # The race: lost updates depend on the schedule, and each recording replays to its own.
        lost = {}
        for seed in (1, 2, 3, 4):
            trace, out = record_and_replay(args, tmp, "smp-counter", 2, seed, cmdline="increments=50000",
                                           replay_modes=("default", "reference") if seed == 1 else ("default",))
            m = re.search(r"unlocked (\d+) \((\d+) lost\)", out)
            if not m or "locked 100000 of 100000" not in out:
                sys.exit(f"FAIL: smp-counter seed {seed} printed:\n{out}")
            lost[seed] = int(m.group(2))
        print(f"smp-counter --cpus 2: lost updates by seed {lost}, each replayed exactly")
        if len(set(lost.values())) < 2:
            sys.exit("FAIL: every seed lost the same number of updates: the schedule does not depend on the seed")
        # The same seed, recorded again: the same trace (no event per switch, nothing from the host).
        again, _ = record_and_replay(args, tmp, "smp-counter", 2, 1, progress="exact", cmdline="increments=50000",
                                     replay_modes=())
        os.rename(again, again + ".again")
        first, _ = record_and_replay(args, tmp, "smp-counter", 2, 1, cmdline="increments=50000", replay_modes=())
        same = run([args.trace_same, first, again + ".again"])
        if same.returncode != 0:
            sys.exit(f"FAIL: two recordings under seed 1 differ: {same.stderr.decode(errors='replace')}")
        print("smp-counter seed 1 recorded twice: the same trace")
        inspect = run([args.deja, "inspect", first]).stdout.decode(errors="replace")
        for needed in ("seed 1", "vCPU 0", "vCPU 1"):
            if needed not in inspect:
                sys.exit(f"FAIL: inspect does not show '{needed}':\n{inspect}")
        # Four vCPUs, and the exit-synchronous schedule (slices of guest exits, as KVM without a PMU).
        _, out = record_and_replay(args, tmp, "smp-counter", 4, 9, cmdline="increments=20000")
        if "4 processors" not in out:
            sys.exit(f"FAIL: smp-counter --cpus 4 printed:\n{out}")
        record_and_replay(args, tmp, "smp-counter", 3, 5, progress="exit-sync", cmdline="increments=20000")
        print("smp-counter --cpus 4 (exact) and --cpus 3 (exit-sync): replayed exactly")
        # IPIs: every destination kind, NMIs and self IPIs, exact counts; replayed with the JIT and the reference.
        for cpus, seed in ((2, 11), (4, 12)):
            _, out = record_and_replay(args, tmp, "smp-ipi", cpus, seed, replay_modes=("default", "reference"))
            if "all delivered" not in out:
                sys.exit(f"FAIL: smp-ipi --cpus {cpus} printed:\n{out}")
            print(f"smp-ipi --cpus {cpus}: {out.strip().splitlines()[-1]}; replayed exactly (JIT, reference)")
        # Bad options: exit status 2 with the reason.
        image = os.path.join(args.guests, "smp-counter.elf")
        for bad, reason in ((["--machine", "pc-apic", "--cpus", "0"], "1 to"),
                            (["--machine", "pc-apic", "--cpus", "17"], "1 to"),
                            (["--cpus", "2"], "pc-apic"),
                            (["--machine", "pc-apic", "--schedule-seed", "3"], "several vCPUs")):
            p = run([args.deja, "run", *bad, image])
            if p.returncode != 2 or reason not in p.stderr.decode(errors="replace"):
                sys.exit(f"FAIL: deja run {' '.join(bad)} exited {p.returncode}, not 2 saying '{reason}':\n"
                         f"{p.stderr.decode(errors='replace')}")
        print("bad --cpus options refused (exit status 2)")
    print("PASS")


if __name__ == "__main__":
    main()
