#!/usr/bin/env python3
"""Drives the bundled Linux guest over its serial console, on deja (interp or KVM) or on QEMU.

Used by tests/linux/linux_test.py, bench/linux_boot_bench.py and bench/linux_rr_bench.py. A session starts the
machine with its serial console on a pipe, waits for /init's marker and the shell prompt, then runs commands one at
a time, each framed by markers so its output and status can be read back despite the terminal's echo and line
editing; it notes when each piece of output arrived (for timing a step, live or replayed).
"""
import os
import re
import select
import signal
import subprocess
import time

MARKER = b"deja-linux: ready"
# The bundled guest's command line on deja (tools/linux_guest.cpp) is the base for QEMU's too.
QEMU_CPU = "qemu64,-apic,-x2apic"


class GuestError(Exception):
    pass


class Session:
    def __init__(self, argv, timeout=300, env=None, log=None, stderr=subprocess.STDOUT, pace=None):
        """`stderr`: where the machine's own messages go (by default mixed into the console output). `pace`: type at
        most this many bytes ahead of the guest's echo (None: a whole line at once). QEMU 7.2's recording
        (`-icount ...,rr=record`) stops taking serial input for good once its 16550's 16-byte FIFO has filled, so
        a line typed at once into it stalls after 16 bytes."""
        self.argv = argv
        self.pace = pace
        self.timeout = timeout
        self.log = log
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr, env=env, start_new_session=True)
        self.output = b""
        self.seen = 0  # output consumed by wait_for
        self.count = 0
        self.ready_s = None
        self.arrivals = []  # (seconds since start, length of the output then): when each piece of output came

    def _read(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        ready, _, _ = select.select([self.proc.stdout], [], [], remaining)
        if not ready:
            return False
        chunk = os.read(self.proc.stdout.fileno(), 65536)
        if not chunk:
            raise GuestError(f"the machine ended (status {self.proc.wait()}) while waiting; output so far:\n"
                             + self.output[-3000:].decode(errors="replace"))
        self.output += chunk
        self.arrivals.append((time.monotonic() - self.started, len(self.output)))
        if self.log:
            self.log.write(chunk)
            self.log.flush()
        return True

    def arrived(self, offset):
        """Seconds from the start until the output held `offset` bytes (None if it never did)."""
        for seconds, length in self.arrivals:
            if length >= offset:
                return seconds
        return None

    def drain(self, timeout=None):
        """Reads the output until the machine ends (True) or `timeout` seconds pass first (False)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        try:
            while self._read(deadline):
                pass
        except GuestError:
            return True  # end of the output: the machine ended
        return False

    def wait_for(self, pattern, timeout=None):
        """Waits for a regex (bytes) in the output after what earlier waits consumed; returns the match."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            match = regex.search(self.output, self.seen)
            if match:
                self.seen = match.end()
                return match
            if not self._read(deadline):
                raise GuestError(f"timed out waiting for {pattern!r}; output so far:\n"
                                 + self.output[-3000:].decode(errors="replace"))

    def boot(self):
        self.wait_for(re.escape(MARKER))
        self.ready_s = time.monotonic() - self.started
        self.wait_for(rb"# ")
        return self.ready_s

    def send(self, text):
        data = text.encode() + b"\n"
        step = self.pace or len(data)
        for i in range(0, len(data), step):
            chunk = data[i:i + step]
            echoed = len(self.output) + len(chunk)
            self.proc.stdin.write(chunk)
            self.proc.stdin.flush()
            if self.pace and i + step < len(data):
                # Each byte typed comes back as at least one byte of echo.
                deadline = time.monotonic() + self.timeout
                while len(self.output) < echoed:
                    if not self._read(deadline):
                        raise GuestError(f"the guest did not echo {chunk!r}; output so far:\n"
                                         + self.output[-3000:].decode(errors="replace"))

    def run(self, command, timeout=None):
        """Runs one shell command; returns (status, output as text with CR removed)."""
        self.count += 1
        n = self.count
        self.send(f"echo @@B{n}; {command}; echo @@E{n}:$?")
        self.wait_for(rb"@@B%d\r?\n" % n, timeout)
        start = self.seen
        match = self.wait_for(rb"@@E%d:(\d+)\r?\n" % n, timeout)
        body = self.output[start:match.start()].decode(errors="replace").replace("\r", "")
        return int(match.group(1)), body

    def check(self, command, timeout=None):
        status, body = self.run(command, timeout)
        if status != 0:
            raise GuestError(f"`{command}` failed with status {status}:\n{body}")
        return body

    def finish(self, status=0, timeout=120):
        """Ends the machine through isa-debug-exit; returns the machine's exit status and its remaining output."""
        self.send(f"deja-exit {status}")
        try:
            rest, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise GuestError("the machine did not stop after deja-exit")
        self.output += rest or b""
        if self.log and rest:
            self.log.write(rest)
        return self.proc.returncode

    def kill(self):
        """Stops the machine: SIGINT first (deja then prints its --stats, useful in the log), SIGKILL after 10 s."""
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            rest, _ = self.proc.communicate(timeout=10)
            if self.log and rest:
                self.log.write(rest)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def deja_argv(deja, backend, extra=(), stats=False):
    argv = [deja, "run", "--backend", backend, "--linux", *extra]
    if stats:
        argv.append("--stats")
    return argv + ["--serial-in", "-"]


def extract_vmlinux(kernel, out_path):
    """Writes the vmlinux inside a bzImage (for QEMU's PVH boot); False when its compression is not in Python."""
    import bz2
    import gzip
    import lzma
    import struct
    data = open(kernel, "rb").read()
    setup_sects = data[0x1f1] or 4
    start = (setup_sects + 1) * 512
    offset, length = struct.unpack_from("<II", data, 0x248)
    payload = data[start + offset:start + offset + length]
    if payload.startswith(b"\xfd7zXZ\x00"):
        vmlinux = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
    elif payload.startswith(b"\x1f\x8b"):
        vmlinux = gzip.decompress(payload)
    elif payload.startswith(b"BZh"):
        vmlinux = bz2.BZ2Decompressor().decompress(payload)
    elif payload.startswith(b"\x5d\x00\x00"):
        vmlinux = lzma.LZMADecompressor(format=lzma.FORMAT_ALONE).decompress(payload)
    else:
        return False
    with open(out_path, "wb") as f:
        f.write(vmlinux)
    return True


def qemu_argv(vmlinux, initramfs, cmdline, disk=None, net=False, rng=False, overlay=None):
    argv = ["qemu-system-x86_64", "-accel", "tcg", "-machine", "pc,acpi=off", "-cpu", QEMU_CPU, "-m", "256M",
            "-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio",
            "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
            "-kernel", vmlinux, "-initrd", initramfs, "-append", cmdline]
    if disk:
        # The base image is never written: QEMU's snapshot mode keeps the guest's writes in a temporary overlay.
        argv += ["-drive", f"file={disk},format=raw,if=none,id=d0,snapshot=on", "-device", "virtio-blk-pci,drive=d0"]
    if net:
        argv += ["-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0"]
    if rng:
        argv += ["-object", "rng-random,id=r0,filename=/dev/urandom", "-device", "virtio-rng-pci,rng=r0"]
    return argv


TIMESTAMP = re.compile(r"\[ *\d+\.\d+\]")


def mask(text):
    """Masks what depends on time: kernel timestamps."""
    return TIMESTAMP.sub("[TIME]", text)
