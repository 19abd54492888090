#!/usr/bin/env python3
"""Signed traces (issue 26, docs/audit.md): what signing costs a recording, and how fast `deja verify` reads.

1. The Linux workload (docs/linux.md; tests/linux's shell session: commands, disk read and write, /dev/hwrng and an
   HTTP download of --download-mib MiB from a server on the loopback, then power off), recorded on interp three ways,
   interleaved --repeat times, fastest of each kept: unsigned; `--sign KEY` (seals every 10 s, the default, and
   TRACE.sig); `--sign KEY --seal-every 0.1` (a hundred times as many seals). Aim: signing costs at most 1% of record
   time, seals every 10 s nothing measurable. Judged on CPU seconds (user + system of deja) and wall seconds. Also the
   SHA-256 of the trace bytes, which every recording computes as it writes (for TRACE.sig), as a share of the
   recording, measured by hashing the trace here.
2. `deja verify` without --replay on large signed traces (--verify-gib): the download recording's events (network
   frames: the kind of trace that grows to gigabytes) and the boot's (small events, compressing 5-10x) repeated by
   bench/big_trace, sealed every 64 chunks and signed. Aim: at least 1 GB/s of trace, file in the page cache (a
   first read is warmed); `sha256sum` of the same file in the same run is the peer (what any check of TRACE.sig's
   subject needs at least). Also verify's CPU seconds (user + system, all its threads) and the load average, since on
   a shared machine the wall time says as much about the other programs as about verify.

Usage: bench/audit_bench.py [--build build] [--repeat 3] [--download-mib 8] [--verify-gib 1] [--keep DIR]
"""
import argparse
import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "linux"))
import linux_guest  # noqa: E402
import linux_test  # noqa: E402


