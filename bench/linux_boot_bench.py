#!/usr/bin/env python3
"""Boot speed of the bundled Linux guest: to /init's marker on deja interp, deja KVM (inside the nested-KVM harness
unless --kvm-direct) and QEMU TCG, in the same run, with the same kernel, initramfs and command line.

Prints wall time to the marker, total wall time, instructions (deja's --stats; QEMU does not count them) and, for
KVM, exits per second. The guest runs /scripts/ready, so it powers off right after the marker.
Usage: bench/linux_boot_bench.py [--build build] [--repeat 1] [--skip interp,kvm,qemu] [--json FILE]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "linux"))
import linux_guest  # noqa: E402

SCRIPT = "deja.script=ready"


def boot(argv, timeout=1800):
    """Runs a machine to the end; returns (seconds to the marker, total seconds, output)."""
    start = time.monotonic()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = b""
    marker_s = None
    while True:
        chunk = p.stdout.read1(65536)
        if not chunk:
            break
        out += chunk
        if marker_s is None and linux_guest.MARKER in out:
            marker_s = time.monotonic() - start
    p.wait(timeout=timeout)
    return marker_s, time.monotonic() - start, out.decode(errors="replace")


def deja_figures(output, total_s):
    fig = {}
    m = re.search(r"instructions retired: (\d+)", output)
    if m:
        fig["instructions"] = int(m.group(1))
    exits = sum(int(n) for kind, n in re.findall(r"deja:\s+(\S+)\s+(\d+)$", output, re.M)
                if kind not in ("kicked", "interrupt-window"))
    fig["exits"] = exits
    fig["exits_per_s"] = exits / total_s if total_s else 0
    return fig


def best(repeat, fn):
    runs = [fn() for _ in range(repeat)]
    return min(runs, key=lambda r: r[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--skip", default="", help="comma-separated: interp, kvm, qemu")
    ap.add_argument("--only-kvm", action="store_true", help="(inside the nested harness) measure deja KVM only")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    deja = os.path.join(build, "deja")
    guest_dir = os.path.join(build, "guest-linux")
    os.environ["DEJA_LINUX_GUEST_DIR"] = guest_dir
    skip = set(filter(None, args.skip.split(",")))
    results = {}

    def deja_run(backend):
        argv = [deja, "run", "--backend", backend, "--linux", "--stats", "--append", SCRIPT]
        marker, total, out = best(args.repeat, lambda: boot(argv))
        if marker is None:
            print(f"deja {backend}: no marker; output ends:\n{out[-2000:]}")
            return None
        return {"marker_s": marker, "total_s": total, **deja_figures(out, total)}

    if args.only_kvm:
        results["deja-kvm"] = deja_run("kvm")
        json.dump(results, open(args.json, "w"))
        return 0

    if "interp" not in skip:
        results["deja-interp"] = deja_run("interp")
    if "kvm" not in skip:
        nested_json = os.path.join(build, "linux-boot-bench-kvm.json")
        script = os.path.abspath(__file__)
        cmd = [os.path.join(os.path.dirname(script), "..", "scripts", "kvm-nested.sh"), "--timeout", "1800",
               "--share", build, "--", sys.executable, script, "--build", build, "--repeat", str(args.repeat),
               "--only-kvm", "--json", nested_json]
        t0 = time.monotonic()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        harness_s = time.monotonic() - t0
        if p.returncode == 0 and os.path.exists(nested_json):
            results["deja-kvm-nested"] = json.load(open(nested_json)).get("deja-kvm")
            if results["deja-kvm-nested"]:
                results["deja-kvm-nested"]["harness_s"] = harness_s
        else:
            print(f"deja kvm (nested): failed with status {p.returncode}:\n{p.stdout[-2000:]}")
    if "qemu" not in skip and shutil.which("qemu-system-x86_64"):
        tmp = tempfile.mkdtemp(prefix="deja-linux-bench-")
        kernel = open(os.path.join(guest_dir, "kernel.path")).read().strip()
        vmlinux = os.path.join(tmp, "vmlinux")
        if linux_guest.extract_vmlinux(kernel, vmlinux):
            cmdline = subprocess.run([deja, "run", "--linux", "--print-cmdline"], capture_output=True,
                                     text=True).stdout.strip()
            argv = linux_guest.qemu_argv(vmlinux, os.path.join(guest_dir, "initramfs.cpio"), f"{cmdline} {SCRIPT}")
            marker, total, out = best(args.repeat, lambda: boot(argv))
            results["qemu-tcg"] = {"marker_s": marker, "total_s": total} if marker else None
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{'machine':18} {'to marker':>10} {'total':>8} {'instructions':>14} {'M instr/s':>10} {'exits/s':>9}")
    for name, fig in results.items():
        if not fig:
            print(f"{name:18} {'failed':>10}")
            continue
        instr = fig.get("instructions")
        rate = f"{instr / fig['total_s'] / 1e6:.0f}" if instr else "-"
        exits = f"{fig['exits_per_s']:.0f}" if "exits_per_s" in fig else "-"
        print(f"{name:18} {fig['marker_s']:>9.2f}s {fig['total_s']:>7.2f}s {instr or '-':>14} {rate:>10} {exits:>9}")
    if "deja-interp" in results and results.get("qemu-tcg") and results["deja-interp"]:
        print(f"deja interp / QEMU TCG, time to the marker: "
              f"{results['deja-interp']['marker_s'] / results['qemu-tcg']['marker_s']:.1f}x")
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
