#!/usr/bin/env python3
"""`deja explore` through the deja binary (docs/explore.md): a seed's recording is the same bytes every time (10 of 10,
on the JIT and on the reference executor); a failing run's trace is kept and replays exactly, a passing run leaves
nothing; serial input comes from a file (typed ahead or paced by the seed) or a recording, never the host; the planted race (explore-race) is found by PCT
and its trace replays, and minimizes to the change point it needs, named by its draw; a hang is found; a campaign in shards runs through `deja segment` and `deja merge` on the local
executor; bad options are refused with exit status 2. With --only store_buffering (explore.tso): the SB litmus test
(litmus-sb) sees r1=r2=0 with --tso only, never with MFENCE."""
import argparse
import filecmp
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "guests"))
import checked_run  # noqa: E402

FOUND = 14


def run(cmd, timeout=900):
    return checked_run.run(cmd, timeout)


def show(p):
    return f"exit {p.returncode}\n{p.stdout.decode(errors='replace')}\n{p.stderr.decode(errors='replace')}"


def explore(args, out, *extra, guest="smp-counter", cpus=2):
    argv = [args.deja, "explore", "-o", out, "--json"]
    if cpus > 1:
        argv += ["--machine", "pc-apic", "--cpus", str(cpus)]
    return run(argv + list(extra) + [os.path.join(args.guests, f"{guest}.elf")])


def results(p):
    lines = [json.loads(l) for l in p.stdout.decode().splitlines() if l.strip()]
    return [l for l in lines if "seed" in l], [l for l in lines if l.get("summary")][0]


def check_replay(args, trace, status):
    rep = run([args.deja, "replay", trace])
    if rep.returncode != status or "replay OK" not in rep.stderr.decode(errors="replace"):
        sys.exit(f"FAIL: {trace} did not replay exactly (expected exit {status}):\n{show(rep)}")


def same_bytes(args, tmp):
    # exit:1 is smp-counter's normal end (status 0 -> 1): every run "fails", so its trace is kept to compare.
    for mode in ("jit", "reference"):
        first = None
        for i in range(10):
            out = os.path.join(tmp, f"same-{mode}")
            shutil.rmtree(out, ignore_errors=True)
            p = explore(args, out, "--seed", "7", "--interp-mode", mode, "--until", "exit:1", "--append",
                        "increments=3000")
            if p.returncode != FOUND:
                sys.exit(f"FAIL: explore --seed 7 ({mode}) run {i}:\n{show(p)}")
            trace = os.path.join(out, "seed-7.trace")
            if first is None:
                first = os.path.join(tmp, f"first-{mode}.trace")
                shutil.copy(trace, first)
                check_replay(args, trace, 1)
            elif not filecmp.cmp(first, trace, shallow=False):
                sys.exit(f"FAIL: explore --seed 7 ({mode}) run {i} gave another trace than run 0")
    print("ok: --seed 7 gave the same trace bytes 10 of 10 times, on the JIT and the reference executor")


def kept_only_failures(args, tmp):
    out = os.path.join(tmp, "kept")
    p = explore(args, out, "--seeds", "1..4", "-j", "2", "--until", "exit:3", "--append", "increments=2000")
    if p.returncode != 0:
        sys.exit(f"FAIL: a campaign with nothing found should exit 0:\n{show(p)}")
    seeds, summary = results(p)
    if len(seeds) != 4 or summary["seeds"] != 4 or summary["failures"] != 0 or os.listdir(out):
        sys.exit(f"FAIL: passing runs left files or the summary is wrong: {os.listdir(out)}\n{show(p)}")
    print("ok: passing runs leave nothing; summary", summary["outcomes"])


