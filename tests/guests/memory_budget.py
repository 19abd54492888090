"""Memory-budget harness: runs a deja command and fails it when its resident memory exceeds a cap (RSS polling)."""
import os
import signal
import subprocess
import tempfile
import time

MiB = 1 << 20
# deja's own memory may be at most this much over the guest's RAM, whatever the guest or the trace does.
BUDGET_OVER_GUEST_RAM = 512 * MiB
DEFAULT_GUEST_RAM = 256 * MiB


class Result:
    def __init__(self, returncode, stdout, stderr, peak_rss, over_budget, seconds):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.peak_rss = peak_rss  # bytes: the kernel's high-water mark (wait4 ru_maxrss)
        self.over_budget = over_budget
        self.seconds = seconds

    @property
    def err(self):
        return self.stderr.decode(errors="replace")

    def figures(self):
        return f"exit {self.returncode}, peak RSS {self.peak_rss / MiB:.0f} MiB, {self.seconds:.1f} s"


def rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run(cmd, guest_ram=DEFAULT_GUEST_RAM, timeout=120, interrupt_after=None, stdin=subprocess.DEVNULL,
        budget=None, kill_after=None, preexec_fn=None, cwd=None):
    """Runs `cmd`; kills it (and reports over_budget) when its RSS passes guest_ram + 512 MiB.

    interrupt_after: seconds after which SIGINT is sent (a user pressing ^C); kill_after: SIGKILL; the timeout
    is a hang."""
    cap = budget if budget is not None else guest_ram + BUDGET_OVER_GUEST_RAM
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        p = subprocess.Popen(cmd, stdin=stdin, stdout=out, stderr=err, preexec_fn=preexec_fn, cwd=cwd)
        over = False
        interrupted = False
        hung = False
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid != 0:
                break
            now = time.monotonic() - start
            if rss_bytes(p.pid) > cap:
                over = True
                p.kill()
            elif kill_after is not None and now >= kill_after:
                p.kill()
                kill_after = None
            elif interrupt_after is not None and not interrupted and now >= interrupt_after:
                interrupted = True
                p.send_signal(signal.SIGINT)
            elif now > timeout:
                hung = True
                p.kill()
            time.sleep(0.02)
        p.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        result = Result(p.returncode, out.read(), err.read(), usage.ru_maxrss * 1024, over, seconds)
        if hung:
            result.stderr += f"\n[harness: no exit within {timeout} s: killed]".encode()
        result.hung = hung
        if result.peak_rss > cap:
            result.over_budget = True
        return result
