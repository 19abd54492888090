#!/usr/bin/env python3
"""Segments on a Linux recording (the bundled guest's busybox workload, about 0.78 G instructions a round): one
sequential replay against `deja verify --replay` with 1, 2 and 4 local workers; what checkpoints cost (a recording with
--checkpoint-every against one without, and `deja index`) and take on disk per guest-minute; and, with
--slurm-local, the Slurm executor's overhead per item (submit to start) beside the local executor's, on the same jobs
in the same run. Ratios are against peers measured here, in this run; the cores may be shared, so they are noisy.
"""
import argparse
import glob
import json
import os
import re
import resource
import subprocess
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--deja", required=True)
ap.add_argument("--guest-dir", required=True)
ap.add_argument("--rounds", type=int, default=14, help="workload rounds (14: about 10.8 G instructions)")
ap.add_argument("--every", default="1G", help="checkpoint interval (1G instructions: a second of guest time)")
ap.add_argument("--segments", default="8")
ap.add_argument("--slurm-local", help="scripts/slurm-local.sh: also run the jobs on a single-node Slurm cluster")
ap.add_argument("--keep", help="keep the traces in this directory")
ap.add_argument("--no-record-checkpoints", action="store_true", help="skip the recording with --checkpoint-every")
args = ap.parse_args()
workload = ["--linux", "--append", f"deja.script=workload deja.rounds={args.rounds}"]


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # deja and the workers it waited for
    return usage.ru_utime + usage.ru_stime


def timed(*argv, ok=(0,)):
    """Wall seconds and the completed process; the CPU seconds it and its workers used go to timed.cpu."""
    t, cpu = time.monotonic(), cpu_seconds()
    r = subprocess.run([args.deja, *argv], capture_output=True, text=True)
    if r.returncode not in ok:
        raise SystemExit(f"deja {' '.join(argv[:3])} failed ({r.returncode}): {r.stderr[-2000:]}")
    timed.cpu = cpu_seconds() - cpu
    return time.monotonic() - t, r


def size(directory):
    return sum(os.path.getsize(f) for f in glob.glob(os.path.join(directory, "*")))


def item_starts(workdir, launched):
    """Per item, from launching the command to the worker's start (the results' started_unix)."""
    waits = []
    for path in glob.glob(os.path.join(workdir, "results", "item-*.json")):
        waits.append(json.load(open(path))["started_unix"] - launched)
    return waits