def race(args, tmp):
    out = os.path.join(tmp, "race")
    p = explore(args, out, "--seeds", "0..299", "-j", "2", "--schedule", "pct:2:200", "--until", "serial:BUG",
                guest="explore-race")
    seeds, summary = results(p)
    if p.returncode != FOUND or not summary["failures"]:
        sys.exit(f"FAIL: PCT did not find the planted race in 300 seeds:\n{show(p)}")
    first = summary["first_failing_seed"]
    trace = os.path.join(out, f"seed-{first}.trace")
    if not os.path.exists(trace):
        sys.exit(f"FAIL: the failing seed's trace {trace} is missing")
    check_replay(args, trace, 12)  # (stopped where the serial predicate matched: a recorded End)
    q = run([args.deja, "query", trace, "--at", "end", "--regs", "--cpu", "1"])
    if q.returncode != 0 or b"rip" not in q.stdout.lower():
        sys.exit(f"FAIL: query of the failing trace:\n{show(q)}")
    ins = run([args.deja, "inspect", trace])
    if ins.returncode != 0 or "pct" not in ins.stdout.decode(errors="replace"):
        sys.exit(f"FAIL: inspect of the failing trace:\n{show(ins)}")
    print(f"ok: PCT found the race at seed {first} ({summary['failures']} of 300), the trace replays")
    mini = os.path.join(tmp, "minimized")
    m = run([args.deja, "explore", "--minimize", trace, "-o", mini, "--symbols",
             os.path.join(args.guests, "explore-race.elf64")])
    text = m.stdout.decode(errors="replace")
    minimized = os.path.join(mini, f"minimized-seed-{first}.trace")
    # (The change point holds either processor between its check and its act: the BSP's claim is in guest_main, the
    # AP's in ap_main.)
    if m.returncode != FOUND or "change-point 0: vCPU" not in text or not ("guest_main" in text or "ap_main" in text) or \
            "1 of 2 perturbations taken away" not in text or not os.path.exists(minimized):
        sys.exit(f"FAIL: minimization of seed {first}:\n{show(m)}")
    check_replay(args, minimized, 12)
    print("ok: minimized to the one change point (timer jitter taken away):",
          [l.strip() for l in text.splitlines() if "change-point" in l][0])
    # With D = 3 a change point is named by its draw, not by the order they fired in: at seed 1355 of pct:3:200 the
    # second drawn fires first (event 100) and is the one the race needs; the first drawn fires later and goes.
    out3 = os.path.join(tmp, "race-pct3")
    p3 = explore(args, out3, "--seed", "1355", "--schedule", "pct:3:200", "--until", "serial:BUG", guest="explore-race")
    seeds3, _ = results(p3)
    if p3.returncode != FOUND:
        sys.exit(f"FAIL: seed 1355 of pct:3:200 should find the race (has the guest changed?):\n{show(p3)}")
    m3 = run([args.deja, "explore", "--minimize", seeds3[0]["trace"], "-o", os.path.join(tmp, "minimized-pct3")])
    text3 = m3.stdout.decode(errors="replace")
    if m3.returncode != FOUND or "change-point 1: vCPU" not in text3 or "change-point 0" in text3 or \
            "2 of 3 perturbations taken away" not in text3:
        sys.exit(f"FAIL: minimization of seed 1355 under pct:3 should keep change point 1 alone:\n{show(m3)}")
    check_replay(args, os.path.join(tmp, "minimized-pct3", "minimized-seed-1355.trace"), 12)
    print("ok: under pct:3 the change point kept is named by its draw:",
          [l.strip() for l in text3.splitlines() if "change-point" in l][0])
    # Locked instructions are PCT's scheduling events: smp-counter's 2 x 1000 LOCK XADDs, which random does not count.
    counts = {}
    for schedule in ("pct:2", "random"):
        p = explore(args, os.path.join(tmp, f"locks-{schedule}"), "--seed", "1", "--schedule", schedule, "--until",
                    "exit:3", "--append", "increments=1000")
        seeds, summary = results(p)
        counts[schedule] = seeds[0]["schedule_events"] if p.returncode == 0 and seeds else None
    if counts["pct:2"] is None or counts["random"] is None or counts["pct:2"] < counts["random"] + 2000:
        sys.exit(f"FAIL: PCT should count smp-counter's 2,000 locked instructions among its events: {counts}")
    print(f"ok: locked instructions are PCT's scheduling events ({counts['pct:2']} events against random's "
          f"{counts['random']})")
    none = explore(args, os.path.join(tmp, "race-none"), "--seeds", "0..19", "-j", "2", "--schedule", "none",
                   "--timer-jitter", "0", "--until", "serial:BUG", guest="explore-race")
    if none.returncode != 0:
        sys.exit(f"FAIL: the default schedule should not find the race:\n{show(none)}")


