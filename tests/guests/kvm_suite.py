#!/usr/bin/env python3
"""The KVM-backend guest matrix: run, record/replay, cross-backend replay and the KVM-vs-interp state digest.

On a host without /dev/kvm the KVM steps run inside scripts/kvm-nested.sh (one nested boot for all of them)
while the software-CPU steps run on the host, where they are not slowed down by the nested emulator:
  1. host:   record every guest on interp in exit-sync mode; print interp's final digests
  2. nested: run every guest on KVM; record on KVM and replay on KVM; replay the interp traces on KVM;
             print KVM's final digests
  3. host:   replay the KVM traces on interp; compare the digests of guests that depend on no time or entropy
Traces and results are exchanged through a work directory inside the build tree (shared with the nested guest).

With --kvm-deja the nested guest runs the kvm-deja module (docs/kvm-deja.md): RDTSC exits to deja, so the
TSC-dependent guests must record and replay exactly on KVM and across backends, and the checks of the stock
behaviour run with DEJA_KVM_DEJA=off (deja then does not enable the module's exits). On a host whose KVM deja cannot
use directly, that is the only nested matrix (kvm_matrix.sh): one nested boot covers both.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import guest_test  # noqa: E402  (check_expected)

# Output independent of time and entropy: the final state must be identical on both backends.
DETERMINISTIC = ["hello", "cpuid", "exceptions", "paging", "memory", "cpu-bound", "simd", "avx"]
# Spins on a timer without I/O: a KVM recording without a PMU cannot deliver its interrupts (docs/kvm.md).
NO_KVM_RECORD = {"timer"}
# Prints RDTSC values: stock KVM cannot trap RDTSC, so replaying a stock-KVM trace on KVM, or on interp, must be
# reported as divergence (exit status 6), never as a silently different replay; a trace holding RDTSC values
# (interp, or KVM with kvm-deja) is refused up front by stock KVM (exit status 2). With kvm-deja all of these
# replay exactly.
TSC_DEPENDENT = {"nondet"}
DIVERGED, REFUSED = 6, 2
# Checkpoints on KVM replays (docs/debugging.md): through the dirty log, restored, with identical digests.
CHECKPOINTED = {"serial-echo": "16", "paging": "32", "threads-race": "20", "avx": "64"}


def dense_digests(name, backend):
    """A state digest every 2 events, so that the replays (on the other backend too) compare the whole state nearly
    everywhere: apic recorded on KVM (MMIO-write exits, the local APIC's EOI, included, where KVM has finished the
    instruction and the software CPU has not yet); simd and avx recorded on either backend (their XMM/YMM registers,
    MXCSR and XCR0 at every port exit)."""
    return ["--digest-every", "2"] if name in ("simd", "avx") or (name, backend) == ("apic", "kvm") else []

results = []


def step(name, label, cmd, expect_status=1, stdout_expected=None, stdin=subprocess.DEVNULL, timeout=900,
         env=None, stderr_expected=None):
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                           env=None if env is None else {**os.environ, **env})
        ok, why = p.returncode == expect_status, f"exit status {p.returncode}, expected {expect_status}"
        if ok and stderr_expected is not None and stderr_expected.encode() not in p.stderr:
            ok, why = False, f"stderr does not say '{stderr_expected}'"
    except subprocess.TimeoutExpired:
        p, ok, why = None, False, f"timed out after {timeout}s"
    if ok and stdout_expected is not None:
        try:
            guest_test.check_expected(stdout_expected, p.stdout) if isinstance(stdout_expected, str) else None
            if isinstance(stdout_expected, bytes) and p.stdout != stdout_expected:
                ok, why = False, "output differs from the recording"
        except SystemExit:
            ok, why = False, "output does not match the expected file"
    took = time.monotonic() - start
    print(f"{'ok  ' if ok else 'FAIL'} {name:<13} {label:<44} {took:7.2f} s", flush=True)
    if not ok:
        print(f"     {why}: {' '.join(cmd)}")
        if p is not None:
            sys.stdout.write(p.stderr.decode(errors="replace")[-2000:])
    results.append(ok)
    return p


def digest_of(p):
    m = p and re.search(rb"deja: digest ([0-9a-f]{32})", p.stderr)
    return m.group(1).decode() if m else None


def check(name, label, ok, why=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name:<13} {label:<44}", flush=True)
    if not ok:
        print(f"     {why}")
    results.append(ok)


def trace_rdtsc(deja, trace):
    """(rdtsc_trapped from the header, the RDTSC values recorded in the trace)."""
    p = subprocess.run([deja, "inspect", "--events", trace], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    text = p.stdout.decode(errors="replace")
    trapped = re.search(r"rdtsc_trapped=(yes|no)", text)
    values = [int(v, 16) for v in re.findall(r"rdtsc cpu\d+ value=(0x[0-9a-f]+)", text)]
    return (trapped.group(1) == "yes" if trapped else None), values


def printed_rdtsc(stdout):
    m = stdout and re.search(rb"rdtsc: first=(0x[0-9a-f]+) second=(0x[0-9a-f]+)", stdout)
    return [int(m.group(1), 16), int(m.group(2), 16)] if m else None


def kvm_deja_checks(args, name, image, opts, expected, kvm_trace):
    """Nested, with the module: the TSC-dependent guest records and replays exactly on KVM, its RDTSC values are
    in the trace and identical in the replay; with DEJA_KVM_DEJA=off deja behaves as on stock KVM."""
    rec = step(name, "record on kvm (kvm-deja)", [args.deja, "record", "-o", kvm_trace, "--backend", "kvm", *opts,
                                                  image], stdout_expected=expected)
    if rec is None or rec.returncode != 1:
        return
    trapped, values = trace_rdtsc(args.deja, kvm_trace)
    printed = printed_rdtsc(rec.stdout)
    check(name, "kvm trace: rdtsc_trapped=yes", trapped is True, f"header says rdtsc_trapped={trapped}")
    check(name, "kvm trace: the guest's RDTSCs are its events", printed is not None and values == printed,
          f"guest printed {printed}, trace holds {values}")
    rep = step(name, "replay kvm trace on kvm: exact", [args.deja, "replay", "--backend", "kvm", kvm_trace],
               stdout_expected=rec.stdout)
    check(name, "replay on kvm: identical RDTSC values", rep is not None and printed_rdtsc(rep.stdout) == printed,
          f"recorded {printed}, replayed {rep and printed_rdtsc(rep.stdout)}")
    # Without the module's exits (deja told not to use them): today's stock-KVM behaviour.
    off = {"DEJA_KVM_DEJA": "off"}
    step(name, "DEJA_KVM_DEJA=off: trapped trace refused", [args.deja, "replay", "--backend", "kvm", kvm_trace],
         expect_status=REFUSED, env=off, stderr_expected="DEJA_KVM_DEJA=off")
    stock_trace = kvm_trace.replace(".kvm.trace", ".kvm-untrapped.trace")
    stock = step(name, "DEJA_KVM_DEJA=off: record on kvm", [args.deja, "record", "-o", stock_trace, "--backend", "kvm",
                                                          *opts, image], stdout_expected=expected, env=off)
    if stock is not None and stock.returncode == 1:
        trapped, values = trace_rdtsc(args.deja, stock_trace)
        check(name, "untrapped trace: rdtsc_trapped=no, no values", trapped is False and values == [],
              f"rdtsc_trapped={trapped}, {len(values)} RDTSC events")
        step(name, "untrapped trace on kvm: divergence", [args.deja, "replay", "--backend", "kvm", stock_trace],
             expect_status=DIVERGED, env=off)
        # The module is loaded but the recording did not use it: deja must not enable the exits for it.
        step(name, "untrapped trace, module loaded: divergence", [args.deja, "replay", "--backend", "kvm",
                                                                  stock_trace], expect_status=DIVERGED)


def guest_model(name):
    """One CPU model on both backends, so that final states compare: x86-64-v2, the richest the nested harness's KVM
    provides (docs/kvm.md); cpuid on x86-64-v1 (cpuid.expected-deja is its answers), avx on x86-64-v3."""
    return {"cpuid": "x86-64-v1", "avx": "x86-64-v3"}.get(name, "x86-64-v2")


def kvm_models(args):
    """The CPU models this KVM provides (nested: from `deja selftest`, kept for host-after), or None on the host."""
    path = os.path.join(args.work, "kvm-models.json")
    if args.phase == "host-after":
        return json.load(open(path)) if os.path.exists(path) else None
    if args.phase != "nested":
        return None
    p = subprocess.run([args.deja, "selftest"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    m = re.search(r"CPU model features execute\s+ok: models ([^;\n]*)", p.stdout.decode(errors="replace"))
    models = m.group(1).split(", ") if m else []
    print(f"note: this KVM provides {', '.join(models) or 'no model'}")
    with open(path, "w") as f:
        json.dump(models, f)
    return models


def model_refused(args, name, image, opts, interp_trace, model):
    """A guest whose model this KVM lacks: run and replay on KVM are refused up front, naming why."""
    if args.phase != "nested":
        print(f"note {name:<13} no KVM steps: KVM in the harness lacks {model}")
        return
    why = f"cannot run CPU model {model}"
    step(name, f"run on kvm: {model} refused", [args.deja, "run", "--backend", "kvm", *opts, image],
         expect_status=REFUSED, stderr_expected=why)
    if os.path.exists(interp_trace):
        step(name, f"replay interp trace on kvm: {model} refused", [args.deja, "replay", "--backend", "kvm",
                                                                    interp_trace],
             expect_status=REFUSED, stderr_expected=why)


def guest_options(name, sources):
    opts = ["--cpu", guest_model(name)]
    if name == "cpu-bound":
        opts += ["--cmdline", "n=100000"]
    if name == "serial-echo":
        opts += ["--serial-in", os.path.join(sources, "serial-echo.input")]
    if name == "apic":
        opts += ["--machine", "pc-apic"]
    return opts


def expected_file(name, sources):
    for suffix in ("expected-deja", "expected", "expected-re"):
        path = os.path.join(sources, f"{name}.{suffix}")
        if os.path.exists(path):
            return path
    return None


def pmu_fallback(args):
    """Without a usable PMU (as in the nested harness), KVM recording falls back to exit-synchronous delivery with a
    one-line warning naming the failed self-test check, and an exact-mode trace is refused up front on KVM."""
    image = os.path.join(args.guests, "hello.elf")
    exact_trace = os.path.join(args.work, "hello.exact.trace")
    if args.phase == "host-before":
        # x86-64-v2: the richest model the nested harness's KVM runs (docs/kvm.md), so that the refusal below is the
        # PMU's, not the model's.
        step("pmu", "record on interp (exact)", [args.deja, "record", "-o", exact_trace, "--backend", "interp",
                                                 "--cpu", "x86-64-v2", image])
        return
    if args.phase != "nested":
        return
    selftest = step("pmu", "selftest reports the PMU unusable", [args.deja, "selftest"], expect_status=10)
    trace = os.path.join(args.work, "hello.fallback.trace")
    rec = step("pmu", "record on kvm falls back to exit-sync", [args.deja, "record", "-o", trace, "--backend", "kvm",
                                                                 image])
    checks = []
    if rec is not None:
        err = rec.stderr.decode(errors="replace")
        warnings = [l for l in err.splitlines() if "warning: no precise interrupt timing on this host (" in l]
        checks.append((len(warnings) == 1, f"one fallback warning naming the failed check, got: {err}"))
        failed = [l.split()[0] for l in selftest.stdout.decode().splitlines() if "FAILED" in l] if selftest else []
        checks.append((bool(failed) and any(f in warnings[0] for f in failed) if warnings else False,
                       f"the warning names the self-test's failed check {failed}"))
        header = subprocess.run([args.deja, "inspect", "--json", trace], stdout=subprocess.PIPE).stdout.decode()
        checks.append(('"progress_mode":"exit-sync"' in header, f"the trace header says exit-sync: {header[:400]}"))
        # No --cpu: the richest model the usability check found running here.
        richest = re.search(r"CPU model features execute\s+ok: models ([\w.-]+)",
                            selftest.stdout.decode() if selftest else "")
        model = re.search(r'"cpu_model":"([^"]*)"', header)
        checks.append((richest is not None and model is not None and model.group(1) == richest.group(1),
                       f"the default model on kvm, {model and model.group(1)}, is the richest the selftest lists "
                       f"({richest and richest.group(1)})"))
    for ok, why in checks:
        print(f"{'ok  ' if ok else 'FAIL'} pmu           {why.split(',')[0][:60]}")
        if not ok:
            print(f"     {why}")
        results.append(ok)
    refused = step("pmu", "exact trace refused on kvm", [args.deja, "replay", "--backend", "kvm", exact_trace],
                   expect_status=2)
    reason = refused.stderr.decode(errors="replace") if refused else ""
    ok = "KVM on this host cannot reach them" in reason and "--backend interp" in reason
    print(f"{'ok  ' if ok else 'FAIL'} pmu           refusal names the reason and the way out")
    if not ok:
        print(f"     {reason}")
    results.append(ok)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=["host-before", "nested", "host-after"], required=True)
    ap.add_argument("--deja", required=True)
    ap.add_argument("--guests", required=True)
    ap.add_argument("--sources", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--kvm-deja", action="store_true", help="the nested guest runs the kvm-deja module")
    ap.add_argument("names", nargs="+")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    digests_path = os.path.join(args.work, f"digests-{args.phase}.json")
    exact_tsc = args.kvm_deja  # TSC-dependent guests replay exactly across KVM and interp
    digests = {}

    pmu_fallback(args)
    provided = kvm_models(args)
    lacking = {name for name in args.names if provided is not None and guest_model(name) not in provided}
    for name in args.names:
        image = os.path.join(args.guests, name + ".elf")
        opts = guest_options(name, args.sources)
        expected = expected_file(name, args.sources)
        interp_trace = os.path.join(args.work, f"{name}.interp.trace")
        kvm_trace = os.path.join(args.work, f"{name}.kvm.trace")
        if name in lacking:
            model_refused(args, name, image, opts, interp_trace, guest_model(name))
            continue
        if args.phase == "host-before":
            if name in NO_KVM_RECORD:
                continue
            step(name, "record on interp (exit-sync)",
                 [args.deja, "record", "-o", interp_trace, "--backend", "interp", "--progress", "exit-sync", *opts,
                  *dense_digests(name, "interp"), image], stdout_expected=expected)
            if name in DETERMINISTIC:
                digests[name] = digest_of(step(name, "digest on interp",
                                               [args.deja, "run", "--digest", "--backend", "interp", *opts, image]))
        elif args.phase == "nested":
            step(name, "run on kvm", [args.deja, "run", "--backend", "kvm", *opts, image], stdout_expected=expected)
            if name in TSC_DEPENDENT and args.kvm_deja:
                kvm_deja_checks(args, name, image, opts, expected, kvm_trace)
            elif name not in NO_KVM_RECORD:
                rec = step(name, "record on kvm", [args.deja, "record", "-o", kvm_trace, "--backend", "kvm", *opts,
                                                    *dense_digests(name, "kvm"), image],
                       stdout_expected=expected)
                if rec is not None and rec.returncode == 1:
                    if name in TSC_DEPENDENT:
                        step(name, "replay kvm trace on kvm: divergence", [args.deja, "replay", "--backend", "kvm",
                                                                           kvm_trace], expect_status=6)
                    else:
                        step(name, "replay kvm trace on kvm", [args.deja, "replay", "--backend", "kvm", kvm_trace],
                             stdout_expected=rec.stdout)
                        if name in CHECKPOINTED:
                            p = step(name, "kvm checkpoints: dirty log, restore, digests",
                                     [args.deja, "debug", kvm_trace, "--backend", "kvm", "--verify-checkpoints",
                                      "--checkpoint-interval", CHECKPOINTED[name]], expect_status=0,
                                     stderr_expected=" 0 mismatches")
                            if p is not None:
                                print("     " + p.stderr.decode().strip().splitlines()[-1])
            if os.path.exists(interp_trace):
                if name in TSC_DEPENDENT and not exact_tsc:
                    # Its RDTSC values are in the trace; stock KVM cannot hand them to the guest.
                    step(name, "replay interp trace on kvm: refused", [args.deja, "replay", "--backend", "kvm",
                                                                       interp_trace],
                         expect_status=REFUSED, stderr_expected="kvm-deja")
                else:
                    step(name, "replay interp trace on kvm", [args.deja, "replay", "--backend", "kvm", interp_trace])
                    if name in TSC_DEPENDENT:
                        step(name, "DEJA_KVM_DEJA=off: interp trace refused", [args.deja, "replay", "--backend",
                                                                              "kvm", interp_trace],
                             expect_status=REFUSED, env={"DEJA_KVM_DEJA": "off"}, stderr_expected="kvm-deja")
            if name in DETERMINISTIC:
                digests[name] = digest_of(step(name, "digest on kvm",
                                               [args.deja, "run", "--digest", "--backend", "kvm", *opts, image]))
        else:
            if name not in NO_KVM_RECORD:
                if os.path.exists(kvm_trace):
                    diverges = name in TSC_DEPENDENT and not exact_tsc
                    step(name, "replay kvm trace on interp" + (": divergence" if diverges else ""),
                         [args.deja, "replay", "--backend", "interp", kvm_trace],
                         expect_status=DIVERGED if diverges else 1)
                    stock_trace = kvm_trace.replace(".kvm.trace", ".kvm-untrapped.trace")
                    if exact_tsc and name in TSC_DEPENDENT and os.path.exists(stock_trace):
                        step(name, "untrapped kvm trace on interp: divergence",
                             [args.deja, "replay", "--backend", "interp", stock_trace], expect_status=DIVERGED)
                else:
                    print(f"FAIL {name:<13} no KVM trace was recorded")
                    results.append(False)
    if args.phase != "host-after":
        with open(digests_path, "w") as f:
            json.dump(digests, f)
    else:
        try:
            before = json.load(open(os.path.join(args.work, "digests-host-before.json")))
            nested = json.load(open(os.path.join(args.work, "digests-nested.json")))
        except (OSError, ValueError) as e:
            print(f"FAIL digests missing: {e}")
            return 1
        for name in args.names:
            if name not in DETERMINISTIC or name in lacking:
                continue
            same = before.get(name) is not None and before.get(name) == nested.get(name)
            print(f"{'ok  ' if same else 'FAIL'} {name:<13} {'final digest kvm == interp':<44} "
                  f"interp {before.get(name)} kvm {nested.get(name)}")
            results.append(same)
    failed = results.count(False)
    print(f"{args.phase}: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
