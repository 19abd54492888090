#!/usr/bin/env python3
"""Record/replay of the bundled Linux guest: deja interp against QEMU TCG's record/replay, in the same run, with the
same kernel, initramfs, disk, devices and command line (issue 13, "Size and speed").

Three workloads:
  boot      boot to /init's marker and power off (deja.script=ready on the command line of both machines);
  shell     boot, then a shell session typed over the serial console (linux_test.py's steps: commands, disk read,
            write + sync, read back, /dev/hwrng) and an idle step (`sleep 3`), then power off;
  download  the shell session plus an HTTP download of 8 MiB through the user network from a server on the host's
            loopback (md5 checked).
Each runs as a plain run, a recording and a replay of that recording, on deja interp and on QEMU TCG
(`-icount shift=auto,rr=record|replay,rrfile=F`, `blkreplay` over the disk, `filter-replay` on the netdev,
rng-builtin with `-seed`; QEMU's docs/system/replay.rst). QEMU's replay has a timeout, since its replay of the
download is known to hang. A replay "matched" when it ended with the recording's status and its serial output is
byte-identical to the recording's (deja also checks every event and the final digest: "replay OK").

Prints, per workload: wall and CPU seconds of each run, record/run and replay/record, trace bytes, events,
instructions, trace bytes per second of guest execution and per billion instructions, QEMU's log size, deja's trace
as a fraction of QEMU's log, how long the idle step took recording and replaying, and the issue's aims on interp
(met / not met), judged on wall time and on CPU time. On a loaded machine wall times move by tens of percent between
runs and CPU seconds (user + system of the machine's process) less, but not nothing; with --repeat N the plain runs
and the recordings alternate and the fastest of each is kept. Serial input is typed at most --pace bytes ahead of the
guest's echo on every machine, because QEMU's recording stops taking serial input once its UART's FIFO has filled.

Usage: bench/linux_rr_bench.py [--build build] [--repeat 1] [--workloads boot,shell,download] [--skip deja,qemu]
                               [--qemu-replay-timeout 300] [--download-mib 8] [--pace 8] [--json FILE] [--keep DIR]
       bench/linux_rr_bench.py --report FILE     (the table of an earlier --json FILE again)
"""
import argparse
import json
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

SCRIPT = "deja.script=ready"
WORKLOADS = ("boot", "shell", "download")
IDLE_S = 3  # the shell session's idle step: `sleep IDLE_S`, which replay should skip


def cpu_of_children():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def idle_span(session, n):
    """Seconds between the output of command n's opening and closing markers (the idle step), or None."""
    begin = re.search(rb"@@B%d\r?\n" % n, session.output)
    end = re.search(rb"@@E%d:\d+\r?\n" % n, session.output)
    if not begin or not end:
        return None
    t0, t1 = session.arrived(begin.end()), session.arrived(end.end())
    return None if t0 is None or t1 is None else t1 - t0


