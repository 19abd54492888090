#!/usr/bin/env python3
"""deja explore (docs/explore.md), measured against peers in the same run:
- seeds per minute at -j 2 for the small planted-race guest (explore-race, 2 vCPUs) and for the bundled Linux guest
  booting to its marker (about 0.7 G instructions: the ~1 s workload), against one plain `deja run` of each;
- seeds to find the planted race: PCT (with its bound 1/(n k^(d-1))) against uniform random slices against the default
  schedule (no perturbation);
- the cost of exploring: one seed's run (schedule none, no jitter: no perturbation) against `deja record` of the same
  guest and schedule, on the Linux boot (1 vCPU) and the race guest (2 vCPUs); aim <= 1.10x."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def timed(cmd):
    t = time.monotonic()
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True)
    return time.monotonic() - t, p


def campaign(deja, out, argv):
    t, p = timed([deja, "explore", "-o", out, "--json"] + argv)
    lines = [json.loads(l) for l in p.stdout.decode().splitlines() if l.strip()]
    summary = [l for l in lines if l.get("summary")]
    if not summary:
        sys.exit(f"explore failed: {' '.join(argv)}\n{p.stderr.decode(errors='replace')}")
    return t, summary[0], [l for l in lines if "seed" in l]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--race-seeds", type=int, default=1000)
    ap.add_argument("--linux-seeds", type=int, default=8)
    args = ap.parse_args()
    deja = os.path.join(args.build, "deja")
    race = os.path.join(args.build, "guest-tests", "explore-race.elf")
    smp = ["--machine", "pc-apic", "--cpus", "2"]
    linux = ["--linux", "--append", "deja.script=ready"]
    with tempfile.TemporaryDirectory() as tmp:
        print("== seeds to find the planted race (explore-race, 2 vCPUs, --until serial:BUG) ==")
        k = 150
        print(f"PCT bound for d=2, n=2, k={k}: p >= 1/{2 * k} a seed; 95% within {int(3 * 2 * k)} seeds")
        for schedule in (f"pct:2:{k}", "random", "none"):
            t, s, _ = campaign(deja, os.path.join(tmp, schedule.replace(":", "-")),
                               smp + ["--seeds", f"0..{args.race_seeds - 1}", "-j", "2", "--schedule", schedule,
                                      "--until", "serial:BUG", race])
            first = s["first_failing_seed"]
            print(f"{schedule:>10}: {s['failures']:4d} of {s['seeds']} seeds fail; first failing seed "
                  f"{first if first is not None else 'none'}; {s['seeds'] / t * 60:.0f} seeds/min at -j 2")

        print("== seeds per minute at -j 2 ==")
        plain_race = statistics.median(timed([deja, "run", "--backend", "interp", *smp, "--schedule-seed", "1", race])[0]
                                       for _ in range(5))
        t, s, _ = campaign(deja, os.path.join(tmp, "rate"), smp + ["--seeds", "0..199", "-j", "2", "--until",
                                                                    "serial:BUG", race])
        print(f"small guest: {s['seeds'] / t * 60:.0f} seeds/min (a plain `deja run` takes {plain_race * 1000:.0f} ms: "
              f"{60 / plain_race:.0f} runs/min one at a time)")
        plain_linux, _ = timed([deja, "run", "--backend", "interp", *linux])
        t, s, seeds = campaign(deja, os.path.join(tmp, "linux"), linux + ["--seeds", f"1..{args.linux_seeds}", "-j", "2",
                                                                           "--until", "exit:!1"])
        instructions = statistics.median(r["instructions"] for r in seeds)
        print(f"Linux boot to the marker ({instructions / 1e9:.2f} G instructions): {s['seeds'] / t * 60:.1f} seeds/min "
              f"(a plain `deja run` takes {plain_linux:.2f} s: {60 / plain_linux:.1f} runs/min one at a time)")

        print("== exploring one seed against recording it (no perturbation) ==")
        for name, guest, extra in (("Linux boot, 1 vCPU", [], linux), ("race guest, 2 vCPUs", [race], smp)):
            rec, exp = [], []
            for i in range(3):
                trace = os.path.join(tmp, f"plain-{i}.trace")
                sched = ["--schedule-seed", "0"] if guest else []
                rec.append(timed([deja, "record", "--backend", "interp", "-o", trace, *extra, *sched, *guest])[0])
                out = os.path.join(tmp, f"one-{i}")
                exp.append(timed([deja, "explore", "-o", out, "--seed", "1", "--schedule", "none", "--timer-jitter",
                                  "0", "--until", "exit:255", *extra, *guest])[0])
            r, e = statistics.median(rec), statistics.median(exp)
            print(f"{name}: record {r:.3f} s, explore --seed {e:.3f} s: {e / r:.2f}x")


if __name__ == "__main__":
    main()