def hang(args, tmp):
    p = explore(args, os.path.join(tmp, "hang"), "--seeds", "1..2", "--until", "hang:2M", guest="hostile/jmp-self",
                cpus=1)
    seeds, summary = results(p)
    if p.returncode != FOUND or summary["failures"] != 2 or not all(s["outcome"] == "fail: hang:2M" for s in seeds):
        sys.exit(f"FAIL: jmp-self should be a hang:\n{show(p)}")
    check_replay(args, seeds[0]["trace"], 4)
    print("ok: a guest spinning without output is a hang, and its trace replays")


def shards(args, tmp):
    work = os.path.join(tmp, "work")
    out = os.path.join(tmp, "sharded")
    image = os.path.join(args.guests, "explore-race.elf")
    p = run([args.deja, "explore", "--machine", "pc-apic", "--cpus", "2", "--seeds", "0..99", "--schedule", "pct:2:200",
             "--until", "serial:BUG", "-o", out, "--shards", "4", "--workdir", work, "-j", "2", image])
    text = p.stdout.decode(errors="replace")
    if p.returncode not in (0, FOUND) or "100 seeds" not in text:
        sys.exit(f"FAIL: a campaign in 4 shards on the local executor:\n{show(p)}")
    again = run([args.deja, "merge", os.path.join(work, "manifest.json")])
    if again.returncode != p.returncode or "100 seeds" not in again.stdout.decode(errors="replace"):
        sys.exit(f"FAIL: deja merge of the shards:\n{show(again)}")
    direct = explore(args, os.path.join(tmp, "direct"), "--seeds", "0..99", "-j", "2", "--schedule", "pct:2:200",
                     "--until", "serial:BUG", guest="explore-race")
    _, summary = results(direct)
    if f"{summary['failures']} failing" not in text:
        sys.exit(f"FAIL: the shards found other failures than one campaign:\n{text}\n{show(direct)}")
    print(f"ok: 4 shards through deja segment/merge (local executor) = one campaign ({summary['failures']} failing)")


def linux_disk_eio(args, tmp):
    """The bundled Linux guest reads its disk under injected I/O errors: the kernel logs them and the run replays."""
    disk = os.path.join(args.linux, "disk.img")

    def campaign(out, seeds):
        return run([args.deja, "explore", "--linux", "--append", "deja.script=disk-read", "--disk", disk, "--faults",
                    "disk-eio:5%", "--seeds", seeds, "--until", "serial:I/O error, dev vda", "-o", out, "--json"])

    out = os.path.join(tmp, "linux")
    p = campaign(out, "1..4")
    seeds, summary = results(p)
    failing = [s for s in seeds if s["failed"]]
    if p.returncode != FOUND or not failing or failing[0]["faults"] < 1:
        sys.exit(f"FAIL: an injected disk I/O error should reach the Linux guest in 4 seeds:\n{show(p)}")
    first = failing[0]
    check_replay(args, first["trace"], 12)
    again = campaign(out + "-again", str(first["seed"]))
    if again.returncode != FOUND or not filecmp.cmp(first["trace"], os.path.join(out + "-again", f"seed-{first['seed']}.trace"),
                                                    shallow=False):
        sys.exit(f"FAIL: the Linux run with faults gave another trace the second time:\n{show(again)}")
    print(f"ok: seed {first['seed']}: {first['faults']} injected disk errors seen by Linux (I/O error, dev vda), "
          f"replayed exactly, the same bytes twice; {summary['failures']} of 4 seeds")