with tempfile.TemporaryDirectory(dir=args.keep) as work:
    plain, checked = os.path.join(work, "plain.trace"), os.path.join(work, "ckpt.trace")
    record_s, r = timed("record", "--backend", "interp", "-o", plain, "--serial-out", os.devnull, *workload, ok=(1,))
    record_cpu = timed.cpu
    inspect = subprocess.run([args.deja, "inspect", plain], capture_output=True, text=True).stdout
    instructions = int(re.search(r"duration\s+(\d+) instructions", inspect).group(1))
    guest_minutes = instructions / 1e9 / 60  # derived time: 1 ns an instruction (inspect's "time" line)
    print(f"Linux workload, {args.rounds} rounds: {instructions / 1e9:.2f} G instructions "
          f"({guest_minutes * 60:.1f} s of guest time); record {record_s:.1f} s, {record_cpu:.1f} s CPU")
    if not args.no_record_checkpoints:
        record_ckpt_s, r = timed("record", "--backend", "interp", "-o", checked, "--serial-out", os.devnull,
                                 "--checkpoint-every", args.every, *workload, ok=(1,))
        # What taking them cost the recording's thread, as deja measured it: unlike the two runs' totals, not blurred
        # by what else runs on the machine.
        taking = float(re.search(r"([0-9.]+) s CPU on the recording's thread", r.stderr).group(1))
        sizes = [os.path.getsize(f) / 2**20 for f in sorted(glob.glob(checked + ".ckpt/*"))]
        incremental = sizes[1:] or [0]
        print(f"record with --checkpoint-every {args.every} {record_ckpt_s:.1f} s "
              f"({(record_ckpt_s / record_s - 1) * 100:+.1f}%), {timed.cpu:.1f} s CPU "
              f"({(timed.cpu / record_cpu - 1) * 100:+.1f}%); taking the checkpoints {taking:.2f} s CPU "
              f"({taking / record_cpu * 100:.1f}% of the plain recording's): {len(sizes)} checkpoints, {sum(sizes):.1f} MiB "
              f"({sum(sizes) / guest_minutes:.0f} MiB per guest-minute of this run); the full one {sizes[0]:.1f} MiB, "
              f"incremental ones {sum(incremental) / len(incremental):.2f} MiB on average, at most "
              f"{max(incremental):.2f} (zstd; every 16th full)")

    sequential, _ = timed("replay", plain, "--serial-out", os.devnull, ok=(1,))
    sequential_cpu = timed.cpu
    index_s, _ = timed("index", plain, "--every", args.every)
    print(f"sequential replay {sequential:.1f} s, {sequential_cpu:.1f} s CPU "
          f"({instructions / sequential / 1e6:.0f} M instructions/s); "
          f"deja index --every {args.every} {index_s:.1f} s ({index_s / sequential:.2f}x a replay), "
          f"{size(plain + '.ckpt') / 2**20:.1f} MiB")
    for j in (1, 2, 4):
        wd = os.path.join(work, f"verify-j{j}")
        t, r = timed("verify", plain, "--replay", "-j", str(j), "--segments", args.segments, "--workdir", wd)
        if "every event exact" not in r.stderr:
            raise SystemExit(f"verify -j{j} did not prove the trace: {r.stderr[-2000:]}")
        # CPU time is what the cores' sharing does not change: the work the segments add over one replay.
        print(f"verify --replay --segments {args.segments} -j{j}: {t:.1f} s, speedup {sequential / t:.2f}x over one "
              f"sequential replay; {timed.cpu:.1f} s CPU ({timed.cpu / sequential_cpu:.2f}x the replay's)")
        # On a shared machine the wall clock measures the sharing: project the run on two idle cores from the CPU each
        # segment used (the results' cpu_seconds), two at a time in order, plus deja's own plan/check/merge in series.
        items = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(wd, "results", "item-*.json")),
                                                    key=lambda f: int(re.search(r"item-(\d+)", f).group(1)))]
        cpu = [i.get("cpu_seconds", 0) for i in items]
        workers = [0.0, 0.0]
        for c in cpu:
            workers[workers.index(min(workers))] += c
        serial = timed.cpu - sum(cpu)
        projected = serial + max(workers)
        print(f"  segments' CPU {sum(cpu):.1f} s ({min(cpu):.2f}-{max(cpu):.2f} s each), deja's own {serial:.1f} s: "
              f"on two idle cores about {projected:.1f} s, {sequential_cpu / projected:.2f}x one replay's "
              f"{sequential_cpu:.1f} s CPU")

    if args.slurm_local:
        cluster = os.path.join(work, "cluster")
        up = subprocess.run([args.slurm_local, "start", cluster], capture_output=True, text=True)
        if up.returncode != 0:
            raise SystemExit(f"slurm-local.sh start failed: {up.stderr}")
        os.environ["SLURM_CONF"] = up.stdout.strip().split("=", 1)[1]
        try:
            # The same jobs on each executor, two at a time (the node has as many CPUs as this machine: 2 here).
            for kind in ("local", "slurm"):
                wd = os.path.join(work, f"verify-{kind}")
                launched = time.time()
                t, r = timed("verify", plain, "--replay", "--segments", args.segments, "--workdir", wd,
                             "--executor", kind, *(["-j", "2"] if kind == "local" else []))
                waits = sorted(item_starts(wd, launched))
                print(f"{kind}: verify --segments {args.segments} {t:.1f} s ({sequential / t:.2f}x); launch to worker "
                      f"start: first {waits[0]:.2f} s, mean {sum(waits) / len(waits):.2f} s (queued behind the "
                      f"two running)")
            files = sorted(glob.glob(os.path.join(os.path.abspath(args.guest_dir), "*")))
            files = [f for f in files if os.path.isfile(f)]
            per_item = {}
            for kind in ("local", "slurm"):
                wd = os.path.join(work, f"shards-{kind}")
                timed("plan", "--campaign", "sha256", "--shards", "8", "--workdir", wd, "--", *files)
                launched = time.time()
                t, r = timed("merge", "--run", os.path.join(wd, "manifest.json"), "--executor", kind,
                             *(["-j", "2"] if kind == "local" else []))
                waits = sorted(item_starts(wd, launched))
                per_item[kind] = t / 8
                m = re.search(r"submit to start ([0-9.]+) s on average", r.stderr)
                print(f"{kind}: 8 tiny shards {t:.2f} s ({t / 8 * 1000:.0f} ms an item); launch to worker start "
                      f"first {waits[0]:.2f} s, mean {sum(waits) / len(waits):.2f} s"
                      + (f"; deja's sbatch to start {m.group(1)} s a task" if m else ""))
            print(f"slurm/local per tiny item: {per_item['slurm'] / per_item['local']:.1f}x")
        finally:
            subprocess.run([args.slurm_local, "stop", cluster])