def cpu_of_children():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def timed(argv, **kw):
    c0, t0 = cpu_of_children(), time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    return r, time.monotonic() - t0, cpu_of_children() - c0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--download-mib", type=int, default=8)
    ap.add_argument("--verify-gib", type=float, default=1.0)
    ap.add_argument("--keep")
    ap.add_argument("--skip", default="", help="record,verify")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    deja = os.path.join(build, "deja")
    os.environ["DEJA_LINUX_GUEST_DIR"] = os.path.join(build, "guest-linux")
    work = args.keep or tempfile.mkdtemp(prefix="deja-audit-bench-")
    os.makedirs(work, exist_ok=True)
    key = os.path.join(work, "bench.key")
    if not os.path.exists(key):
        subprocess.run([deja, "keygen", "-o", key], check=True, capture_output=True)
    guest_dir = os.environ["DEJA_LINUX_GUEST_DIR"]
    disk = os.path.join(guest_dir, "disk.img")
    kernel_version = open(os.path.join(guest_dir, "kernel.path")).read().strip().split("vmlinuz-")[-1]
    server = linux_test.BlobServer(args.download_mib << 20)
    variants = {"unsigned": [], "signed (seals every 10 s)": ["--sign", key],
                "signed, seals every 0.1 s": ["--sign", key, "--seal-every", "0.1"]}
    best = {}
    traces = {}

    def record(name, extra, n):
        trace = os.path.join(work, f"linux-{n}-{len(extra)}.trace")
        for f in (trace, trace + ".sig", trace + ".partial"):
            if os.path.exists(f):
                os.unlink(f)
        overlay = os.path.join(work, "overlay.img")
        if os.path.exists(overlay):
            os.unlink(overlay)
        argv = [deja, "record", "-o", trace, *extra, "--backend", "interp", "--linux", "--disk",
                f"{disk},overlay={overlay}", "--net", "user", "--rng", "--serial-in", "-"]
        c0, t0 = cpu_of_children(), time.monotonic()
        session = linux_guest.Session(argv, timeout=900, log=None, stderr=subprocess.DEVNULL, pace=8)
        try:
            session.boot()
            linux_test.guest_steps(session, {"--disk": True, "--rng": True, "--net": True}, server, kernel_version, [])
            status = session.finish(0, timeout=900)
        finally:
            session.kill()
        wall, cpu = time.monotonic() - t0, cpu_of_children() - c0
        if status != 1 or not os.path.exists(trace):  # isa-debug-exit: `deja-exit 0` ends the machine with 1
            sys.exit(f"{name}: the recording failed (status {status})")
        print(f"  {name:<28} wall {wall:7.2f} s  cpu {cpu:7.2f} s  trace {os.path.getsize(trace):>10} bytes", flush=True)
        b = best.setdefault(name, {"wall": wall, "cpu": cpu})
        b["wall"], b["cpu"] = min(b["wall"], wall), min(b["cpu"], cpu)
        traces[name] = trace

    if "record" not in args.skip:
        print(f"Linux workload (shell session + {args.download_mib} MiB download), recorded on interp, "
              f"{args.repeat} rounds interleaved:")
        for n in range(args.repeat):
            for name, extra in variants.items():
                record(name, extra, n)
        base = best["unsigned"]
        print("fastest of each:")
        for name in variants:
            b = best[name]
            print(f"  {name:<28} wall {b['wall']:7.2f} s ({100 * (b['wall'] / base['wall'] - 1):+5.1f}%)  "
                  f"cpu {b['cpu']:7.2f} s ({100 * (b['cpu'] / base['cpu'] - 1):+5.1f}%)")
        trace = traces["signed (seals every 10 s)"]
        data = open(trace, "rb").read()
        t0 = time.perf_counter()
        for _ in range(20):
            hashlib.sha256(data).digest()
        sha_s = (time.perf_counter() - t0) / 20
        r = subprocess.run([deja, "verify", trace, "--key", key + ".pub"], capture_output=True, text=True)
        seals = re.search(r"(\d+) seals by", r.stdout)
        print(f"  the signed trace: {len(data)} bytes, {seals.group(1) if seals else '?'} seals; hashing it "
              f"({sha_s * 1e3:.1f} ms) is {100 * sha_s / base['cpu']:.3f}% of the recording's CPU time; "
              f"verify --key: {r.stdout.splitlines()[0][:60] if r.stdout else r.stderr}")
        signing_cost = 100 * (best["signed (seals every 10 s)"]["cpu"] / base["cpu"] - 1)
        print(f"aim: signing <= 1% of record time: {'met' if signing_cost <= 1 else 'NOT met'} "
              f"({signing_cost:+.2f}% CPU; the difference between rounds of the same variant is the noise)")

    if "verify" not in args.skip:
        big = os.path.join(build, "bench", "big_trace")
        sources = {}
        if traces:
            sources["network frames (download)"] = traces["unsigned"]
        boot = os.path.join(work, "boot.trace")
        if not os.path.exists(boot):
            subprocess.run([deja, "record", "-o", boot, "--backend", "interp", "--linux", "--append",
                            "deja.script=ready"], capture_output=True, timeout=900)
        sources["small events (boot)"] = boot
        target = int(args.verify_gib * (1 << 30))
        print(f"verify without --replay, {args.verify_gib:g} GiB signed traces (sealed every 64 chunks, TRACE.sig), "
              "in the page cache, best of 3:")
        worst = None
        for name, src in sources.items():
            out = os.path.join(work, "big.trace")
            for f in (out, out + ".sig"):
                if os.path.exists(f):
                    os.unlink(f)
            made = subprocess.run([big, src, out, str(target), key, "64"], capture_output=True, text=True)
            if made.returncode != 0:
                sys.exit(f"big_trace: {made.stderr}")
            size = os.path.getsize(out)
            subprocess.run(["cat", out], stdout=subprocess.DEVNULL)  # into the page cache
            runs = [timed([deja, "verify", out, "--key", key + ".pub"])[1:] for _ in range(3)]
            v, v_cpu = min(r[0] for r in runs), min(r[1] for r in runs)
            r = subprocess.run([deja, "verify", out, "--key", key + ".pub"], capture_output=True, text=True)
            s = min(timed(["sha256sum", out])[1] for _ in range(3))
            ok = r.returncode == 0 and r.stdout.startswith("VERIFIED")
            gbs = size / v / 1e9
            worst = gbs if worst is None else min(worst, gbs)
            print(f"  {name:<28} {size / 1e9:.2f} GB ({made.stdout.strip()}): verify {v:.2f} s = {gbs:.2f} GB/s "
                  f"{'(VERIFIED)' if ok else '(FAILED: ' + r.stdout[:200] + ')'}, {v_cpu:.2f} CPU s = "
                  f"{size / v_cpu / 1e9:.2f} GB per CPU second; sha256sum {s:.2f} s = {size / s / 1e9:.2f} GB/s; "
                  f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
            os.unlink(out)
            os.unlink(out + ".sig")
        print(f"aim: verify >= 1 GB/s of trace: {'met' if worst >= 1 else 'NOT met'} (slowest {worst:.2f} GB/s)")
    server.close()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