def linux_network(args, tmp):
    """A seeded run's network (--net user, restricted: libslirp's own services): the bundled Linux guest pings the
    gateway, fetches a file from its TFTP server and sends 108,894 bytes through a TCP echo service (script
    net-faults). Without faults every ping comes back and the file and the echo are whole; dropped, duplicated and
    reordered frames (--faults net-*) reach the guest as lost pings and duplicates, never as a corrupt file, and TCP
    still brings the echo back whole; the run replays exactly, gives the same bytes twice, and minimizes to the one
    lost frame it needs. Bad network options are refused in refusals()."""
    import hashlib
    import random
    import re
    served = os.path.join(tmp, "tftp")
    os.makedirs(served)
    blob = random.Random(24).randbytes(16384)
    with open(os.path.join(served, "blob"), "wb") as f:
        f.write(blob)
    whole = f"net-faults: tftp 16384 bytes md5 {hashlib.md5(blob).hexdigest()}"

    def campaign(out, seeds, until, *faults):
        return run([args.deja, "explore", "--linux", "--append", "deja.script=net-faults", "--net",
                    f"user,tftp={served},guestfwd=tcp:10.0.2.4:7-echo", *faults, "--seeds", seeds, "-j", "2", "--until", until, "-o", out, "--json"])

    def serial(out, seed):
        with open(os.path.join(out, f"seed-{seed}.serial"), errors="replace") as f:
            return f.read()

    out = os.path.join(tmp, "net-clean")
    p = campaign(out, "1", "serial:net-faults: done")
    text = serial(out, 1) if p.returncode == FOUND else ""
    echoed = "net-faults: tcp echo 108894 bytes whole"
    if p.returncode != FOUND or " 0% packet loss" not in text or whole not in text or echoed not in text:
        sys.exit(f"FAIL: without faults every ping should come back, the file and the TCP echo be whole:\n{show(p)}\n"
                 f"{text[-2000:]}")
    check_replay(args, os.path.join(out, "seed-1.trace"), 12)
    shown = run([args.deja, "inspect", os.path.join(out, "seed-1.trace")]).stdout.decode(errors="replace")
    if f"tftp {served}" not in shown or "net          user" not in shown:
        sys.exit(f"FAIL: inspect should name the TFTP directory among the inputs and the network:\n{shown}")

    # (libslirp 4.7's TFTP server ignores the block number of an ACK: a DATA block lost on the way to the guest is
    # never sent again, and the transfer times out. Never a corrupt file.)
    out = os.path.join(tmp, "net-all")
    p = campaign(out, "1..2", "serial:net-faults: done", "--faults", "net-drop:5%,net-dup:10%,net-reorder:10%")
    seeds, _ = results(p)
    texts = [serial(out, s["seed"]) for s in seeds if s["failed"]]
    if len(texts) != 2 or not any(re.search(r"ping duplicates [1-9]", t) for t in texts):
        sys.exit(f"FAIL: duplicated frames should reach the guest (ping's DUP!):\n{show(p)}")
    timeouts = sum("tftp: timeout" in t for t in texts)
    if any(whole not in t and "tftp: timeout" not in t for t in texts):
        sys.exit(f"FAIL: the TFTP transfer should finish whole or time out:\n{show(p)}")
    if any(echoed not in t for t in texts):
        sys.exit(f"FAIL: TCP should bring the echo back whole through lost, duplicated and reordered frames:\n{show(p)}")

    out = os.path.join(tmp, "net-drop")
    lost = r"[1-9][0-9]*% packet loss"
    p = campaign(out, "1..4", f"serial:{lost}", "--faults", "net-drop:5%")
    seeds, summary = results(p)
    failing = [s for s in seeds if s["failed"]]
    if p.returncode != FOUND or not failing:
        sys.exit(f"FAIL: dropped frames should show as lost pings in 4 seeds:\n{show(p)}")
    first = failing[0]
    check_replay(args, first["trace"], 12)
    again = campaign(out + "-again", str(first["seed"]), f"serial:{lost}", "--faults", "net-drop:5%")
    if again.returncode != FOUND or not filecmp.cmp(first["trace"], os.path.join(out + "-again", f"seed-{first['seed']}.trace"),
                                                    shallow=False):
        sys.exit(f"FAIL: the run with network faults gave another trace the second time:\n{show(again)}")
    small = run([args.deja, "explore", "--minimize", first["trace"], "-o", os.path.join(tmp, "net-small")])
    critical = [l for l in small.stdout.decode(errors="replace").splitlines() if l.startswith("  net-fault")]
    # (One lost frame loses a ping: the ping itself, its answer, or an ARP answer, which delays the first.)
    if small.returncode != FOUND or len(critical) != 1 or " dropped (" not in critical[0]:
        sys.exit(f"FAIL: minimization should keep one dropped frame:\n{show(small)}")
    # Two vCPUs under PCT with the network: the same bytes twice, and the trace replays.
    smp = []
    for attempt in range(2):
        out = os.path.join(tmp, f"net-smp-{attempt}")
        p = run([args.deja, "explore", "--machine", "pc-apic", "--cpus", "2", "--linux", "--append",
                 "deja.script=net-faults", "--net", f"user,tftp={served},guestfwd=tcp:10.0.2.4:7-echo", "--faults",
                 "net-drop:3%,net-dup:3%", "--seed", "3", "--until", "serial:net-faults: done", "-o", out, "--json"])
        if p.returncode != FOUND or echoed not in serial(out, 3):
            sys.exit(f"FAIL: 2 vCPUs with a network should run the script to its end:\n{show(p)}")
        smp.append(os.path.join(out, "seed-3.trace"))
    if not filecmp.cmp(*smp, shallow=False):
        sys.exit("FAIL: 2 vCPUs with a network gave another trace the second time")
    check_replay(args, smp[0], 12)
    print(f"ok: network: a clean run whole and replayed; with all three faults duplicates seen, the TCP echo whole, "
          f"TFTP whole or timed out ({timeouts} of 2 timed out); {summary['failures']} of 4 seeds lose pings to net-drop (seed {first['seed']}: "
          f"{first['faults']} faults, replayed exactly, the same bytes twice, minimized to {critical[0].strip()}); 2 vCPUs under "
          f"PCT with the network: the same bytes twice, replayed")


