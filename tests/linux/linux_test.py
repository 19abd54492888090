#!/usr/bin/env python3
"""The bundled Linux guest on deja: boot to /init's marker, then serial commands, the virtio disk (read, write into
the overlay with the base image unchanged), /dev/hwrng, an HTTP fetch through slirp from a server on the host's
loopback, and power-off through isa-debug-exit. With --qemu, the same kernel, initramfs and disk also boot under
QEMU and the guest's own output (the commands' output, timestamps masked) must be the same as on deja.

Device steps run when this deja has the option they need (--disk, --rng, --net); the report says which were
skipped. Exit status 0 = pass, 1 = fail, 77 = skipped (no bundled guest built; --record-replay-workload: no tshark
to read the pcap back, after everything else passed).
"""
import argparse
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import linux_guest  # noqa: E402

FILE_TEXT = "deja virtio disk: the quick brown fox jumps over the lazy dog\n"
WRITE_MARK = "deja-overlay-write-0123456789"
WRITE_SECTOR = 6000  # beyond the tar archive


def deja_options(deja):
    help_text = subprocess.run([deja, "run", "--help"], capture_output=True, text=True).stdout
    return {opt: opt in help_text for opt in ("--disk", "--net", "--rng")}


class BlobServer:
    """An HTTP server on 127.0.0.1 serving one pseudo-random file, for the guest to fetch through slirp."""

    def __init__(self, size):
        self.blob = hashlib.shake_256(b"deja-linux-http").digest(size)
        self.md5 = hashlib.md5(self.blob).hexdigest()
        blob = self.blob

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", str(len(blob)))
                self.end_headers()
                self.wfile.write(blob)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def replay_variants(args):
    """The replays --replay asks for, as `deja replay` options: "default" is none, "KEY=VALUE" is --KEY VALUE (e.g.
    interp-mode=threaded, progress=exact)."""
    variants = []
    for spec in args.replay or ["default"]:
        if spec == "default":
            variants.append((spec, []))
        else:
            key, _, value = spec.partition("=")
            variants.append((spec, [f"--{key}", value]))
    return variants


def replay_each(args, trace, recorded, workdir, name, results, timeout):
    """Replays `trace` once per --replay variant. Each must end with status 1 and `replay OK` (every event checked,
    the final state digest equal to the recording's), print byte for byte the serial output `recorded`, and end in
    the same state digest as the others. Returns the replays' wall times."""
    seconds = []
    digests = set()
    for i, (spec, extra) in enumerate(replay_variants(args)):
        replayed = os.path.join(workdir, f"{name}-replayed-{i}.out")
        argv = [args.deja, "replay", trace, "--serial-out", replayed, "--stats", *extra]
        t0 = time.monotonic()
        rep = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        seconds.append(time.monotonic() - t0)
        with open(os.path.join(workdir, f"{name}-replay-{i}.err"), "w") as f:
            f.write(rep.stderr)
        if rep.returncode != 1 or "replay OK" not in rep.stderr:
            raise linux_guest.GuestError(f"replay {i + 1} ({spec}: {' '.join(argv)}) ended with status "
                                         f"{rep.returncode}:\n{rep.stderr[-3000:]}")
        if open(replayed, "rb").read() != recorded:
            raise linux_guest.GuestError(f"replay {i + 1} ({spec}: {' '.join(argv)}): the replayed serial output "
                                         f"differs from the recorded one ({replayed})")
        summary = next(line for line in rep.stderr.splitlines() if "replay OK" in line)
        digests.add(summary.split("digest matches (")[-1].split(")")[0])
        seeking = next((line.strip().removeprefix("deja: ") for line in rep.stderr.splitlines()
                        if "coordinate seeking" in line), "no coordinate-seeking line")
        # On interp the replay reaches coordinates with the recording's counter unless the variant names another
        # (exit-synchronous recordings, KVM's or interp's, need no seeking).
        progress = extra[1] if extra[:1] == ["--progress"] else args.progress or "exact"
        skid = progress.split(":")[1] if progress.startswith("emulated-pmu:") else "0"
        if args.backend == "interp" and progress != "exit-sync" and f"skid {skid})" not in seeking:
            raise linux_guest.GuestError(f"replay {i + 1} ({spec}) did not seek with skid {skid}: {seeking}")
        results.append(f"replay {i + 1} ({spec}) {seconds[-1]:.1f} s: {summary.strip().removeprefix('deja: ')}; "
                       f"{seeking}")
    if len(digests) != 1:
        raise linux_guest.GuestError(f"the replays ended in different state digests: {sorted(digests)}")
    return seconds


