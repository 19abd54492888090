#!/usr/bin/env python3
"""The same jobs on the local executor and on a single-node Slurm cluster started here (scripts/slurm-local.sh):
a 4-segment verify of a recorded Linux boot, a `writes` query, a shard set (the built-in sha256 campaign) and an
explore campaign in shards, each with the same results on both; on Slurm also a task that ends without a result (run again), a job that never starts
(the timeout names it), an interrupt (the jobs are cancelled), a refused job, missing client commands; and corruption
caught naming the segment: a damaged checkpoint, swapped checkpoints, a missing image in the store, results whose
state digests do not chain. Exit status 0 = pass, 1 = fail, 77 = skipped (no Slurm daemons, or no bundled Linux guest).
"""
import argparse
import base64
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--deja", required=True)
ap.add_argument("--guest-dir", required=True, help="the build's guest-linux/ directory")
ap.add_argument("--guest-tests", required=True, help="the build's guest-tests/ directory (explore-race.elf)")
ap.add_argument("--slurm-local", required=True, help="scripts/slurm-local.sh")
args = ap.parse_args()
args.deja, args.guest_dir = os.path.abspath(args.deja), os.path.abspath(args.guest_dir)

for tool in ("slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo"):
    if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
        print(f"skipped: {tool} is not installed (scripts/setup.sh installs Slurm)")
        sys.exit(77)
if not os.path.exists(os.path.join(args.guest_dir, "initramfs.cpio")):
    print("skipped: the bundled Linux guest is not built")
    sys.exit(77)
os.environ["PATH"] += ":/usr/sbin"  # slurmctld and slurmd, for a user whose PATH lacks it

failed = []
started = time.monotonic()


def run(*argv, timeout=600, env=None):
    return subprocess.run([args.deja, *argv], capture_output=True, text=True, timeout=timeout, env=env)


def check(name, ok, r=None, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name} ({time.monotonic() - started:.0f} s){': ' + detail if detail else ''}")
    if not ok:
        failed.append(name)
        if r is not None:
            print(f"  status {r.returncode}\n  stdout: {r.stdout[-1500:]}\n  stderr: {r.stderr[-3000:]}")
    return ok


def executor(kind):
    return ["--executor", kind] + (["-j", "2"] if kind == "local" else [])


def last_line(text, prefix):
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    return lines[-1] if lines else ""