def serial_input(args, tmp):
    """Serial input without a host: a file typed ahead (--serial-in) or a recording's input at its guest times
    (--inputs-from); either way the run is a function of its seed and replays."""
    text = os.path.join(args.sources, "serial-echo.input")
    recorded = os.path.join(tmp, "echo.trace")
    p = run([args.deja, "record", "--backend", "interp", "--serial-in", text, "-o", recorded,
             os.path.join(args.guests, "serial-echo.elf")])
    if p.returncode != 1:
        sys.exit(f"FAIL: recording serial-echo:\n{show(p)}")
    echoed = "fnv1a32=5cb4ef46"  # (serial-echo.expected: the input's hash, as the guest computed it)
    for how in (["--serial-in", text], ["--inputs-from", recorded]):
        traces = []
        for i in range(2):
            out = os.path.join(tmp, f"input-{how[0][2:]}-{i}")
            p = explore(args, out, "--seed", "5", *how, "--until", f"serial:{echoed}", guest="serial-echo", cpus=1)
            if p.returncode != FOUND:
                sys.exit(f"FAIL: explore {how} should see the guest echo its input:\n{show(p)}")
            traces.append(os.path.join(out, "seed-5.trace"))
        if not filecmp.cmp(*traces, shallow=False):
            sys.exit(f"FAIL: explore {how} --seed 5 gave two different traces")
        check_replay(args, traces[0], 12)
    # Typed at gaps drawn from the seed: each seed its own timing (another trace), the same seed the same bytes.
    paced = {}
    for seed, attempt in ((1, 0), (2, 0), (1, 1)):
        out = os.path.join(tmp, f"paced-{seed}-{attempt}")
        p = explore(args, out, "--seed", str(seed), "--serial-in", text, "--serial-pace", "1ms..2ms", "--until",
                    f"serial:{echoed}", guest="serial-echo", cpus=1)
        if p.returncode != FOUND:
            sys.exit(f"FAIL: explore --serial-pace (seed {seed}) should see the guest echo its input:\n{show(p)}")
        paced[(seed, attempt)] = os.path.join(out, f"seed-{seed}.trace")
    if filecmp.cmp(paced[(1, 0)], paced[(2, 0)], shallow=False) or not filecmp.cmp(paced[(1, 0)], paced[(1, 1)], shallow=False):
        sys.exit("FAIL: --serial-pace should time the input by the seed: seeds 1 and 2 alike, or seed 1 twice unlike")
    check_replay(args, paced[(2, 0)], 12)
    print("ok: serial input from a file (typed ahead or paced by the seed) and from a recording reach the guest, the "
          "same bytes twice, and replay")