def guest_steps(session, features, server, kernel_version, results):
    """The steps whose output is compared across machines: a list of (name, output)."""
    compared = []

    def step(name, command, expect=None, timeout=None):
        t0 = time.monotonic()
        out = session.check(command, timeout)
        if expect is not None and out.strip() != expect.strip():
            raise linux_guest.GuestError(f"{name}: `{command}` printed {out!r}, expected {expect!r}")
        results.append(f"{name}: ok ({time.monotonic() - t0:.1f} s)")
        compared.append((name, linux_guest.mask(out)))
        return out

    step("serial commands", "echo hello-$((6*7))", "hello-42")
    step("kernel", "uname -r", kernel_version)
    step("cmdline", "cat /proc/cmdline")
    if features["--disk"]:
        step("disk read", "tar -xOf /dev/vda ./hello.txt", FILE_TEXT)
        step("disk write", f"echo {WRITE_MARK} | dd of=/dev/vda bs=512 seek={WRITE_SECTOR} conv=notrunc,sync "
                           "2>/dev/null; sync; echo done", "done")
        step("disk read back", f"dd if=/dev/vda bs=512 skip={WRITE_SECTOR} count=1 2>/dev/null | head -1", WRITE_MARK)
    else:
        results.append("disk: skipped (this deja has no --disk)")
    if features["--rng"]:
        step("hwrng", "head -c 64 /dev/hwrng | wc -c", "64")
    else:
        results.append("hwrng: skipped (this deja has no --rng)")
    if features["--net"]:
        step("net up", "/scripts/net-up; echo up", "up")
        step("http fetch", f"wget -q -O - http://10.0.2.2:{server.port}/blob | md5sum", f"{server.md5}  -",
             timeout=600)
    else:
        results.append("http: skipped (this deja has no --net)")
    return compared


def run_deja(args, features, server, kernel_version, workdir, results):
    extra = []
    overlay = os.path.join(workdir, "overlay.img")
    disk = os.path.join(args.guest_dir, "disk.img")
    if features["--disk"]:
        extra += ["--disk", f"{disk},overlay={overlay}"]
    if features["--net"]:
        extra += ["--net", "user"]
    if features["--rng"]:
        extra += ["--rng"]
    argv = linux_guest.deja_argv(args.deja, args.backend, extra, stats=True)
    base_sha = sha256(disk)
    log = open(os.path.join(workdir, f"deja-{args.backend}.log"), "wb")
    session = linux_guest.Session(argv, timeout=args.timeout, log=log)
    try:
        ready = session.boot()
        results.append(f"deja {args.backend}: boot to the marker in {ready:.1f} s")
        compared = guest_steps(session, features, server, kernel_version, results)
        cmdline = session.check("cat /proc/cmdline").strip()
        status = session.finish(5)
    finally:
        session.kill()
    if status != 11:
        raise linux_guest.GuestError(f"deja-exit 5 should end deja with status 11 ((5 << 1) | 1), got {status}")
    results.append("power off through isa-debug-exit: ok (status 11)")
    if features["--disk"]:
        if sha256(disk) != base_sha:
            raise linux_guest.GuestError(f"the base disk image {disk} changed")
        if WRITE_MARK.encode() not in open(overlay, "rb").read():
            raise linux_guest.GuestError(f"the overlay {overlay} does not hold the guest's write")
        results.append("base image unchanged, overlay holds the write: ok")
    stats = session.output.decode(errors="replace")
    for line in stats.splitlines():
        if "instructions retired" in line or "unimplemented" in line:
            results.append(line.strip())
    return compared, cmdline


def run_qemu(args, features, server, kernel_version, cmdline, workdir, results):
    kernel = open(os.path.join(args.guest_dir, "kernel.path")).read().strip()
    vmlinux = os.path.join(workdir, "vmlinux")
    if not linux_guest.extract_vmlinux(kernel, vmlinux):
        results.append("qemu: skipped (the kernel's compression is not readable from Python)")
        return None
    argv = linux_guest.qemu_argv(vmlinux, os.path.join(args.guest_dir, "initramfs.cpio"), cmdline,
                                 disk=os.path.join(args.guest_dir, "disk.img") if features["--disk"] else None,
                                 net=features["--net"], rng=features["--rng"])
    log = open(os.path.join(workdir, "qemu.log"), "wb")
    session = linux_guest.Session(argv, timeout=args.timeout, log=log)
    qemu_results = []
    try:
        ready = session.boot()
        results.append(f"qemu tcg: boot to the marker in {ready:.1f} s")
        compared = guest_steps(session, features, server, kernel_version, qemu_results)
        status = session.finish(5)
    finally:
        session.kill()
    if status != 11:
        raise linux_guest.GuestError(f"QEMU ended with status {status}, not 11")
    return compared


def progress_option(args):
    return ["--progress", args.progress] if args.progress else []


