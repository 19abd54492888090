#!/usr/bin/env python3
"""deja explore (docs/explore.md), measured against peers in the same run:
- seeds per minute at -j 2 for the small planted-race guest (explore-race, 2 vCPUs) and for the bundled Linux guest
  booting to its marker (about 0.7 G instructions: the ~1 s workload), against one plain `deja run` of each;
- seeds to find the planted race: PCT (with its bound 1/(n k^(d-1))) against uniform random slices against the default
  schedule (no perturbation);
- the cost of exploring: one seed's run (schedule none, no jitter: no perturbation) against `deja record` of the same
  guest and schedule, on the Linux boot (1 vCPU) and the race guest (2 vCPUs); aim <= 1.10x;
- a network: the Linux guest pinging the gateway 20 times and fetching a 16 KiB file over TFTP (--net user,tftp=DIR),
  seeds per minute at -j 2 without faults and with net-drop, net-dup and net-reorder at 5% each, against one plain
  `deja run` of it, and how the transfers ended: whole, or `tftp: timeout` (libslirp's TFTP server never sends a block
  again, so a DATA block lost on its way to the guest ends the transfer) against the seeds that had one lost."""
import argparse
import hashlib
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


def network(deja, tmp, count):
    print("== a network: Linux pings the gateway 20 times and fetches 16 KiB over TFTP, -j 2 ==")
    served = os.path.join(tmp, "tftp")
    os.mkdir(served)
    blob = os.urandom(16 * 1024)
    with open(os.path.join(served, "blob"), "wb") as f:
        f.write(blob)
    whole = f"tftp {len(blob)} bytes md5 {hashlib.md5(blob).hexdigest()}"
    # (No echo service: the script's TCP step is refused at once. With one, nc waits 60 s of guest time, which a plain
    # run spends in host time and explore skips: no comparison.)
    net = ["--linux", "--append", "deja.script=net-faults", "--net", f"user,tftp={served},restrict=on"]
    done = "serial:net-faults: done"
    plain, p = timed([deja, "run", "--backend", "interp", *net])
    if whole not in p.stdout.decode(errors="replace"):
        sys.exit(f"a plain run of the network workload did not fetch the file:\n{p.stdout.decode(errors='replace')}")
    print(f"a plain `deja run` takes {plain:.2f} s: {60 / plain:.1f} runs/min one at a time")
    for faults in ([], ["--faults", "net-drop:5%,net-dup:5%,net-reorder:5%"]):
        out = os.path.join(tmp, "net-faults" if faults else "net")
        t, s, seeds = campaign(deja, out, net + faults + ["--seeds", f"1..{count}", "-j", "2", "--until", done])
        endings = {"whole": 0, "tftp: timeout": 0, "other": 0}
        timeouts_after_lost_block = lost_block = 0
        for r in seeds:
            if r["outcome"] != f"fail: {done}":
                continue  # counted in the outcome histogram printed below
            with open(os.path.join(out, f"seed-{r['seed']}.serial"), errors="replace") as f:
                serial = f.read()
            ending = "whole" if whole in serial else "tftp: timeout" if "tftp: timeout" in serial else "other"
            endings[ending] += 1
            # A DATA block (or the empty last one) from the server's port 69 lost on its way to the guest.
            lost = any("to the guest" in d["detail"] and "dropped (udp 10.0.2.2:69 >" in d["detail"]
                       for d in r.get("perturbations", []))
            lost_block += lost
            timeouts_after_lost_block += lost and ending == "tftp: timeout"
        instructions = statistics.median(r["instructions"] for r in seeds)
        faults_per_seed = statistics.mean(r["faults"] for r in seeds)
        print(f"{'5% drop, dup, reorder' if faults else 'no faults':>22}: {s['seeds'] / t * 60:.1f} seeds/min "
              f"({instructions / 1e9:.2f} G instructions, {faults_per_seed:.1f} faults a seed); "
              f"outcomes {s['outcomes']}; transfers: {endings['whole']} whole, "
              f"{endings['tftp: timeout']} tftp: timeout, {endings['other']} other of {s['seeds']}; a DATA block to "
              f"the guest lost in {lost_block}, of which {timeouts_after_lost_block} timed out; timeouts without a "
              f"lost block: {endings['tftp: timeout'] - timeouts_after_lost_block}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--race-seeds", type=int, default=1000)
    ap.add_argument("--linux-seeds", type=int, default=8)
    ap.add_argument("--net-seeds", type=int, default=40)
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
            t, s, seeds = campaign(deja, os.path.join(tmp, schedule.replace(":", "-")),
                                   smp + ["--seeds", f"0..{args.race_seeds - 1}", "-j", "2", "--schedule",
                                          schedule, "--until", "serial:BUG", race])
            first = s["first_failing_seed"]
            print(f"{schedule:>10}: {s['failures']:4d} of {s['seeds']} seeds fail; first failing seed "
                  f"{first if first is not None else 'none'}; {s['seeds'] / t * 60:.0f} seeds/min at -j 2; "
                  f"{statistics.median(r['schedule_events'] for r in seeds):.0f} schedule events a run (median)")

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

        network(deja, tmp, args.net_seeds)

        print("== exploring one seed against recording it (no perturbation) ==")
        # A race guest's run takes about 20 ms: medians of more runs, or the load of the moment decides the ratio.
        for name, guest, extra, runs in (("Linux boot, 1 vCPU", [], linux, 3),
                                         ("race guest, 2 vCPUs", [race], smp, 15)):
            rec, exp = [], []
            for i in range(runs):
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