class Bench:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build)
        self.deja = os.path.join(self.build, "deja")
        self.guest_dir = os.path.join(self.build, "guest-linux")
        os.environ["DEJA_LINUX_GUEST_DIR"] = self.guest_dir
        self.disk = os.path.join(self.guest_dir, "disk.img")
        self.initramfs = os.path.join(self.guest_dir, "initramfs.cpio")
        self.kernel = open(os.path.join(self.guest_dir, "kernel.path")).read().strip()
        self.kernel_version = self.kernel.split("vmlinuz-")[-1]
        self.cmdline = subprocess.run([self.deja, "run", "--linux", "--print-cmdline"], capture_output=True,
                                      text=True).stdout.strip()
        self.work = args.keep or tempfile.mkdtemp(prefix="deja-linux-rr-bench-")
        os.makedirs(self.work, exist_ok=True)
        self.vmlinux = os.path.join(self.work, "vmlinux")
        self.server = None
        self.idle_command = None  # the idle step's command number, the same in every session

    # --- the machines -------------------------------------------------------------------------------------------

    def deja_argv(self, mode, workload, overlay, trace=None):
        argv = [self.deja, mode] + (["-o", trace] if trace else [])
        argv += ["--backend", "interp", "--linux", "--stats", "--disk", f"{self.disk},overlay={overlay}",
                 "--net", "user", "--rng"]
        return argv + (["--append", SCRIPT] if workload == "boot" else ["--serial-in", "-"])

    def qemu_argv(self, workload, rr=None, rrfile=None):
        cmdline = f"{self.cmdline} {SCRIPT}" if workload == "boot" else self.cmdline
        argv = linux_guest.qemu_argv(self.vmlinux, self.initramfs, cmdline)
        if rr:
            # QEMU's docs/system/replay.rst: the disk behind blkreplay (guest writes in a temporary snapshot),
            # the netdev behind filter-replay, instruction counting with the log.
            argv += ["-icount", f"shift=auto,rr={rr},rrfile={rrfile}",
                     "-drive", f"file={self.disk},format=raw,if=none,snapshot=on,id=img-direct",
                     "-drive", "driver=blkreplay,if=none,image=img-direct,id=d0"]
        else:
            argv += ["-drive", f"file={self.disk},format=raw,if=none,snapshot=on,id=d0"]
        argv += ["-device", "virtio-blk-pci,drive=d0", "-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0"]
        if rr:
            argv += ["-object", "filter-replay,id=replay,netdev=n0"]
        # rng-builtin completes its requests through replay's bottom halves; -seed makes its bytes deterministic.
        argv += ["-object", "rng-builtin,id=r0", "-device", "virtio-rng-pci,rng=r0", "-seed", "1"]
        return argv

    # --- driving a machine --------------------------------------------------------------------------------------

    def drive(self, argv, workload, name):
        """Runs a machine live (plain run or recording), typing the workload in; returns its figures."""
        features = {"--disk": True, "--rng": True, "--net": workload == "download"}
        log = open(os.path.join(self.work, name + ".out"), "wb")
        err = open(os.path.join(self.work, name + ".err"), "wb")
        fig = {"argv": argv}
        steps = []
        cpu0, t0 = cpu_of_children(), time.monotonic()
        session = linux_guest.Session(argv, timeout=self.args.timeout, log=log, stderr=err, pace=self.args.pace)
        try:
            if workload == "boot":
                session.wait_for(re.escape(linux_guest.MARKER))
                if not session.drain():
                    raise linux_guest.GuestError("the machine did not power off after the marker")
                fig["status"] = session.proc.wait()
            else:
                session.boot()
                linux_test.guest_steps(session, features, self.server, self.kernel_version, steps)
                session.check(f"sleep {IDLE_S}")
                self.idle_command = session.count
                fig["idle_s"] = idle_span(session, session.count)
                fig["status"] = session.finish(0, timeout=self.args.timeout)
        except linux_guest.GuestError as e:
            fig["error"] = str(e)[-1500:]
        finally:
            session.kill()
            err.close()
            log.close()
        fig["wall_s"] = time.monotonic() - t0
        fig["cpu_s"] = cpu_of_children() - cpu0
        fig["ready_s"] = session.ready_s
        fig["steps"] = steps
        fig["output"] = session.output
        fig["stderr"] = open(os.path.join(self.work, name + ".err"), errors="replace").read()
        if "error" not in fig and fig.get("status") != 1:
            fig["error"] = f"ended with status {fig.get('status')}, not 1 (deja-exit 0)"
        m = re.search(r"instructions retired: (\d+)", fig["stderr"])
        if m:
            fig["instructions"] = int(m.group(1))
        return fig

    def replay(self, argv, name, recorded, timeout):
        """Runs a replay to its end or the timeout; compares its serial output with the recording's."""
        log = open(os.path.join(self.work, name + ".out"), "wb")
        err = open(os.path.join(self.work, name + ".err"), "wb")
        cpu0, t0 = cpu_of_children(), time.monotonic()
        session = linux_guest.Session(argv, timeout=timeout, log=log, stderr=err)
        finished = session.drain(timeout)
        wall = time.monotonic() - t0
        if not finished:
            session.kill()
        status = session.proc.wait()
        err.close()
        log.close()
        fig = {"argv": argv, "wall_s": wall, "cpu_s": cpu_of_children() - cpu0, "finished": finished,
               "status": status, "timeout_s": timeout}
        fig["stderr"] = open(os.path.join(self.work, name + ".err"), errors="replace").read()
        out, want = session.output, recorded["output"]
        common = 0
        while common < min(len(out), len(want)) and out[common] == want[common]:
            common += 1
        fig["output_bytes"], fig["recorded_bytes"], fig["common_prefix"] = len(out), len(want), common
        fig["matched"] = finished and out == want and status == recorded.get("status")
        lines = [l for l in out[:common].decode(errors="replace").replace("\r", "").split("\n") if l.strip()]
        fig["last_line"] = lines[-1][-100:] if lines else ""
        if self.idle_command:
            fig["idle_s"] = idle_span(session, self.idle_command)
        m = re.search(r"instructions retired: (\d+)", fig["stderr"])
        if m:
            fig["instructions"] = int(m.group(1))
        return fig

    def best(self, *fns):
        """Runs each of `fns` in turn, --repeat times; for each, the run with the least wall time (failed runs only
        when all failed)."""
        runs = [[] for _ in fns]
        for _ in range(self.args.repeat):
            for i, fn in enumerate(fns):
                runs[i].append(fn())
        best = []
        for rs in runs:
            good = [r for r in rs if "error" not in r] or rs
            best.append(min(good, key=lambda r: r["wall_s"]))
        return best

    # --- one workload -------------------------------------------------------------------------------------------

    def workload(self, w, skip):
        res = {}
        self.idle_command = None
        if w == "download":
            self.server = linux_test.BlobServer(self.args.download_mib << 20)
        counter = iter(range(1000))

        def fresh(suffix):
            path = os.path.join(self.work, f"{w}-{next(counter)}.{suffix}")
            if os.path.exists(path):
                os.unlink(path)
            return path

        def deja_record():
            trace = fresh("trace")
            fig = self.drive(self.deja_argv("record", w, fresh("overlay"), trace), w, f"{w}-deja-record")
            fig["file"] = trace
            return fig

        def qemu_record():
            rrfile = fresh("qemu-rr")
            fig = self.drive(self.qemu_argv(w, "record", rrfile), w, f"{w}-qemu-record")
            fig["file"] = rrfile
            return fig

        try:
            # Plain runs and recordings alternate (--repeat), so that a change in the machine's load touches both.
            if "deja" not in skip:
                log(f"{w}: deja run, record")
                res["deja_run"], res["deja_record"] = self.best(
                    lambda: self.drive(self.deja_argv("run", w, fresh("overlay")), w, f"{w}-deja-run"), deja_record)
            if "qemu" not in skip:
                log(f"{w}: qemu run, record")
                res["qemu_run"], res["qemu_record"] = self.best(
                    lambda: self.drive(self.qemu_argv(w), w, f"{w}-qemu-run"), qemu_record)
        finally:
            if self.server:
                self.server.close()  # replays need no network: the received frames are in the recordings
                self.server = None
        if "deja_record" in res and "error" not in res["deja_record"]:
            log(f"{w}: deja replay")
            trace = res["deja_record"]["file"]
            res["deja_replay"], = self.best(lambda: self.replay([self.deja, "replay", trace, "--stats"],
                                                                f"{w}-deja-replay", res["deja_record"],
                                                                self.args.timeout * 3))
            res["deja_replay"]["replay_ok"] = "replay OK" in res["deja_replay"]["stderr"]
            res["deja_replay"]["matched"] = res["deja_replay"]["matched"] and res["deja_replay"]["replay_ok"]
            res["trace_bytes"] = os.path.getsize(trace)
            info = json.loads(subprocess.run([self.deja, "inspect", "--json", trace], capture_output=True,
                                             text=True).stdout or "{}")
            res["events"] = info.get("total_events")
            res["events_by_kind"] = info.get("events_by_kind", {})
            res["guest_s"] = info.get("duration", {}).get("wall_ns", 0) / 1e9
            res["trace_build"] = info.get("header", {}).get("build_id")
            res["instructions"] = info.get("duration", {}).get("instructions") or \
                res["deja_record"].get("instructions")
        if "qemu_record" in res and "error" not in res["qemu_record"]:
            rrfile = res["qemu_record"]["file"]
            res["qemu_log_bytes"] = os.path.getsize(rrfile)
            timeout = self.args.qemu_replay_timeout
            log(f"{w}: qemu replay (timeout {timeout:.0f} s)")
            res["qemu_replay"] = self.replay(self.qemu_argv(w, "replay", rrfile), f"{w}-qemu-replay",
                                             res["qemu_record"], timeout)
        return res