def digest_option(args):
    return ["--digest-every", str(args.digest_every)] if args.digest_every else []


def record_replay(args, workdir, results):
    """Records a boot that runs /scripts/devices and powers off, replays it once per --replay, and compares the
    serial output."""
    trace = os.path.join(workdir, "boot.trace")
    recorded = os.path.join(workdir, "recorded.out")
    t0 = time.monotonic()
    # On pc-apic the virtio devices come too: Linux drives them through MSI-X there, which must replay as well.
    devices = []
    if args.machine == "pc-apic" and all(deja_options(args.deja).values()):
        devices = ["--disk", os.path.join(args.guest_dir, "disk.img"), "--net", "user", "--rng"]
    rec = subprocess.run([args.deja, "record", "--backend", args.backend, "--machine", args.machine, "--linux",
                          "--append", "deja.script=devices", "-o", trace, "--serial-out", recorded, *devices,
                          *progress_option(args), *digest_option(args)],
                         capture_output=True, text=True, timeout=args.timeout)
    if rec.returncode != 1 or b"deja-linux: ready" not in open(recorded, "rb").read():
        raise linux_guest.GuestError(f"record ended with status {rec.returncode}:\n{rec.stderr[-2000:]}")
    record_s = time.monotonic() - t0
    replay_s = replay_each(args, trace, open(recorded, "rb").read(), workdir, "boot", results, args.timeout)
    inspect = subprocess.run([args.deja, "inspect", trace], capture_output=True, text=True).stdout
    for role in ("input        kernel", "input        initrd"):
        if role not in inspect:
            raise linux_guest.GuestError(f"the trace header has no '{role.split()[-1]}' input:\n{inspect}")
    if f"machine      {args.machine} " not in inspect:
        raise linux_guest.GuestError(f"the trace header does not name machine {args.machine}:\n{inspect}")
    if devices:
        # The image is identified by its SHA-256 (small images are hashed whole): a changed copy is refused up front.
        changed = os.path.join(workdir, "changed-disk.img")
        data = bytearray(open(os.path.join(args.guest_dir, "disk.img"), "rb").read())
        data[600] ^= 0xff
        open(changed, "wb").write(data)
        refused = subprocess.run([args.deja, "replay", trace, "--disk", changed, "--serial-out", os.devnull],
                                 capture_output=True, text=True, timeout=args.timeout)
        if refused.returncode == 0 or "SHA-256" not in refused.stderr or changed not in refused.stderr:
            raise linux_guest.GuestError(f"replay with a changed disk image was not refused up front "
                                         f"(status {refused.returncode}):\n{refused.stderr[-2000:]}")
        results.append("a changed disk image is refused up front: ok")
        listed = open(recorded, "rb").read()
        for needed in (b"0x1af4:0x1042", b"0x1af4:0x1041", b"0x1af4:0x1044", b"vda 8192 sectors", b"virtio_rng"):
            if needed not in listed:
                raise linux_guest.GuestError(f"the guest did not list {needed!r} among its devices")
    results.append(f"record {record_s:.1f} s ({args.progress or 'default'} progress), replays "
                   f"{', '.join(f'{s:.1f}' for s in replay_s)} s, {os.path.getsize(trace)} bytes: "
                   + rec.stderr.strip().splitlines()[-1].removeprefix("deja: "))