def linux_inputs_from(args, tmp):
    """A Linux shell session recorded interactively (each command typed once the prompt came back) is explored with
    --inputs-from: every command arrives at its recorded guest time, so the seeded run does what the recording did."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "linux"))
    import linux_guest
    recorded = os.path.join(tmp, "session.trace")
    session = linux_guest.Session([args.deja, "record", "--backend", "interp", "--linux", "-o", recorded,
                                   "--serial-in", "-"])
    session.boot()
    if session.run("echo typed-$((6 * 7))")[1] != "typed-42\n":
        sys.exit("FAIL: the recorded shell session did not run its command")
    session.finish(7)
    out = os.path.join(tmp, "linux-inputs")
    p = run([args.deja, "explore", "--linux", "--inputs-from", recorded, "--seed", "3", "--until", "exit:!0", "-o", out,
             "--json"])
    seeds, _ = results(p)
    serial = open(os.path.join(out, "seed-3.serial"), "rb").read() if seeds else b""
    if p.returncode != FOUND or seeds[0]["reason"] != "guest exit" or b"\ntyped-42" not in serial:
        sys.exit(f"FAIL: the explored run should type the recorded commands and end with deja-exit 7:\n{show(p)}")
    check_replay(args, seeds[0]["trace"], seeds[0]["status"])
    print("ok: a recorded Linux shell session typed again by deja explore --inputs-from: same commands, same end, "
          "replayed exactly")


def linux_pct(args, tmp):
    """PCT boots the bundled Linux guest on 2 vCPUs to /init's marker, as random and none do. (It did not: the AP
    calibrates its delay loop reading the TSC until jiffies move, without a PAUSE, and only the BSP's tick moves them;
    a higher-priority AP never yielded and starved the BSP.) The run replays exactly."""
    out = os.path.join(tmp, "linux-pct")
    p = run([args.deja, "explore", "--linux", "--machine", "pc-apic", "--cpus", "2", "--schedule", "pct",
             "--append", "deja.script=ready", "--seeds", "1..2", "--until", "serial:deja-linux: ready",
             "--max-instructions", "4000000000", "-o", out, "--json"])
    seeds, summary = results(p)
    if p.returncode != FOUND or summary["failures"] != 2:
        sys.exit(f"FAIL: PCT should boot Linux on 2 vCPUs to the marker with seeds 1 and 2:\n{show(p)}")
    check_replay(args, seeds[0]["trace"], 12)
    print(f"ok: PCT boots Linux on 2 vCPUs to the marker ({', '.join(str(round(s['seconds'], 1)) for s in seeds)} s), "
          f"seed {seeds[0]['seed']} replayed exactly")


def store_buffering(args, tmp):
    # The SB litmus test (guest-tests/litmus-sb.c): r1=r2=0 needs x86-TSO's store buffers (--tso).
    seen = ["--until", "serial:r1=r2=0 seen", "--schedule", "random"]
    out = os.path.join(tmp, "sb")
    p = explore(args, out, "--seeds", "0..9", "-j", "2", "--tso", *seen, guest="litmus-sb")
    seeds, summary = results(p)
    if p.returncode != FOUND or not summary["failures"]:
        sys.exit(f"FAIL: --tso should let some seed of 0..9 see r1=r2=0:\n{show(p)}")
    first = summary["first_failing_seed"]
    trace = os.path.join(out, f"seed-{first}.trace")
    check_replay(args, trace, 12)  # (stopped where the serial predicate matched)
    v = run([args.deja, "debug", trace, "--verify-checkpoints", "--checkpoint-interval", "50000"])
    if v.returncode != 0 or "0 mismatches" not in v.stderr.decode(errors="replace"):
        sys.exit(f"FAIL: checkpoints of a --tso trace (store buffers in their state):\n{show(v)}")
    ins = run([args.deja, "inspect", trace])
    if ins.returncode != 0 or "x86-TSO store buffers" not in ins.stdout.decode(errors="replace"):
        sys.exit(f"FAIL: inspect should name the store buffers:\n{show(ins)}")
    again = os.path.join(tmp, "sb-again")
    p = explore(args, again, "--seed", str(first), "--tso", *seen, guest="litmus-sb")
    if p.returncode != FOUND or not filecmp.cmp(trace, os.path.join(again, f"seed-{first}.trace"), shallow=False):
        sys.exit(f"FAIL: --tso --seed {first} again gave another trace:\n{show(p)}")
    print(f"ok: --tso: {summary['failures']} of 10 seeds saw r1=r2=0 (first {first}); its trace replays, and the "
          "seed gives the same bytes again")
    # (Not pct:2: a PCT vCPU spins its 64 PAUSEs before it yields, long enough for its stores to drain.)
    for schedule in ("none",):
        p = explore(args, os.path.join(tmp, f"sb-{schedule}"), "--seeds", "0..9", "-j", "2", "--tso", "--until",
                    "serial:r1=r2=0 seen", "--schedule", schedule, guest="litmus-sb")
        seeds, summary = results(p)
        if p.returncode != FOUND or not summary["failures"]:
            sys.exit(f"FAIL: --tso --schedule {schedule}: some seed of 0..9 should see r1=r2=0:\n{show(p)}")
    for name, extra in (("without --tso", []), ("with MFENCE", ["--tso", "--append", "fence=1"])):
        for schedule in ("random", "pct:2", "none"):
            p = explore(args, os.path.join(tmp, "sb-never"), "--seeds", "0..9", "-j", "2", *extra, "--until",
                        "serial:r1=r2=0 seen", "--schedule", schedule, guest="litmus-sb")
            seeds, summary = results(p)
            if p.returncode != 0 or summary["failures"] or summary["errors"]:
                sys.exit(f"FAIL: {name} ({schedule}) no seed may see r1=r2=0:\n{show(p)}")
        print(f"ok: {name}: no seed of 0..9 saw r1=r2=0 under random, pct:2 and none")


def refusals(args, tmp):
    image = os.path.join(args.guests, "smp-counter.elf")
    for extra in (["--seeds", "5..1", "--until", "hang"], ["--seed", "1"], ["--seed", "1", "--until", "bogus:1"],
                  ["--seed", "1", "--until", "serial:("], ["--seed", "1", "--until", "hang", "--backend", "kvm"],
                  ["--seed", "1", "--until", "hang", "--schedule", "pct:0"],
                  ["--seed", "1", "--until", "hang", "--schedule", "pct:2:x"], ["--seed", "1", "--until", "hang", "--faults", "disk-eio:2%"],
                  ["--seed", "1", "--until", "hang", "--serial-in", "-"], ["--seed", "1", "--until", "hang", "--serial-in", "/dev/zero"],
                  ["--seed", "1", "--until", "hang", "--inputs-from", image],
                  ["--seed", "1", "--until", "hang", "--inputs-from", image, "--serial-in", image],
                  ["--seed", "1", "--until", "hang", "--tso", "--interp-mode", "jit"],
                  ["--seed", "1", "--until", "hang", "--faults", "net-drop:2%"],
                  ["--seed", "1", "--until", "hang", "--serial-pace", "1ms"],
                  ["--seed", "1", "--until", "hang", "--serial-in", image, "--serial-pace", "2ms..1ms"],
                  ["--seed", "1", "--until", "hang", "--net", "user,hostfwd=tcp::2222-:22"],
                  ["--seed", "1", "--until", "hang", "--net", "user", "--faults", "net-drop:60%,net-dup:50%"]):
        p = run([args.deja, "explore", "-o", os.path.join(tmp, "bad"), *extra, image])
        if p.returncode != 2 or b"deja:" not in p.stderr:
            sys.exit(f"FAIL: {extra} should be refused with status 2:\n{show(p)}")
    p = run([args.deja, "explore", "-o", os.path.join(tmp, "bad"), "--seeds", "1..100", "--until", "hang",
             os.path.join(tmp, "nonexistent.elf")])
    if p.returncode != 2 or b"cannot read it" not in p.stderr:
        sys.exit(f"FAIL: a missing image should be refused once, before any run:\n{show(p)}")
    print("ok: bad options refused")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deja", required=True)
    ap.add_argument("--guests", required=True, help="the build's guest-tests/ directory")
    ap.add_argument("--sources", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "guest-tests"),
                    help="the source tree's guest-tests/ directory (serial-echo.input)")
    ap.add_argument("--only", help="run only this part")
    ap.add_argument("--linux", help="the build's guest-linux/ directory: also the Linux tests (disk faults, a recorded "
                    "session typed again, PCT boot, the network)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for part in (refusals, kept_only_failures, serial_input, same_bytes, race, hang, shards, linux_disk_eio,
                     linux_inputs_from, linux_pct, linux_network, store_buffering):
            if args.only and part.__name__ != args.only:
                continue
            if part is store_buffering and not args.only:
                continue  # (a test of its own: explore.tso)
            if part in (linux_disk_eio, linux_inputs_from, linux_pct, linux_network) and not args.linux:
                continue
            part(args, tmp)
    print("PASS")


if __name__ == "__main__":
    main()
