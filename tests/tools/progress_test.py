#!/usr/bin/env python3
"""Progress lines on long work: `deja replay`, `verify`, `query` and `debug --verify-checkpoints`.

On a terminal (stderr a pseudo-terminal here) a line redrawn in place ("\\r" and erase-to-end-of-line) with the
position in instructions and events, the rate and the time left; none when stderr is not a terminal, none with
--quiet; --progress-json emits one JSON object a line whatever stderr is, the last one {"done": true} with the
position at the end equal to the totals from the trace's index. Not to be confused with --progress (where
asynchronous events land), which keeps its meaning.
"""
import argparse
import json
import os
import pty
import select
import shutil
import subprocess
import sys
import tempfile

FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def on_terminal(argv):
    """Runs argv with stderr on a pseudo-terminal; returns (status, what the terminal received)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 600)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return proc.wait(), out.decode(errors="replace")


def json_lines(stderr):
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deja", required=True)
    parser.add_argument("--guests", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="deja-progress-")
    try:
        trace = os.path.join(work, "cpu-bound.trace")
        r = subprocess.run([args.deja, "record", "--backend", "interp", "-o", trace,
                            os.path.join(args.guests, "cpu-bound.elf")], capture_output=True, text=True, timeout=600)
        check(os.path.exists(trace), f"record cpu-bound ({r.stderr.strip()[-200:]})")
        footer = json.loads(subprocess.run([args.deja, "inspect", "--json", trace], capture_output=True,
                                           text=True).stdout)["footer"]

        status, seen = on_terminal([args.deja, "replay", trace])
        check(status == 1, f"replay on a terminal ends as the guest did (status {status})")
        check("\r\x1b[K" in seen and "deja: replay" in seen and "instructions" in seen and "left" in seen and "%" in seen,
              f"replay on a terminal draws a progress line ({seen[:300]!r})")
        summary = seen.find("deja: replay OK")
        check(summary > 0 and seen[:summary].endswith("\r\x1b[K"), "the progress line is cleared before the summary")
        status, seen = on_terminal([args.deja, "replay", "--quiet", trace])
        check(status == 1 and "deja: replay " not in seen and "\r" not in seen,
              f"--quiet: no progress line and no summary ({seen[:200]!r})")
        r = subprocess.run([args.deja, "replay", trace], capture_output=True, text=True, timeout=600)
        check(r.returncode == 1 and "\r" not in r.stderr and "%" not in r.stderr,
              f"stderr not a terminal: no progress line ({r.stderr[:200]!r})")
        r = subprocess.run([args.deja, "replay", "--progress-json", trace], capture_output=True, text=True, timeout=600)
        lines = json_lines(r.stderr)
        check(r.returncode == 1 and len(lines) >= 2, f"--progress-json: JSON lines on stderr ({len(lines)})")
        if lines:
            last = lines[-1]
            check(last.get("done") is True and last.get("progress") == "replay", "the last line says done")
            check(last.get("instructions") == last.get("instructions_total") == int(footer["instructions"]),
                  f"done at the trace's instruction count ({last.get('instructions')} of {footer['instructions']})")
            check(last.get("events") == last.get("events_total"), f"done at the trace's event count ({last})")
            middle = [l for l in lines[:-1] if 0 < l.get("fraction", 0) < 1]
            check(all("seconds_left" in l and l["rate_per_s"] > 0 for l in middle),
                  "lines before the end carry a rate and the time left")
        r = subprocess.run([args.deja, "replay", "--progress-json", "--quiet", trace], capture_output=True, text=True)
        check(len(json_lines(r.stderr)) >= 1, "--progress-json is for wrappers: --quiet does not silence it")
        r = subprocess.run([args.deja, "replay", "--progress", "exact", trace], capture_output=True, text=True)
        check(r.returncode == 1 and "replay OK" in r.stderr, "--progress keeps its meaning (the counter for coordinates)")

        # Progress only reads counters: the replayed state is the same with it and without it, and the trace is not
        # touched (verify reads it; record shows no progress).
        def digest(extra, terminal):
            argv = [args.deja, "replay", "--digest", *extra, trace]
            if terminal:
                _, seen = on_terminal(argv)
            else:
                seen = subprocess.run(argv, capture_output=True, text=True, timeout=600).stderr
            return [l.split()[-1] for l in seen.splitlines() if "deja: digest " in l]
        before = os.stat(trace)
        plain = digest([], False)
        check(len(plain) == 1 and digest(["--progress-json"], False) == plain and digest([], True) == plain,
              f"the final state digest is the same with and without progress ({plain})")
        after = os.stat(trace)
        check((before.st_mtime_ns, before.st_size) == (after.st_mtime_ns, after.st_size), "the trace is not written")

        r = subprocess.run([args.deja, "verify", "--progress-json", trace], capture_output=True, text=True)
        lines = json_lines(r.stderr)
        check(r.returncode == 0 and lines and lines[-1].get("done") and
              lines[-1].get("bytes_total") == os.path.getsize(trace),
              f"verify --progress-json counts the file's bytes ({lines[-1:]})")
        r = subprocess.run([args.deja, "verify", "--replay", "--progress-json", trace], capture_output=True, text=True,
                           timeout=600)
        tasks = [l.get("progress") for l in json_lines(r.stderr)]
        check(r.returncode == 0 and "verify" in tasks and "replay" in tasks,
              f"verify --replay shows the check and the replay ({sorted(set(tasks))})")
        status, seen = on_terminal([args.deja, "verify", "--replay", trace])
        check(status == 0 and "\r\x1b[K" in seen and "deja: replay" in seen, "verify --replay on a terminal: a line")
        r = subprocess.run([args.deja, "query", trace, "--at", "end", "--regs", "--progress-json"], capture_output=True,
                           text=True, timeout=600)
        lines = json_lines(r.stderr)
        check(r.returncode == 0 and lines and lines[-1].get("progress") == "query" and lines[-1].get("done"),
              f"query --progress-json ({r.stderr[-200:]})")
        r = subprocess.run([args.deja, "debug", trace, "--verify-checkpoints", "--checkpoint-interval", "20000000",
                            "--progress-json"], capture_output=True, text=True, timeout=900)
        tasks = {l.get("progress") for l in json_lines(r.stderr)}
        check(r.returncode == 0 and {"verify-checkpoints: replay", "verify-checkpoints: check"} <= tasks,
              f"debug --verify-checkpoints shows both phases ({tasks}; {r.stderr[-200:]})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'FAILED' if FAILURES else 'passed'}: {len(FAILURES)} failures")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