def record_replay_smp(args, workdir, results):
    """Records boots of an SMP machine (--cpus, pc-apic) under each --schedule-seed, running /scripts/smp: Linux
    must bring up every CPU through INIT-SIPI-SIPI and its real-mode trampoline, and smp-race's threads (one per CPU)
    race on shared counters, futexes and pipes. Each recording replays exactly (--replay variants); the unlocked
    counter's total, which depends on the schedule, is reported per seed. With --shell the script is typed into the
    guest's shell over serial, after a look at the CPUs, instead of named on the kernel command line."""
    totals = {}
    for seed in args.schedule_seed or [1]:
        name = f"smp{args.cpus}-seed{seed}"
        trace = os.path.join(workdir, f"{name}.trace")
        recorded = os.path.join(workdir, f"{name}.out")
        argv = [args.deja, "record", "--backend", args.backend, "--machine", "pc-apic", "--linux",
                "--cpus", str(args.cpus), "--schedule-seed", str(seed), "-o", trace,
                *progress_option(args), *digest_option(args)]
        t0 = time.monotonic()
        if args.shell:
            with open(os.path.join(workdir, f"{name}-record.err"), "wb") as err:
                extra = ["--append", " ".join(args.append)] if args.append else []
                session = linux_guest.Session(argv + extra + ["--serial-in", "-"], timeout=args.timeout, stderr=err)
                try:
                    session.boot()
                    session.check("grep -c ^processor /proc/cpuinfo")
                    session.check("sh /scripts/smp")
                    status = session.finish(0, timeout=args.timeout)
                finally:
                    session.kill()
            with open(recorded, "wb") as f:
                f.write(session.output)
        else:
            cmdline = " ".join(["deja.script=smp", *args.append])
            rec = subprocess.run(argv + ["--append", cmdline, "--serial-out", recorded],
                                 capture_output=True, text=True, timeout=args.timeout)
            status = rec.returncode
            with open(os.path.join(workdir, f"{name}-record.err"), "w") as f:
                f.write(rec.stderr)
        record_s = time.monotonic() - t0
        stderr = open(os.path.join(workdir, f"{name}-record.err"), errors="replace").read()
        out = open(recorded, "rb").read().decode(errors="replace")
        if status != 1 or "deja-linux: ready" not in out:
            raise linux_guest.GuestError(f"record ({name}) ended with status {status}:\n"
                                         f"{out[-2000:]}\n{stderr[-2000:]}")
        brought_up = f"smp: Brought up 1 node, {args.cpus} CPUs"
        online = f"cpus online: 0-{args.cpus - 1} ({args.cpus})"
        race = re.search(r"smp-race: .*", out)
        if brought_up not in out or online not in out or not race:
            raise linux_guest.GuestError(f"{name}: the guest did not report '{brought_up}', '{online}' and "
                                         f"smp-race's line:\n{out[-3000:]}")
        if f"smp-race: {args.cpus} threads" not in race.group(0):
            raise linux_guest.GuestError(f"{name}: smp-race did not run {args.cpus} threads: {race.group(0)}")
        replay_s = replay_each(args, trace, open(recorded, "rb").read(), workdir, name, results, args.timeout)
        inspect = subprocess.run([args.deja, "inspect", trace], capture_output=True, text=True).stdout
        if f"seed {seed}" not in inspect:
            raise linux_guest.GuestError(f"{name}: inspect does not show the schedule's seed:\n{inspect}")
        totals[seed] = race.group(0)
        results.append(f"{name}: {brought_up}; {race.group(0)}; record {record_s:.1f} s, replays "
                       f"{', '.join(f'{s:.1f}' for s in replay_s)} s, {os.path.getsize(trace)} bytes")
    if len(totals) > 1:
        lost = {seed: re.search(r"\((\d+) lost\)", line).group(1) for seed, line in totals.items()}
        results.append(f"lost updates by seed: {lost}")


