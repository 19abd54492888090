"""Runs a deja command for a whole-binary test: its output captured, a hang or a crash ends the test with FAIL."""
import subprocess
import sys


def run(cmd, timeout=600):
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"FAIL: hang: {' '.join(cmd)} did not finish in {timeout}s")
    if p.returncode < 0:
        sys.exit(f"FAIL: crash: {' '.join(cmd)} died with signal {-p.returncode}\n{p.stderr.decode(errors='replace')}")
    return p