LOG_START = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - LOG_START:7.1f} s, load {os.getloadavg()[0]:.1f}] {msg}", file=sys.stderr, flush=True)


def fmt_s(fig):
    if not fig:
        return "-"
    if "error" in fig:
        return "failed"
    if fig.get("finished") is False:
        return f"did not finish in {fig['timeout_s']:.0f} s"
    return f"{fig['wall_s']:.1f} s ({fig['cpu_s']:.1f} cpu)"


def ratio(a, b, key="wall_s"):
    if not a or not b or "error" in a or "error" in b or a.get("finished") is False or b.get("finished") is False:
        return None
    return a[key] / b[key] if b[key] else None


def fmt_ratio(a, b):
    r, c = ratio(a, b), ratio(a, b, "cpu_s")
    if r is None:
        return "-"
    return f"{r:.2f}x (cpu {c:.2f}x)" if c is not None else f"{r:.2f}x"


def fmt_replay(fig):
    if not fig:
        return "-"
    if not fig["finished"]:
        pct = 100 * fig["common_prefix"] / fig["recorded_bytes"] if fig["recorded_bytes"] else 0
        return f"no: did not finish in {fig['timeout_s']:.0f} s ({pct:.0f}% of the output)"
    extra = " (replay OK)" if fig.get("replay_ok") else ""
    if fig["matched"]:
        return "finished, matched" + extra
    return (f"finished (status {fig['status']}), output differs at byte {fig['common_prefix']} "
            f"of {fig['recorded_bytes']}")


