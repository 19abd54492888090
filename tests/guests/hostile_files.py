#!/usr/bin/env python3
"""Hostile uses of deja's files (issue 21): outputs onto inputs, a .partial replaced mid-recording, overlays over
another image, non-raw disk images, trace strings that would forge lines, checkpoint files over the memory budget.

Each case runs the deja binary through hostile.py's harness (memory budget, hang and crash detection) and checks that
a refusal is exit status 2 and leaves every file as it was."""
import hashlib
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402
import memory_budget  # noqa: E402
from hostile import deja, expect, fail, path  # noqa: E402

CASES = {}


def case(fn):
    CASES[fn.__name__.replace("_", "-")] = fn
    return fn


def guest(name):
    return os.path.join(hostile.GUESTS, name)


def digest(p):
    with open(p, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def refused(args, words, files, what):
    """deja ARGS must exit 2 naming WORDS and leave FILES (paths) byte for byte as they were."""
    before = {f: digest(f) for f in files}
    r = deja(*args)
    expect(r, 2, words, what)
    for f, d in before.items():
        if digest(f) != d:
            fail(f"{what}: {f} was changed by a refused command\n{r.err}")
    return r


def private_guest(name="image.elf"):
    """A copy of hello.elf in the case's directory, so that nothing of the build is ever at risk."""
    image = path(name)
    shutil.copyfile(guest("hello.elf"), image)
    return image


def recorded(name, image):
    trace = path(name)
    expect(deja("record", "-o", trace, "--backend", "interp", image), 1, [], f"recording {image}")
    return trace


@case
def serial_out_never_overwrites_an_input():
    """replay/debug/run/record --serial-out onto the trace, the image, an overlay, through a link: exit 2, untouched."""
    image = private_guest()
    trace = recorded("t.trace", image)
    os.symlink(trace, path("trace-link"))
    os.link(trace, path("trace-hard"))
    os.symlink(image, path("image-link"))
    kept = [trace, image]
    for cmd in (["replay", trace], ["debug", trace, "--gdb", "127.0.0.1:0"]):
        for out in (trace, path("trace-link"), path("trace-hard")):
            refused([*cmd, "--serial-out", out], ["is also the trace"], kept, f"{cmd[0]} --serial-out {out}")
        refused([*cmd, "--serial-out", image], ["is also the guest image"], kept, f"{cmd[0]} --serial-out IMAGE")
    refused(["debug", trace, "--serial-out", trace + ".0.ckpt"], ["is also a checkpoint file"], kept,
            "debug --serial-out TRACE.0.ckpt")
    for cmd in (["run", "--backend", "interp"], ["record", "-o", path("new.trace"), "--backend", "interp"]):
        for out in (image, path("image-link")):
            refused([*cmd, "--serial-out", out, image], ["is also the guest image"], kept, f"{cmd[0]} --serial-out IMAGE")
    refused(["record", "-o", path("new.trace"), "--backend", "interp", "--serial-out", path("new.trace"), image],
            ["is also the serial output"], kept, "record -o T --serial-out T")
    refused(["record", "-o", trace, "--backend", "interp", "--serial-out", path("trace-hard"), image],
            ["is also the serial output"], kept, "record -o T --serial-out (a hard link to T)")
    refused(["record", "-o", path("new.trace"), "--backend", "interp", "--serial-out", path("new.trace.partial"), image],
            ["is also the serial output"], kept, "record -o T --serial-out T.partial")
    # An overlay holding the guest's writes.
    disk, overlay = path("disk.img"), path("disk.ovl")
    with open(disk, "wb") as f:
        f.write(os.urandom(1 << 20))
    expect(deja("run", "--backend", "interp", image, "--disk", f"{disk},overlay={overlay}"), 1, [], "run with an overlay")
    refused(["run", "--backend", "interp", "--serial-out", overlay, image, "--disk", f"{disk},overlay={overlay}"],
            ["the serial output", "is also a disk overlay"], kept + [overlay, disk], "run --serial-out OVERLAY")
    for p in (path("new.trace"), path("new.trace.partial")):
        if os.path.exists(p):
            fail(f"a refused command left {p}")
    print("serial-out onto the trace, the image, an overlay, a checkpoint name, through links: refused, untouched")


@case
def pcap_never_overwrites_the_trace():
    """inspect T --pcap T (or a link to T): exit 2, the trace untouched."""
    trace = recorded("p.trace", private_guest())
    os.symlink(trace, path("p-link"))
    os.link(trace, path("p-hard"))
    for out in (trace, path("p-link"), path("p-hard")):
        refused(["inspect", trace, "--pcap", out], ["is also the trace"], [trace], f"inspect --pcap {out}")
    expect(deja("inspect", trace, "--pcap", path("p.pcap")), 0, [], "inspect --pcap FILE")
    print("inspect --pcap onto the trace refused; to a new file written")


@case
def evidence_files_follow_the_rule():
    """Signatures, time-stamp requests, custody logs and keys (docs/audit.md) follow the same rule: none is the
    trace, the key or another output (exit 2, every file untouched); a key is never replaced."""
    image = private_guest()
    key = path("k")
    expect(deja("keygen", "-o", key), 0, [], "keygen")
    trace = recorded("s.trace", image)
    os.link(trace, path("s-hard"))
    os.symlink(key, path("k-link"))
    kept = [trace, key, key + ".pub", image]
    refused(["keygen", "-o", key], ["exists already"], kept, "keygen over an existing key")
    refused(["sign", trace, "--key", key, "--tsa-request", path("s-hard")], ["is also the trace"], kept,
            "sign --tsa-request (a hard link to the trace)")
    refused(["sign", trace, "--key", key, "--tsa-request", trace + ".sig"], ["is also the signature"], kept,
            "sign --tsa-request TRACE.sig")
    os.symlink(key, trace + ".sig")
    refused(["sign", trace, "--key", trace + ".sig"], ["is also the key"], kept, "sign --key TRACE.sig (a link to it)")
    os.unlink(trace + ".sig")
    os.symlink(key, trace + ".custody")
    refused(["custody", "add", trace, "--action", "a", "--by", "b", "--key", key], ["is also the key"], kept,
            "custody add whose log is a link to the key")
    os.unlink(trace + ".custody")
    refused(["record", "-o", path("r.trace"), "--backend", "interp", "--sign", key, "--serial-out",
             path("r.trace.sig"), image], ["is also the serial output"], kept, "record --sign --serial-out TRACE.sig")
    refused(["record", "-o", path("r.trace"), "--backend", "interp", "--sign", key, "--tsa-request", path("k-link"),
             image], ["is also the signing key"], kept, "record --sign KEY --tsa-request (a link to KEY)")
    for p in (path("r.trace"), path("r.trace.partial"), path("r.trace.sig")):
        if os.path.exists(p):
            fail(f"a refused command left {p}")
    expect(deja("sign", trace, "--key", key, "--tsa-request", path("s.tsq")), 0, [], "sign")
    expect(deja("custody", "add", trace, "--action", "a", "--by", "b", "--key", key), 0, [], "custody add")
    print("signatures, time-stamp requests, custody logs and keys onto inputs or each other: refused, untouched")


@case
def consoles_that_are_streams():
    """--serial-out to /dev/null, /dev/stdout and a link to a device is written; a block device, a directory, a
    symbolic link to a file are refused."""
    image = private_guest()
    expect(deja("run", "--backend", "interp", "--serial-out", "/dev/null", image), 1, [], "--serial-out /dev/null")
    r = deja("run", "--backend", "interp", "--serial-out", "/dev/stdout", image)
    expect(r, 1, [], "--serial-out /dev/stdout")
    if b"Hello" not in r.stdout:
        fail(f"--serial-out /dev/stdout did not reach standard output: {r.stdout[:200]}")
    os.symlink("/dev/null", path("null-link"))
    expect(deja("run", "--backend", "interp", "--serial-out", path("null-link"), image), 1, [], "a link to /dev/null")
    # A block device node of a local-use major number: nothing behind it, and never opened.
    os.mknod(path("blk"), stat.S_IFBLK | 0o600, os.makedev(240, 99))
    refused(["run", "--backend", "interp", "--serial-out", path("blk"), image], ["block device"], [image],
            "--serial-out BLOCK-DEVICE")
    os.mkdir(path("dir"))
    refused(["run", "--backend", "interp", "--serial-out", path("dir"), image], ["directory"], [image],
            "--serial-out DIRECTORY")
    with open(path("someone"), "w") as f:
        f.write("someone's file\n")
    os.symlink(path("someone"), path("someone-link"))
    refused(["run", "--backend", "interp", "--serial-out", path("someone-link"), image], ["symbolic link"],
            [path("someone")], "--serial-out SYMLINK-TO-FILE")
    print("consoles: /dev/null, /dev/stdout, a link to a device written; block device, directory, link refused")


def record_while(trace, action, after=1.5):
    """Records pit-hlt to TRACE, does ACTION after a while, interrupts the recording; returns the result."""
    timer = threading.Timer(after, action)
    timer.start()
    r = deja("record", "-o", trace, "--backend", "interp", hostile.hostile("pit-hlt"), interrupt_after=after + 1)
    timer.join()
    return r


@case
def replaced_partial_is_detected():
    """TRACE.partial replaced, removed, or its directory removed mid-recording: said so, never renamed to TRACE."""
    trace = path("r.trace")
    with open(path("foreign"), "w") as f:
        f.write("someone else's file\n")
    r = record_while(trace, lambda: os.replace(path("foreign"), trace + ".partial"))
    expect(r, 10, ["r.trace.partial was replaced by another file"], "a .partial replaced mid-recording")
    if os.path.exists(trace) or open(trace + ".partial").read() != "someone else's file\n":
        fail(f"the foreign file was renamed or changed:\n{r.err}")
    if "a valid prefix" in r.err:
        fail(f"deja offered the foreign file as its recording:\n{r.err}")
    os.remove(trace + ".partial")
    r = record_while(trace, lambda: os.remove(trace + ".partial"))
    expect(r, 10, ["r.trace.partial was removed"], "a .partial removed mid-recording")
    os.mkdir(path("sub"))
    inner = os.path.join(path("sub"), "r.trace")
    r = record_while(inner, lambda: shutil.rmtree(path("sub")))
    expect(r, 10, [f"the directory {path('sub')} was removed"], "the directory removed mid-recording")
    if "valid prefix" in r.err:
        fail(f"deja named a .partial that no longer exists:\n{r.err}")
    print("a replaced or removed .partial, and a removed directory, are reported; nothing foreign is renamed")


@case
def overlay_over_another_image():
    """An overlay made over one image is refused over another image of the same size, naming both."""
    image = private_guest()
    a, b, overlay = path("a.img"), path("b.img"), path("a.ovl")
    with open(a, "wb") as f:
        f.write(os.urandom(1 << 20))
    with open(b, "wb") as f:
        f.write(os.urandom(1 << 20))
    expect(deja("run", "--backend", "interp", image, "--disk", f"{a},overlay={overlay}"), 1, [], "the first run")
    r = refused(["run", "--backend", "interp", image, "--disk", f"{b},overlay={overlay}"],
                ["was made over the disk image", a, b], [overlay, a, b], "an overlay over another image")
    shutil.copyfile(a, path("a-copy.img"))
    expect(deja("run", "--backend", "interp", image, "--disk", f"{path('a-copy.img')},overlay={overlay}"), 1, [],
           "an overlay over a copy of its image")
    print("overlay over another image refused:", r.err.strip()[:200])


@case
def non_raw_disk_images():
    """qcow2, VMDK, VDI, VHD, VHDX and QED images are refused with the qemu-img command that converts them."""
    image = private_guest()
    headers = {"qcow2": b"QFI\xfb\x00\x00\x00\x03", "VMDK": b"KDMV", "VHDX": b"vhdxfile", "QED": b"QED\x00",
               "VHD": b"conectix"}
    for name, magic in headers.items():
        f = path(f"disk.{name}")
        with open(f, "wb") as out:
            out.write(magic + bytes((1 << 20) - len(magic)))
        refused(["run", "--backend", "interp", image, "--disk", f], [name, "qemu-img convert", "-O raw"], [f],
                f"--disk on a {name} image")
    vdi = bytearray(1 << 20)
    vdi[0x40:0x44] = b"\x7f\x10\xda\xbe"
    with open(path("disk.vdi"), "wb") as out:
        out.write(vdi)
    refused(["run", "--backend", "interp", image, "--disk", path("disk.vdi")], ["VDI", "qemu-img convert -f vdi"],
            [path("disk.vdi")], "--disk on a VDI image")
    made = ""
    if shutil.which("qemu-img"):
        for fmt in ("qcow2", "vmdk", "vdi", "vpc", "vhdx", "qed"):
            f = path(f"real.{fmt}")
            subprocess.run(["qemu-img", "create", "-q", "-f", fmt, f, "1M"], check=True)
            refused(["run", "--backend", "interp", image, "--disk", f], [f"-f {fmt} -O raw"], [f],
                    f"--disk on a {fmt} image made by qemu-img")
        made = "; and those qemu-img makes"
    print("non-raw images refused with the command to convert them" + made)


@case
def query_phys_outside_ram():
    """query --mem ADDR:LEN --phys outside RAM is a bad argument (2), not a guest that stopped (4)."""
    trace = recorded("q.trace", private_guest())
    r = deja("query", trace, "--at", "end", "--mem", "0x100000000:16", "--phys")
    expect(r, 2, ["outside RAM"], "query --phys outside RAM")
    r = deja("query", trace, "--at", "end", "--mem", "0x1000:16", "--phys")
    expect(r, 0, [], "query --phys inside RAM")
    print("query --phys outside RAM: exit 2")


@case
def trace_strings_are_escaped():
    """An image name holding ESC and a newline is printed escaped by inspect, verify and replay; JSON stays JSON."""
    evil = path("evil\x1b[31m\nforged: replay OK.elf")
    shutil.copyfile(guest("hello.elf"), evil)
    trace = path("e.trace")
    expect(deja("record", "-o", trace, "--backend", "interp", evil), 1, [], "record an image with an odd name")
    for cmd in (["inspect", trace], ["inspect", "--serial", trace], ["verify", trace]):
        r = deja(*cmd)
        out = r.stdout.decode(errors="replace") + r.err
        if "\x1b" in out or re.search(r"^forged", out, re.M):
            fail(f"deja {cmd[0]} printed the trace's control characters raw:\n{out}")
        if cmd[-2:] == ["inspect", trace] and "evil\\x1b[31m\\nforged" not in out:
            fail(f"inspect does not show the name escaped:\n{out}")
    import json
    doc = json.loads(deja("inspect", "--json", trace).stdout)
    if [i["path"] for i in doc["inputs"]] != [evil]:
        fail(f"inspect --json does not give the name back exactly: {doc['inputs']}")
    os.remove(evil)
    r = deja("replay", trace)
    expect(r, 2, ["evil\\x1b[31m\\nforged"], "replay of a trace whose image is gone")
    if "\x1b" in r.err or re.search(r"^forged", r.err, re.M):
        fail(f"replay printed the trace's control characters raw:\n{r.err}")
    print("trace strings escaped in inspect, verify and replay; JSON keeps them exactly")


def debug_and_detach(trace, extra, guest_ram):
    """`deja debug TRACE EXTRA`, continued to the end and detached by a minimal gdb client; returns (status, log,
    peak RSS in bytes)."""
    p = subprocess.Popen([hostile.DEJA, "debug", trace, "--gdb", "127.0.0.1:0", *extra], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    log = []
    port = None
    deadline = time.time() + 300
    while port is None and time.time() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        log.append(line)
        m = re.search(r"waiting for gdb on 127\.0\.0\.1:(\d+)", line)
        port = int(m.group(1)) if m else None
    if port is None:
        p.kill()
        fail("deja debug did not listen:\n" + "".join(log) + p.stderr.read())
    s = socket.create_connection(("127.0.0.1", port), timeout=600)

    def packet(payload):
        s.sendall(b"$" + payload + b"#" + b"%02x" % (sum(payload) & 0xff))
        buf = b""
        while not re.search(rb"\$[^#]*#..", buf):
            data = s.recv(65536)
            if not data:
                break
            buf += data
        return buf

    packet(b"QStartNoAckMode")
    packet(b"vCont;c")
    packet(b"D")
    s.close()
    log.append(p.stderr.read())
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    rss = usage.ru_maxrss * 1024
    if rss > guest_ram + memory_budget.BUDGET_OVER_GUEST_RAM:
        fail(f"deja debug {' '.join(extra)}: peak RSS {rss >> 20} MiB, over the budget\n" + "".join(log))
    return p.returncode, "".join(log), rss


@case
def checkpoint_files_within_checkpoint_memory():
    """Checkpoint files of a guest that dirtied 128 MiB: saving stays within the memory budget; loading them stays
    within --checkpoint-memory (pages shared between files, the rest thinned out)."""
    ram = 160 << 20
    trace = path("m.trace")
    r = deja("record", "--mem", "160M", "-o", trace, "--backend", "interp", guest("memory.elf"), guest_ram=ram,
             timeout=600)
    expect(r, 1, [], "recording the memory guest (128 MiB written)")
    rc, log, save_rss = debug_and_detach(trace, ["--save-checkpoints", "--checkpoint-memory", "4G",
                                                 "--checkpoint-interval", "40000000"], ram)
    files = [f for f in os.listdir(hostile.TMP) if f.startswith("m.trace.") and f.endswith(".ckpt")]
    if rc != 0 or len(files) < 9:
        fail(f"saving checkpoints: status {rc}, {len(files)} files\n{log}")
    on_disk = sum(os.path.getsize(path(f)) for f in files)
    limit = 64 << 20
    rc, log, load_rss = debug_and_detach(trace, ["--checkpoint-memory", "64M"], ram)
    m = re.search(r"(\d+) checkpoints \(([\d.]+) MiB\)", log)
    if rc != 0 or "loaded" not in log or not m:
        fail(f"loading checkpoints: status {rc}\n{log}")
    held = float(m.group(2)) * (1 << 20)
    # The limit, plus the one image it cannot drop below (the latest holds all 128 MiB the guest wrote).
    if held > limit + (128 << 20) + (8 << 20):
        fail(f"{len(files)} checkpoint files loaded into {held / (1 << 20):.1f} MiB with --checkpoint-memory 64M\n{log}")
    if load_rss > ram + limit + (128 << 20) + (192 << 20):
        fail(f"loading {len(files)} checkpoint files peaked at {load_rss >> 20} MiB RSS\n{log}")
    print(f"{len(files)} checkpoint files ({on_disk >> 20} MiB on disk): saving peaked at {save_rss >> 20} MiB RSS; "
          f"loading with --checkpoint-memory 64M held {held / (1 << 20):.1f} MiB, peak RSS {load_rss >> 20} MiB "
          f"(guest RAM {ram >> 20} MiB)")


if __name__ == "__main__":
    hostile.main(CASES)
