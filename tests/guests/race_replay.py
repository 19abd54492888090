#!/usr/bin/env python3
"""threads-race recorded 20 times with one progress counter: every recording replays to its own outcome, and the outcomes differ."""
import argparse
import os
import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from checked_run import run


def one(args, tmp, i):
    """Records and replays once; returns (outcome, seeker stats line, error or None)."""
    trace = os.path.join(tmp, f"race{i}.trace")
    rec = run([args.deja, "record", "-o", trace, "--backend", "interp", "--progress", args.progress, args.image])
    if rec.returncode != 1:
        return None, None, f"recording {i} exited {rec.returncode}: {rec.stderr.decode(errors='replace')}"
    replays = [[]]
    if args.progress.startswith("emulated-pmu:") and i % 5 == 0:
        replays.append(["--progress", "exact"])  # an emulated-PMU trace is an ordinary exact trace
    stats = None
    for extra in replays:
        rep = run([args.deja, "replay", "--stats", *extra, trace])
        err = rep.stderr.decode(errors="replace")
        if rep.returncode != 1 or rep.stdout != rec.stdout or "replay OK" not in err:
            return None, None, (f"recording {i} did not replay {' '.join(extra)} to its own outcome (exit "
                                f"{rep.returncode}):\n{rec.stdout.decode()}\n---\n{rep.stdout.decode()}\n{err}")
        if not extra:
            stats = next((l for l in err.splitlines() if "coordinate seeking" in l), None)
    return rec.stdout, stats, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--progress", required=True)
    ap.add_argument("--n", type=int, default=20)
    args = ap.parse_args()
    skid = int(args.progress.split(":")[1]) if args.progress.startswith("emulated-pmu:") else 0
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda i: one(args, tmp, i), range(args.n)))
    outcomes = {}
    totals = [0, 0, 0, 0]
    for outcome, stats, error in results:
        if error:
            sys.exit(f"FAIL ({args.progress}): {error}")
        if stats is None:
            sys.exit(f"FAIL ({args.progress}): replay --stats printed no coordinate-seeking line")
        m = re.search(r"skid (\d+)\): (\d+) reached, (\d+) counter overflows, (\d+) breakpoint hits, (\d+) single", stats)
        if not m or int(m.group(1)) != skid:
            sys.exit(f"FAIL ({args.progress}): the replay did not use skid {skid}: {stats}")
        for k in range(4):
            totals[k] += int(m.group(k + 2))
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(f"threads-race --progress {args.progress}: {args.n} recordings, {len(outcomes)} distinct outcomes, each "
          f"replayed exactly; seeking: {totals[0]} coordinates reached, {totals[1]} overflows, {totals[2]} breakpoint "
          f"hits, {totals[3]} single steps")
    if len(outcomes) < 2:
        sys.exit(f"FAIL: threads-race gave the same outcome {args.n} times: interrupts are not landing at host-timed "
                 "points")
    if totals[0] == 0 or totals[2] == 0:
        sys.exit("FAIL: replays reached no coordinate through the seeker")
    print("PASS")


if __name__ == "__main__":
    main()