def record_replay_workload(args, workdir, results):
    """Records a boot and a shell session typed in over serial that uses the virtio disk (read a file, write a
    sector, sync, drop the page cache, read it back), the hwrng and an HTTP download of --download-mib MiB through
    slirp from a server on the host's loopback; then stops the server and replays the trace exactly: every event
    checked, the final state digest and the serial output equal, the base image and the overlay untouched. Then
    inspects the trace (inspect_linux_trace); returns whether tshark was there to read the pcap."""
    server = BlobServer(args.download_mib << 20)
    disk = os.path.join(args.guest_dir, "disk.img")
    overlay = os.path.join(workdir, "rr-overlay.img")
    trace = os.path.join(workdir, "workload.trace")
    base_sha = sha256(disk)
    argv = [args.deja, "record", "--backend", args.backend, "--linux", "-o", trace,
            "--disk", f"{disk},overlay={overlay},hash={args.disk_hash}", "--net", "user", "--rng",
            "--serial-in", "-", *progress_option(args), *digest_option(args)]
    log = open(os.path.join(workdir, "workload-record.log"), "wb")
    err = open(os.path.join(workdir, "workload-record.err"), "wb")
    t0 = time.monotonic()
    session = linux_guest.Session(argv, timeout=args.timeout, log=log, stderr=err)
    try:
        ready = session.boot()
        results.append(f"record: boot to the marker in {ready:.1f} s")

        def step(name, command, expect, timeout=None):
            t = time.monotonic()
            out = session.check(command, timeout)
            if out.strip() != expect.strip():
                raise linux_guest.GuestError(f"{name}: `{command}` printed {out!r}, expected {expect!r}")
            results.append(f"record: {name}: ok ({time.monotonic() - t:.1f} s)")

        step("disk read", "tar -xOf /dev/vda ./hello.txt", FILE_TEXT)
        step("disk write", f"echo {WRITE_MARK} | dd of=/dev/vda bs=512 seek={WRITE_SECTOR} conv=notrunc,sync "
                           "2>/dev/null; sync; echo 3 > /proc/sys/vm/drop_caches; echo done", "done")
        step("disk read back", f"dd if=/dev/vda bs=512 skip={WRITE_SECTOR} count=1 2>/dev/null | head -1",
             WRITE_MARK)
        step("hwrng", "head -c 64 /dev/hwrng | wc -c", "64")
        step("net up", "/scripts/net-up; echo up", "up")
        step(f"http fetch of {args.download_mib} MiB", f"wget -q -O - http://10.0.2.2:{server.port}/blob | md5sum",
             f"{server.md5}  -", timeout=args.timeout)
        tsc_spin(session, args.tsc_spin_ms, results)
        status = session.finish(0, timeout=args.timeout)
    finally:
        session.kill()
        err.close()
    record_s = time.monotonic() - t0
    stderr = open(os.path.join(workdir, "workload-record.err"), errors="replace").read()
    if status != 1:
        raise linux_guest.GuestError(f"record ended with status {status}, not 1:\n{stderr[-2000:]}")
    server.close()  # replay needs no network: received frames are in the trace
    overlay_sha = sha256(overlay)
    with open(overlay, "rb") as f:
        if WRITE_MARK.encode() not in f.read():
            raise linux_guest.GuestError(f"the overlay {overlay} does not hold the guest's write")
    with open(os.path.join(workdir, "workload-recorded.out"), "wb") as f:
        f.write(session.output)
    replay_s = replay_each(args, trace, session.output, workdir, "workload", results, args.timeout * 2)
    if sha256(disk) != base_sha:
        raise linux_guest.GuestError(f"the base disk image {disk} changed")
    if sha256(overlay) != overlay_sha:
        raise linux_guest.GuestError(f"replay wrote to the overlay {overlay}")
    inspect = subprocess.run([args.deja, "inspect", trace], capture_output=True, text=True).stdout
    for what in ("disk         ", "net          user", "rng          yes"):
        if what not in inspect:
            raise linux_guest.GuestError(f"the trace header does not show '{what.strip()}':\n{inspect}")
    counts = {}
    for line in inspect.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] in ("async", "entropy", "net_transmit", "disk_block",
                                                                      "interrupt", "rdtsc", "clock"):
            counts[parts[0]] = int(parts[1])
    results.append(f"record {record_s:.1f} s ({args.progress or 'default'} progress), replays "
                   f"{', '.join(f'{s:.1f}' for s in replay_s)} s, trace {os.path.getsize(trace)} bytes "
                   f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})")
    look_at_linux_trace(args, trace, workdir, results)
    return inspect_linux_trace(args, trace, server.port, args.download_mib << 20, workdir, results)


TSC_KHZ = 2000000  # the CPU model's TSC rate (tsc_early_khz on the bundled guest's command line)
TSC_SPIN_LINE = re.compile(r"tsc-spin: (rdtsc|clock_gettime) (\d+) reads over (\d+) (ticks|ns), steps (\d+)-(\d+), "
                           r"(\d+) backwards, hash ([0-9a-f]{16})")


def tsc_spin(session, ms, results):
    """Runs /bin/tsc-spin: `ms` ms of guest time spinning in user space on RDTSC, then as long on
    clock_gettime(CLOCK_MONOTONIC) through the vDSO. Its output (the reads' count, span and a hash of every step)
    depends on each TSC value it read, so the replays' byte-identical serial output checks them all."""
    t0 = time.monotonic()
    out = session.check(f"tsc-spin {ms * TSC_KHZ} {ms * 1000000}")
    seen = {m.group(1): m for m in TSC_SPIN_LINE.finditer(out)}
    wanted = {"rdtsc": ms * TSC_KHZ, "clock_gettime": ms * 1000000}
    for what, span in wanted.items():
        m = seen.get(what)
        if m is None or int(m.group(2)) < 2 or int(m.group(3)) < span or int(m.group(7)) != 0:
            raise linux_guest.GuestError(f"tsc-spin: no {what} line spanning {span} with no step backwards:\n{out}")
    results.append(f"record: tsc-spin {ms} ms each: " + ", ".join(
        f"{what} {seen[what].group(2)} reads, steps {seen[what].group(5)}-{seen[what].group(6)} {seen[what].group(4)}"
        for what in wanted) + f" ({time.monotonic() - t0:.1f} s)")