def fmt_idle(run, rec, rep):
    def get(fig):
        v = fig.get("idle_s") if fig and "error" not in fig else None
        return "-" if v is None else f"{v:.2f}"
    if get(rec) == "-":
        return "-"
    replayed = f"{get(rep)} s" if rep and rep.get("idle_s") is not None else "not reached"
    return f"{get(run)} / {get(rec)} -> {replayed}"


def deja_version(deja):
    return subprocess.run([deja, "--version"], capture_output=True, text=True).stdout.strip()


def qemu_version():
    out = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0] if out else "-"


def report(results, load_start, load_end, args, versions):
    names = [w for w in WORKLOADS if w in results]
    rows = []

    def row(label, fn):
        cells = []
        for w in names:
            try:
                cells.append(fn(results[w]))
            except (KeyError, TypeError, ZeroDivisionError):
                cells.append("-")
        rows.append((label, cells))

    def num(v, spec=",d"):
        return "-" if v is None else format(v, spec)

    rows.append(("deja interp", None))
    row("  plain run", lambda r: fmt_s(r.get("deja_run")))
    row("  record", lambda r: fmt_s(r.get("deja_record")))
    row("  replay", lambda r: fmt_s(r.get("deja_replay")))
    row("  record / plain run", lambda r: fmt_ratio(r.get("deja_record"), r.get("deja_run")))
    row("  replay / record", lambda r: fmt_ratio(r.get("deja_replay"), r.get("deja_record")))
    row("  replay finished, matched", lambda r: fmt_replay(r.get("deja_replay")))
    row("  trace bytes", lambda r: num(r["trace_bytes"]))
    row("  events", lambda r: num(r["events"]))
    row("  instructions", lambda r: f"{r['instructions'] / 1e9:.3f} G")
    row("  trace B/s of guest execution",
        lambda r: f"{r['trace_bytes'] / r['guest_s']:,.0f} (over {r['guest_s']:.1f} s)")
    row("  trace B / G instructions", lambda r: f"{r['trace_bytes'] / (r['instructions'] / 1e9):,.0f}")
    row(f"  sleep {IDLE_S}: run / record -> replay", lambda r: fmt_idle(r.get("deja_run"), r.get("deja_record"),
                                                                      r.get("deja_replay")))
    rows.append(("QEMU TCG", None))
    row("  plain run", lambda r: fmt_s(r.get("qemu_run")))
    row("  record", lambda r: fmt_s(r.get("qemu_record")))
    row("  replay", lambda r: fmt_s(r.get("qemu_replay")))
    row("  record / plain run", lambda r: fmt_ratio(r.get("qemu_record"), r.get("qemu_run")))
    row("  replay / record", lambda r: fmt_ratio(r.get("qemu_replay"), r.get("qemu_record")))
    row("  replay finished, matched", lambda r: fmt_replay(r.get("qemu_replay")))
    row("  log bytes", lambda r: num(r["qemu_log_bytes"]))
    row("  log B/s of recording", lambda r: f"{r['qemu_log_bytes'] / r['qemu_record']['wall_s']:,.0f}")
    row(f"  sleep {IDLE_S}: run / record -> replay", lambda r: fmt_idle(r.get("qemu_run"), r.get("qemu_record"),
                                                                      r.get("qemu_replay")))
    row("deja trace / QEMU log", lambda r: f"{r['trace_bytes'] / r['qemu_log_bytes']:.2f}")
    rows.append(("aims on interp", None))

    def aim(ok, text):
        return ("met" if ok else "NOT met") + f" ({text})"

    row("  trace <= 1/10 of QEMU's log",
        lambda r: aim(r["trace_bytes"] * 10 <= r["qemu_log_bytes"], f"{r['trace_bytes'] / r['qemu_log_bytes']:.2f}"))
    def time_aim(a, b, limit):
        # Judged on wall time (the aim's measure) and on CPU time (what a loaded machine disturbs less).
        wall, cpu = ratio(a, b), ratio(a, b, "cpu_s")
        return (f"wall {wall:.2f}x {'met' if wall <= limit else 'NOT met'}, "
                f"cpu {cpu:.2f}x {'met' if cpu <= limit else 'NOT met'}")

    row("  record <= 1.05x plain run", lambda r: time_aim(r["deja_record"], r["deja_run"], 1.05))
    row("  replay <= record", lambda r: time_aim(r["deja_replay"], r["deja_record"], 1.0))

    def idle_aim(r):
        a, b = r["deja_record"].get("idle_s"), r["deja_replay"].get("idle_s")
        if a is None or b is None:
            return "-"
        # The idle step's sleep must vanish from replay: what remains is the work of running `sleep`.
        return aim(a - b >= 0.9 * IDLE_S, f"sleep {IDLE_S}: {a:.2f} s -> {b:.2f} s")

    row("  idle time skipped in replay", idle_aim)

    width = max(len(label) for label, _ in rows)
    colw = [max([len(w)] + [len(cells[i]) for _, cells in rows if cells]) for i, w in enumerate(names)]
    print()
    print(f"load average {load_start[0]:.1f} / {load_start[1]:.1f} / {load_start[2]:.1f} at the start, "
          f"{load_end[0]:.1f} / {load_end[1]:.1f} / {load_end[2]:.1f} at the end; {os.cpu_count()} CPUs; "
          f"--repeat {args.repeat}")
    print(f"deja {versions['deja']}; {versions['qemu']}")
    if versions.get("deja_at_end") and versions["deja_at_end"] != versions["deja"]:
        print(f"WARNING: the deja binary changed during the run, to {versions['deja_at_end']}: figures mix builds")
    print(f"{'':{width}}  " + "  ".join(f"{w:<{colw[i]}}" for i, w in enumerate(names)))
    for label, cells in rows:
        if cells is None:
            print(label)
        else:
            print(f"{label:{width}}  " + "  ".join(f"{c:<{colw[i]}}" for i, c in enumerate(cells)))
    for w in names:
        r = results[w]
        if r.get("events_by_kind"):
            kinds = sorted(r["events_by_kind"].items(), key=lambda kv: -kv[1])
            print(f"{w}: deja events by kind: " + ", ".join(f"{k} {v:,}" for k, v in kinds))
        for key in ("deja_run", "deja_record", "deja_replay", "qemu_run", "qemu_record", "qemu_replay"):
            fig = r.get(key)
            if fig and "error" in fig:
                print(f"{w}: {key} failed: {fig['error'][-600:]}")
            elif fig and fig.get("finished") is False:
                print(f"{w}: {key} did not finish in {fig['timeout_s']:.0f} s; its output matched the recording's "
                      f"for {fig['common_prefix']:,} of {fig['recorded_bytes']:,} bytes, last line: "
                      f"{fig['last_line']!r}")
            elif fig and fig.get("matched") is False:
                print(f"{w}: {key} ended with status {fig['status']}; stderr ends: {fig['stderr'][-400:]!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each live measurement (the fastest is kept)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--skip", default="", help="comma-separated: deja, qemu")
    ap.add_argument("--download-mib", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=900, help="seconds for any one step of a live run")
    ap.add_argument("--qemu-replay-timeout", type=float, default=300,
                    help="seconds after which QEMU's replay counts as not finished")
    ap.add_argument("--pace", type=int, default=8,
                    help="type at most this many bytes ahead of the guest's echo, on every machine (QEMU's recording "
                         "stops taking serial input once its UART's 16-byte FIFO has filled)")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--keep", help="keep traces, logs and outputs in this directory")
    ap.add_argument("--report", metavar="JSON", help="measure nothing: print the table of an earlier --json file")
    args = ap.parse_args()
    if args.report:
        results = json.load(open(args.report))
        load = results.pop("load_average")
        args.repeat = results.pop("repeat", args.repeat)
        versions = results.pop("versions", {"deja": "?", "qemu": "?"})
        report(results, load["start"], load["end"], args, versions)
        return 0
    skip = set(filter(None, args.skip.split(",")))
    if not shutil.which("qemu-system-x86_64"):
        skip.add("qemu")
    bench = Bench(args)
    if not os.path.exists(bench.initramfs):
        print(f"no bundled Linux guest in {bench.guest_dir}")
        return 77
    if "qemu" not in skip and not linux_guest.extract_vmlinux(bench.kernel, bench.vmlinux):
        print("QEMU skipped: the kernel's compression is not readable from Python")
        skip.add("qemu")
    versions = {"deja": deja_version(bench.deja), "qemu": qemu_version() if "qemu" not in skip else "-"}
    load_start = os.getloadavg()
    results = {}
    for w in args.workloads.split(","):
        results[w] = bench.workload(w, skip)
    load_end = os.getloadavg()
    versions["deja_at_end"] = deja_version(bench.deja)
    report(results, load_start, load_end, args, versions)
    if args.json:
        def clean(fig):
            return {k: v for k, v in fig.items() if k not in ("output", "stderr")} if isinstance(fig, dict) else fig
        out = {w: {k: clean(v) for k, v in r.items()} for w, r in results.items()}
        out["load_average"] = {"start": load_start, "end": load_end}
        out["repeat"] = args.repeat
        out["versions"] = versions
        json.dump(out, open(args.json, "w"), indent=1, default=str)
    if args.keep:
        print(f"(traces and logs in {bench.work})")
    else:
        shutil.rmtree(bench.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