def damage(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


work = tempfile.mkdtemp(prefix="deja-executors-")
cluster = os.path.join(work, "cluster")
try:
    up = subprocess.run([args.slurm_local, "start", cluster], capture_output=True, text=True, timeout=120)
    if not check("slurm-local.sh start: a single-node cluster is up", up.returncode == 0, up):
        raise SystemExit(1)
    os.environ["SLURM_CONF"] = up.stdout.strip().split("=", 1)[1]
    check("the cluster came up", True, detail=f"{time.monotonic() - started:.1f} s")

    # A Linux boot (about 0.75 G instructions) with checkpoints every 200 M instructions taken while recording: 4
    # segments. Writing the first (full) checkpoint can outlast the recorder's heartbeat deadline; the heartbeat must
    # then not land at the checkpoint's coordinate (the segment before it would end one event late).
    trace = os.path.join(work, "boot.trace")
    r = run("record", "--backend", "interp", "--linux", "--append", "deja.script=devices", "-o", trace,
            "--serial-out", os.path.join(work, "boot.out"), "--checkpoint-every", "200M")
    checkpoints = sorted(glob.glob(trace + ".ckpt/*.ckpt"))
    if not check("record a Linux boot with 3 checkpoints", r.returncode == 1 and len(checkpoints) >= 3, r):
        raise SystemExit(1)

    # 1. A 4-segment verify on each executor: the same proof.
    proof = {}
    for kind in ("local", "slurm"):
        r = run("verify", trace, "--replay", "--segments", "4", "--workdir", os.path.join(work, f"verify-{kind}"),
                *executor(kind))
        proof[kind] = last_line(r.stderr, "deja: OK:")
        check(f"verify --replay --segments 4 --executor {kind}",
              r.returncode == 0 and "replayed in 4 segments" in proof[kind] and "5 replay      ok" in r.stdout, r)
        if kind == "slurm":
            m = re.search(r"submit to start ([0-9.]+) s on average", r.stderr)
            check("slurm: an array job and an afterok merge job", "array job" in r.stderr and m is not None, r,
                  f"submit to start {m.group(1) if m else '?'} s a task")
    check("the same proof on both executors", proof["local"] and proof["local"] == proof["slurm"],
          detail=proof["slurm"][:120])

    # 2. A writes query: every write to the per-CPU stack canary, which each context switch writes (gs_base from a
    # point of the boot in the kernel).
    r = run("query", trace, "--at", "300000000", "--regs", "--json")
    gs_base = re.search(r'"gs_base": "(0x[0-9a-f]+)"', r.stdout)
    if check("query --at finds the per-CPU area", r.returncode == 0 and gs_base and gs_base.group(1).startswith(
            "0xffff8"), r):
        target = f"{int(gs_base.group(1), 16) + 0x28:#x}:8"
        writes = {}
        for kind in ("local", "slurm"):
            r = run("query", trace, "--writes", target, "--segments", "4",
                    "--workdir", os.path.join(work, f"writes-{kind}"), *executor(kind))
            writes[kind] = r.stdout
            check(f"query --writes {target} --executor {kind}",
                  r.returncode == 0 and r.stdout.count("\n") > 100, r, f"{r.stdout.count(chr(10))} writes")
        check("the same writes on both executors", writes["local"] == writes["slurm"])

    # 3. A shard set: the built-in sha256 campaign over the guest's files.
    files = sorted(glob.glob(os.path.join(args.guest_dir, "*")) + checkpoints)
    files = [f for f in files if os.path.isfile(f)]
    expected = "".join(f"{line}\n" for line in subprocess.run(["sha256sum", *files], capture_output=True,
                                                               text=True).stdout.splitlines())
    shard_out = {}
    for kind in ("local", "slurm"):
        wd = os.path.join(work, f"shards-{kind}")
        r = run("plan", "--campaign", "sha256", "--shards", "3", "--workdir", wd, "--", *files)
        check(f"plan --campaign sha256 --shards 3 ({kind})", r.returncode == 0, r)
        r = run("merge", "--run", os.path.join(wd, "manifest.json"), *executor(kind))
        shard_out[kind] = r.stdout
        check(f"a shard set on --executor {kind}", r.returncode == 0 and r.stdout == expected, r)
    check("the same shard results on both executors", shard_out["local"] == shard_out["slurm"])
    shards = os.path.join(work, "shards-slurm", "manifest.json")

    # 3b. An explore campaign in shards (2 vCPUs, PCT schedules, 40 seeds): the same seeds fail on both executors.
    explored = {}
    for kind in ("local", "slurm"):
        r = run("explore", "--machine", "pc-apic", "--cpus", "2", "--seeds", "0..39", "--schedule", "pct:2:200",
                "--until", "serial:BUG", "-o", os.path.join(work, f"explore-{kind}"), "--shards", "4",
                "--workdir", os.path.join(work, f"explore-work-{kind}"), *executor(kind),
                os.path.join(args.guest_tests, "explore-race.elf"))
        explored[kind] = re.sub(r"\S*explore-(local|slurm)\S*", "", r.stdout)
        check(f"explore --shards 4 --executor {kind}", r.returncode in (0, 14) and "40 seeds" in r.stdout, r)
    check("the same explore results on both executors", explored["local"] == explored["slurm"],
          detail=explored["slurm"].strip().splitlines()[-1] if explored["slurm"].strip() else "")

    # 4. Slurm's own cases.
    # A task that ends without a result (a node failure) is submitted again; the job still succeeds.
    flaky = os.path.join(work, "flaky-deja")
    once = os.path.join(work, "flaky.once")
    with open(flaky, "w") as f:
        f.write(f"#!/bin/sh\ncase \"$*\" in *'--index 1'*) [ -e {once} ] || {{ touch {once}; kill -9 $$; }} ;; esac\n"
                f"exec {args.deja} \"$@\"\n")
    os.chmod(flaky, 0o755)
    r = run("merge", "--run", shards, "--executor", "slurm", "--worker-deja", flaky)
    check("slurm: a task that ended without a result runs again",
          r.returncode == 0 and "submitting them again" in r.stderr and r.stdout == expected, r)
    # A job that never starts (a partition that is down): a timeout naming the job and Slurm's reason; cancelled.
    r = run("merge", "--run", shards, "--executor", "slurm", "--partition", "down", "--start-timeout", "3")
    job = re.search(r"job (\d+) has not started", r.stderr)
    check("slurm: a job that never starts times out naming it", r.returncode != 0 and job is not None and
          "PartitionDown" in r.stderr and "cancelled jobs" in r.stderr, r)
    # Interrupted: the jobs are cancelled and deja says so.
    p = subprocess.Popen([args.deja, "merge", "--run", shards, "--executor", "slurm", "--partition", "down"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    submitted = p.stderr.readline()  # once it says what it submitted, its jobs are in the queue
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    err = submitted + err
    ids = re.search(r"cancelled jobs ([\d ]+)", err)
    queue = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    check("slurm: SIGINT cancels the jobs", p.returncode == 12 and ids is not None and
          not any(i in queue.split() for i in ids.group(1).split()),
          subprocess.CompletedProcess(p.args, p.returncode, out, err))
    # The cluster refuses the job; the client commands are missing.
    r = run("merge", "--run", shards, "--executor", "slurm", "--partition", "no-such-partition")
    check("slurm: a refused job says what sbatch said", r.returncode != 0 and "refused" in r.stderr and
          "partition" in r.stderr.lower(), r)
    r = run("merge", "--run", shards, "--executor", "slurm", env={**os.environ, "PATH": "/nonexistent"})
    check("slurm: no sbatch on PATH is a clear error", r.returncode == 2 and "slurm-client" in r.stderr, r)

    # 5. Corruption caught on Slurm, naming the segment.
    def planned(name, *extra):
        wd = os.path.join(work, name)
        r = run("plan", trace, "--segments", "4", "--workdir", wd, *extra)
        check(f"plan {name}", r.returncode == 0, r)
        return os.path.join(wd, "manifest.json")

    def copy_checkpoints(name):
        directory = os.path.join(work, name)
        shutil.copytree(trace + ".ckpt", directory)
        return directory, sorted(glob.glob(directory + "/*.ckpt"))

    directory, copies = copy_checkpoints("damaged.ckpt")
    manifest = planned("damaged", "--checkpoints", directory)
    damage(copies[1], 200)
    r = run("merge", "--run", manifest, "--executor", "slurm")
    check("slurm: a damaged checkpoint is caught naming the segment and the file",
          r.returncode != 0 and re.search(r"segment [12]\b", r.stderr) and copies[1] in r.stderr, r)

    directory, copies = copy_checkpoints("swapped.ckpt")
    manifest = planned("swapped", "--checkpoints", directory)
    swap = copies[0] + ".swap"
    os.rename(copies[0], swap)
    os.rename(copies[1], copies[0])
    os.rename(swap, copies[1])
    r = run("merge", "--run", manifest, "--executor", "slurm")
    check("slurm: swapped checkpoints are caught naming the segment",
          r.returncode != 0 and re.search(r"segment [012]\b", r.stderr), r)

    store = os.path.join(work, "store")
    manifest = planned("stored", "--store", store)
    kernel = [i for i in json.load(open(manifest))["inputs"] if i.get("role") == "kernel"]
    if check("the manifest names the kernel", len(kernel) == 1):
        hexsha = base64.b64decode(kernel[0]["sha256"]).hex()
        os.unlink(os.path.join(store, "sha256", hexsha))
        r = run("merge", "--run", manifest, "--executor", "slurm")
        check("slurm: a missing image in the store is caught naming the segment and the image",
              r.returncode != 0 and re.search(r"segment \d", r.stderr) and hexsha in r.stderr, r)

    # Results whose state digests do not chain: segment 1's end digest changed after a good run.
    manifest = os.path.join(work, "verify-slurm", "manifest.json")
    result = os.path.join(work, "verify-slurm", "results", "item-1.json")
    doc = json.load(open(result))
    digest = bytearray(base64.b64decode(doc["end_digest"]))
    digest[0] ^= 0xFF
    doc["end_digest"] = base64.b64encode(bytes(digest)).decode()
    json.dump(doc, open(result, "w"))
    r = run("merge", manifest)
    check("merge: an end digest that does not chain names the segment",
          r.returncode != 0 and re.search(r"segment [12]\b", r.stderr), r)
finally:
    down = subprocess.run([args.slurm_local, "stop", cluster], capture_output=True, text=True, timeout=60)
    if down.returncode != 0:
        print(f"slurm-local.sh stop: {down.stderr}")
    if not failed:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work directory kept: {work}")
print(f"{len(failed)} failed in {time.monotonic() - started:.0f} s")
sys.exit(1 if failed else 0)