def look_at_linux_trace(args, trace, workdir, results):
    """Issue 27 on the workload's trace: its HTML page (at most 2 MiB, drawn in headless Chromium in under a second
    with no console error, a screenshot that is not blank kept in --artifacts), a memory dump at the end (an ELF core
    of all of RAM, its rate), and `crash` on that dump where a vmlinux with debug symbols is installed."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "logging"))
    import html_browser_check
    page = os.path.join(workdir, "workload.html")
    t0 = time.monotonic()
    r = subprocess.run([args.deja, "inspect", trace, "--html", page], capture_output=True, text=True,
                       timeout=args.timeout)
    if r.returncode != 0 or not os.path.exists(page):
        raise linux_guest.GuestError(f"inspect --html ended with status {r.returncode}:\n{r.stderr[-2000:]}")
    size = os.path.getsize(page)
    if size > 2 << 20:
        raise linux_guest.GuestError(f"the workload's HTML page is {size} bytes, more than 2 MiB")
    shown = f"html: {size} bytes, written in {time.monotonic() - t0:.1f} s"
    os.makedirs(args.artifacts or workdir, exist_ok=True)
    png = os.path.join(args.artifacts or workdir, "linux-workload-timeline.png")
    # Inside the nested harness QEMU's TCG emulates Chromium too (a page load takes minutes there): the page is the
    # same on every backend, and the host's own Linux tests draw it.
    browser = None if os.environ.get("DEJA_NESTED_TCG") else html_browser_check.check_page(page, png)
    if browser is None:
        shown += ("; not drawn inside the nested harness" if os.environ.get("DEJA_NESTED_TCG")
                  else "; Chromium not installed: not drawn")
    else:
        if browser["errors"] or browser["other_requests"] or browser["rendered"] != "yes":
            raise linux_guest.GuestError(f"Chromium on {page}: {browser}")
        if browser["render_ms"] >= 1000 or browser["screenshot"]["non_white_fraction"] < 0.02:
            raise linux_guest.GuestError(f"Chromium draws {page} in {browser['render_ms']} ms, screenshot "
                                         f"{browser['screenshot']}")
        shown += (f"; Chromium draws it in {browser['render_ms']:.0f} ms (load event at "
                  f"{browser['navigation_to_load_ms']:.0f} ms), {browser['svg_rects']} bars, {browser['table_rows']} "
                  f"rows, no console error; screenshot {png}")
    results.append(shown)

    core = os.path.join(workdir, "workload-end.elf")
    t0 = time.monotonic()
    r = subprocess.run([args.deja, "query", trace, "--at", "end", "--dump", core], capture_output=True, text=True,
                       timeout=args.timeout * 2)
    if r.returncode != 0:
        raise linux_guest.GuestError(f"query --dump ended with status {r.returncode}:\n{r.stderr[-2000:]}")
    wrote = [line for line in r.stderr.splitlines() if line.startswith(f"deja: wrote {core}")]
    results.append(f"dump: {wrote[0][6:] if wrote else core} (query with replay {time.monotonic() - t0:.1f} s)")
    release = open(os.path.join(args.guest_dir, "kernel.path")).read().strip().split("vmlinuz-")[-1]
    # Debian's debug symbols of the kernel (/usr/lib/debug/boot), or the vmlinux alone (scripts/crash-symbols.sh).
    candidates = [f"/usr/lib/debug/boot/vmlinux-{release}",
                  os.path.join(args.guest_dir, "..", "crash-symbols", f"vmlinux-{release}")]
    vmlinux = next((c for c in candidates if os.path.exists(c)), candidates[0])
    if shutil.which("crash") and os.path.exists(vmlinux):
        c = subprocess.run(["crash", "-s", vmlinux, core], input="sys\nlog | tail -5\nps\nquit\n",
                           capture_output=True, text=True, timeout=args.timeout)
        if c.returncode != 0 or f"RELEASE: {release}" not in c.stdout or "swapper/0" not in c.stdout:
            raise linux_guest.GuestError(f"crash on {core}:\n{c.stdout[-2000:]}{c.stderr[-2000:]}")
        results.append(f"crash {vmlinux} {core}: sys names {release}; log and ps read")
    else:
        results.append(f"crash: skipped (no {vmlinux}: scripts/crash-symbols.sh fetches it, 860 MB; docs/debugging.md)")


def inspect_linux_trace(args, trace, port, download_bytes, workdir, results):
    """`deja inspect` on the workload's trace: the kernel's version, the command line, user space, the HTTP connection
    with its bytes, the disk write, and the pcap export, which tshark must read and see the HTTP exchange in.
    Returns False when tshark is missing (that check skipped), True when everything was checked."""
    kernel = open(os.path.join(args.guest_dir, "kernel.path")).read().strip()
    release = kernel.split("vmlinuz-")[-1]
    pcap = os.path.join(workdir, "workload.pcap")
    t0 = time.monotonic()
    ins = subprocess.run([args.deja, "inspect", "--pcap", pcap, trace], capture_output=True, text=True,
                         timeout=args.timeout)
    if ins.returncode != 0:
        raise linux_guest.GuestError(f"inspect --pcap ended with status {ins.returncode}:\n{ins.stderr[-2000:]}")
    text = ins.stdout
    sector = WRITE_SECTOR // 8 * 8  # Linux writes the page holding the sector
    wanted = [f"kernel       {release} ", f"from the bzImage setup header of the kernel image {kernel}",
              "cmdline      \"console=ttyS0 ", f"-> 10.0.2.2:{port}  opened by the guest",
              f"at offset {sector * 512} (sector {sector})", "boot: Linux kernel", "end: exit status 1"]
    # Exact progress (interp) puts interrupts anywhere, user space included; exit-synchronous recording (KVM
    # without a PMU) only at the guest's own exits, which may all be the kernel's.
    if args.backend == "interp":
        wanted.append("user space   event ")
    for want in wanted:
        if want not in text:
            raise linux_guest.GuestError(f"inspect does not show '{want}':\n{text}")
    doc = json.loads(subprocess.run([args.deja, "inspect", "--json", trace], capture_output=True, text=True,
                                    timeout=args.timeout).stdout)
    if not doc["linux"]["kernel_version"].startswith(release + " "):
        raise linux_guest.GuestError(f"inspect --json gives kernel version {doc['linux']['kernel_version']!r}")
    http = [c for c in doc["connections"] if c["remote"] == f"10.0.2.2:{port}" and c["protocol"] == "tcp"]
    if len(http) != 1 or http[0]["bytes_to_guest"] < download_bytes or http[0]["opened_by"] != "guest":
        raise linux_guest.GuestError(f"inspect --json does not show the download's connection: {doc['connections']}")
    disk = doc["disk_traffic"][0]
    if disk["written_bytes"] < 512 or disk["read_bytes"] < 512:
        raise linux_guest.GuestError(f"inspect --json gives disk traffic {disk}")
    nic = doc["nic_traffic"][0]
    user = doc["linux"].get("first_user_space") or {}
    located = f"from event {user['event']} (+{user['guest_ns'] / 1e9:.1f} s)" if "event" in user else "not located"
    results.append(f"inspect: kernel {release}, user space {located}, {len(doc['connections'])} connections, the download "
                   f"{http[0]['bytes_to_guest']} bytes in, disk {disk['read_bytes']} bytes read / "
                   f"{disk['written_bytes']} written, {nic['frames_received']} + {nic['frames_sent']} frames to "
                   f"{pcap} ({time.monotonic() - t0:.1f} s)")
    if shutil.which("tshark") is None:
        results.append("tshark: skipped (not installed; scripts/setup.sh installs it)")
        return False
    t0 = time.monotonic()
    fields = subprocess.run(["tshark", "-r", pcap, "-T", "fields", "-e", "frame.time_epoch"], capture_output=True,
                            text=True, timeout=args.timeout)
    times = [float(x) for x in fields.stdout.split()]
    if fields.returncode != 0 or len(times) != nic["frames_received"] + nic["frames_sent"]:
        raise linux_guest.GuestError(f"tshark read {len(times)} frames of {pcap} (status {fields.returncode}), not "
                                     f"{nic['frames_received'] + nic['frames_sent']}:\n{fields.stderr[-2000:]}")
    start = int(doc["header"]["start_unix_ns"]) / 1e9
    if times != sorted(times) or times[0] < start or times[-1] > start + 3600:
        raise linux_guest.GuestError(f"the pcap's timestamps are not in guest time order from {start}: "
                                     f"{times[:3]} ... {times[-3:]}")
    shown = subprocess.run(["tshark", "-r", pcap, "-d", f"tcp.port=={port},http", "-Y", "http", "-T", "fields",
                            "-e", "http.request.method", "-e", "http.request.uri", "-e", "http.response.code"],
                           capture_output=True, text=True, timeout=args.timeout)
    if shown.returncode != 0 or "GET\t/blob" not in shown.stdout or "200" not in shown.stdout:
        raise linux_guest.GuestError(f"tshark does not see the HTTP exchange in {pcap} (status {shown.returncode}):\n"
                                     f"{shown.stdout[-2000:]}{shown.stderr[-2000:]}")
    conv = subprocess.run(["tshark", "-r", pcap, "-q", "-z", "conv,tcp"], capture_output=True, text=True,
                          timeout=args.timeout)
    stream = [line for line in conv.stdout.splitlines() if f"10.0.2.2:{port}" in line]
    if len(stream) != 1:
        raise linux_guest.GuestError(f"tshark's TCP conversations do not hold the download once:\n{conv.stdout}")
    results.append(f"tshark reads the pcap: {len(times)} frames, GET /blob answered 200, one TCP stream "
                   f"({time.monotonic() - t0:.1f} s)")
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deja", required=True)
    parser.add_argument("--backend", default="interp", choices=["interp", "kvm"])
    parser.add_argument("--guest-dir", required=True, help="the build's guest-linux/ directory")
    parser.add_argument("--qemu", action="store_true", help="also boot under QEMU and compare the output")
    parser.add_argument("--record-replay", action="store_true",
                        help="instead: record a boot running /scripts/devices, replay it, compare")
    parser.add_argument("--record-replay-workload", action="store_true",
                        help="instead: record a boot and a shell session using the disk, the hwrng and an HTTP "
                             "download through slirp, then replay it exactly")
    parser.add_argument("--download-mib", type=int, default=8, help="--record-replay-workload: the download's size")
    parser.add_argument("--disk-hash", default="lazy", choices=["full", "lazy"],
                        help="--record-replay-workload: how the trace identifies the disk image")
    parser.add_argument("--tsc-spin-ms", type=int, default=50,
                        help="--record-replay-workload: guest milliseconds tsc-spin spins on RDTSC, and again on "
                             "clock_gettime")
    parser.add_argument("--digest-every", type=int,
                        help="--record-replay*: `deja record --digest-every` (a state digest every N events)")
    parser.add_argument("--progress", help="--record-replay*: `deja record --progress` (exact, emulated-pmu:SKID)")
    parser.add_argument("--replay", action="append", metavar="VARIANT",
                        help="--record-replay*: replay once more per use, with nothing changed (default) or with "
                             "--KEY VALUE (KEY=VALUE, e.g. interp-mode=threaded, progress=exact); without it, once")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for any one step")
    parser.add_argument("--machine", default="pc", choices=["pc", "pc-apic"], help="--record-replay: the machine")
    parser.add_argument("--keep", help="keep logs and the overlay in this directory")
    parser.add_argument("--artifacts", help="--record-replay-workload: where the HTML page's screenshot is kept")
    parser.add_argument("--record-replay-smp", action="store_true",
                        help="instead: record boots with --cpus vCPUs running /scripts/smp, one per --schedule-seed, "
                             "and replay each exactly")
    parser.add_argument("--cpus", type=int, default=2, help="--record-replay-smp: vCPUs")
    parser.add_argument("--append", action="append", default=[],
                        help="--record-replay-smp: more kernel command line (repeatable)")
    parser.add_argument("--shell", action="store_true",
                        help="--record-replay-smp: type the workload into the guest's shell over serial")
    parser.add_argument("--schedule-seed", type=int, action="append", help="--record-replay-smp: a seed (repeatable)")
    args = parser.parse_args()
    if not os.path.exists(os.path.join(args.guest_dir, "initramfs.cpio")):
        print(f"SKIP: no bundled Linux guest in {args.guest_dir}")
        return 77
    os.environ["DEJA_LINUX_GUEST_DIR"] = args.guest_dir
    kernel_version = open(os.path.join(args.guest_dir, "kernel.path")).read().strip().split("vmlinuz-")[-1]
    features = deja_options(args.deja)
    workdir = args.keep or tempfile.mkdtemp(prefix="deja-linux-")
    os.makedirs(workdir, exist_ok=True)
    server = BlobServer(1 << 20)
    results = []
    t0 = time.monotonic()
    try:
        if args.record_replay_workload:
            checked_pcap = record_replay_workload(args, workdir, results)
            print("\n".join(results))
            if not checked_pcap:
                print(f"SKIP: everything else passed, but without tshark the pcap was not read back ({workdir})")
                return 77
            print(f"PASS in {time.monotonic() - t0:.1f} s (logs in {workdir})")
            return 0
        if args.record_replay_smp:
            record_replay_smp(args, workdir, results)
            print("\n".join(results))
            print(f"PASS in {time.monotonic() - t0:.1f} s (logs in {workdir})")
            return 0
        if args.record_replay:
            record_replay(args, workdir, results)
            print("\n".join(results))
            print(f"PASS in {time.monotonic() - t0:.1f} s (logs in {workdir})")
            return 0
        compared, cmdline = run_deja(args, features, server, kernel_version, workdir, results)
        if args.qemu:
            theirs = run_qemu(args, features, server, kernel_version, cmdline, workdir, results)
            if theirs is not None:
                if [c for c in compared] != [c for c in theirs]:
                    for (name, ours), (_, qemu) in zip(compared, theirs):
                        if ours != qemu:
                            print(f"FAIL: '{name}' differs:\n  deja: {ours!r}\n  qemu: {qemu!r}")
                    return 1
                results.append(f"qemu and deja agree on {len(compared)} outputs")
    except linux_guest.GuestError as e:
        print("\n".join(results))
        print(f"FAIL: {e}\n(logs in {workdir})")
        return 1
    finally:
        server.close()
    print("\n".join(results))
    print(f"PASS in {time.monotonic() - t0:.1f} s (logs in {workdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
