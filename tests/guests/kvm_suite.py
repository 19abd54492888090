#!/usr/bin/env python3
"""The KVM-backend guest matrix, run where /dev/kvm exists (inside scripts/kvm-nested.sh on these machines).

For every guest: run on KVM; record on KVM and replay on KVM and on interp; record on interp in exit-sync mode
and replay on KVM; and, for guests that do not depend on time or entropy, the final state digest on KVM equals
the one on interp. Each check is one guest_test.py invocation, so failures name the guest and the step.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Output independent of time and entropy: the final state must be identical on both backends.
DETERMINISTIC = ["hello", "cpuid", "exceptions", "paging", "memory", "cpu-bound"]
# Spins on a timer without I/O: a KVM recording without a PMU cannot deliver its interrupts (docs/kvm.md).
NO_KVM_RECORD = {"timer"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--guests", required=True)
    ap.add_argument("--sources", required=True)
    ap.add_argument("names", nargs="+")
    args = ap.parse_args()
    if not os.path.exists("/dev/kvm"):
        print("kvm_suite: /dev/kvm does not exist here", file=sys.stderr)
        return 1

    failures = []
    for name in args.names:
        image = os.path.join(args.guests, name + ".elf")
        common = [sys.executable, os.path.join(HERE, "guest_test.py"), "--deja", args.deja, "--image", image]
        extra = []
        if name == "cpu-bound":
            extra += ["--cmdline", "n=2000000"]
        if name == "serial-echo":
            extra += ["--serial-in", os.path.join(args.sources, "serial-echo.input")]
        for suffix in ("expected-deja", "expected", "expected-re"):
            path = os.path.join(args.sources, f"{name}.{suffix}")
            if os.path.exists(path):
                extra += ["--expected", path]
                break
        steps = [("run on kvm", ["--backend", "kvm", "--mode", "run"])]
        if name not in NO_KVM_RECORD:
            steps += [("record/replay on kvm", ["--backend", "kvm", "--mode", "record-replay"]),
                      ("kvm trace replayed on interp",
                       ["--backend", "kvm", "--replay-backend", "interp", "--mode", "record-replay"])]
        steps += [("interp exit-sync trace replayed on kvm",
                   ["--backend", "interp", "--progress", "exit-sync", "--replay-backend", "kvm",
                    "--mode", "record-replay"])]
        if name in DETERMINISTIC:
            steps += [("digest kvm == interp", ["--backend", "kvm", "--mode", "digest-vs-interp"])]
        for label, step in steps:
            start = time.monotonic()
            p = subprocess.run(common + step + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            took = time.monotonic() - start
            ok = p.returncode == 0
            print(f"{'ok  ' if ok else 'FAIL'} {name:<13} {label:<40} {took:6.2f} s", flush=True)
            if not ok:
                failures.append(f"{name}: {label}")
                sys.stdout.write(p.stdout.decode(errors="replace")[-3000:])
    print(f"{len(failures)} failed" if failures else "all KVM guest checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
