#!/usr/bin/env python3
"""`deja inspect --html`: one self-contained page for a recording, checked in a real browser.

Records the serial-echo guest (serial input and output, asynchronous events, dense state digests), writes its page
and checks the file (one file, a Content-Security-Policy that forbids every fetch, no external reference), then loads
it in Debian's headless Chromium (html_browser_check.py): no console errors or exceptions, nothing fetched, the chart,
the table and the serial output drawn within a second, and a screenshot that is not blank (kept in the build tree as
a test artifact). Also: --divergence marks the point, a truncated trace still gets its page, the page is never
written onto the trace.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import html_browser_check  # noqa: E402

FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def run(argv):
    return subprocess.run(argv, capture_output=True, text=True, timeout=600)


def check_file(page, what):
    html = open(page, encoding="utf-8").read()
    check("Content-Security-Policy" in html and "default-src 'none'" in html, f"{what}: the page forbids fetches")
    external = re.findall(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:|//)""", html, re.I)
    check(not external and "<link" not in html and "@import" not in html and "url(" not in html,
          f"{what}: no external reference ({external[:3]})")
    return html


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deja", required=True)
    parser.add_argument("--guests", required=True)
    parser.add_argument("--artifacts", required=True, help="where the screenshot is kept")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="deja-html-")
    os.makedirs(args.artifacts, exist_ok=True)
    try:
        trace = os.path.join(work, "serial-echo.trace")
        serial_in = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "guest-tests",
                                 "serial-echo.input")
        r = run([args.deja, "record", "--backend", "interp", "--digest-every", "64", "--serial-in", serial_in,
                 "-o", trace, os.path.join(args.guests, "serial-echo.elf")])
        check(os.path.exists(trace), f"record serial-echo ({r.stderr.strip()[-300:]})")
        page = os.path.join(work, "timeline.html")
        r = run([args.deja, "inspect", trace, "--html", page])
        check(r.returncode == 0 and os.path.exists(page), f"inspect --html writes the page ({r.stderr[-300:]})")
        html = check_file(page, "serial-echo")
        check(os.path.getsize(page) < 2 << 20, f"the page is {os.path.getsize(page)} bytes")
        check(f"deja query {trace} --at event:" in html or "deja query " in html, "the table builds deja query commands")
        data = json.loads(re.search(r'<script type="application/json" id="deja-data">(.*?)</script>', html,
                                    re.S).group(1))
        check(any(l["name"].startswith("serial output") for l in data["lanes"]) and
              any(l["name"].startswith("asynchronous events") for l in data["lanes"]),
              f"lanes for serial output and asynchronous events ({[l['name'] for l in data['lanes']]})")
        digests = [row for row in data["rows"] if row[3] == "digest"]
        check(len(digests) >= 2, f"state digests are points in the table ({len(digests)})")
        # The query command of a digest row stops where that digest was taken: its registers are there.
        if digests:
            q = run([args.deja, "query", trace, "--at", f"event:{digests[0][1]}", "--regs", "--json"])
            check(q.returncode == 0 and json.loads(q.stdout)["events"] == digests[0][1],
                  f"a row's deja query command runs ({q.stderr[-200:]})")

        result = html_browser_check.check_page(page, os.path.join(args.artifacts, "html-timeline.png"))
        if result is None:
            print("skip: no Chromium (scripts/setup.sh installs Debian's chromium)")
        else:
            print(json.dumps(result))
            check(not result["errors"], f"Chromium: no console errors or exceptions ({result['errors'][:3]})")
            check(not result["other_requests"], f"Chromium: nothing fetched ({result['other_requests'][:3]})")
            check(result["rendered"] == "yes" and result["svg_rects"] > 10 and result["table_rows"] >= 2 and
                  result["serial_chars"] > 0, "Chromium: the chart, the table and the serial output are drawn")
            check(result["render_ms"] is not None and result["render_ms"] < 1000,
                  f"Chromium: drawn in {result['render_ms']} ms (load event at {result['navigation_to_load_ms']} ms)")
            shot = result["screenshot"]
            check(shot["non_white_fraction"] > 0.02 and shot["colours"] > 8,
                  f"the screenshot is not blank ({shot}); kept as {args.artifacts}/html-timeline.png")

        # Guest-controlled text (the serial output echoes the input) and a hostile trace name are text on the page,
        # never markup: nothing they hold runs, loads or adds an element.
        hostile = ("</script><script>window.dejaPwned=1</script><img src=x onerror=window.dejaPwned=2>"
                   "<b id=pwn>bold</b>&amp;<!--")
        hostile_in = os.path.join(work, "hostile.input")
        with open(hostile_in, "w") as f:
            f.write("###" + hostile + "\n")
        hostile_trace = os.path.join(work, "<i>x&y'.trace")
        r = run([args.deja, "record", "--backend", "interp", "--serial-in", hostile_in, "-o", hostile_trace,
                 os.path.join(args.guests, "serial-echo.elf")])
        check(hostile in r.stdout, f"the guest echoes the markup ({r.stdout[-200:]!r})")
        hostile_page = os.path.join(work, "hostile.html")
        r = run([args.deja, "inspect", hostile_trace, "--html", hostile_page])
        check(r.returncode == 0, f"inspect --html of the hostile trace ({r.stderr[-200:]})")
        raw = check_file(hostile_page, "hostile")
        check("<b id=pwn>" not in raw and "<img src=x" not in raw and "<i>x&y" not in raw,
              "the guest's markup and the trace's name are escaped in the file")
        result = html_browser_check.check_page(hostile_page, None, expressions={
            "pwned": "String(window.dejaPwned)",
            "injected": "document.querySelectorAll('#pwn, img, i').length",
            "scripts": "document.scripts.length",
            "serial_text": "document.getElementById('serial').textContent",
            "command": "document.querySelector('#events tbody code').textContent",
        })
        if result is not None:
            check(result["pwned"] == "undefined" and result["injected"] == 0 and not result["other_requests"],
                  f"Chromium: nothing of the guest's runs, loads or becomes an element ({result['pwned']}, "
                  f"{result['injected']}, {result['other_requests'][:3]})")
            check(result["scripts"] == 2 and not result["errors"],
                  f"Chromium: only the page's own two scripts, no errors ({result['scripts']}, {result['errors'][:2]})")
            check(hostile in (result["serial_text"] or ""), "Chromium: the guest's markup shows as the text it is")
            check("<i>x&y'" in (result["title"] or ""), f"Chromium: the trace's name is the title's text "
                                                         f"({result['title']!r})")
            # The table's command, pasted into a shell, names the trace as one word.
            command = result["command"] or ""
            q = subprocess.run(command.replace("deja ", shlex.quote(args.deja) + " ", 1) + " --json", shell=True,
                               capture_output=True, text=True, timeout=600)
            check(command.startswith("deja query '") and q.returncode == 0 and "registers" in q.stdout,
                  f"the table's command runs in a shell ({command!r}: {q.stderr[-200:]})")

        marked = os.path.join(work, "marked.html")
        r = run([args.deja, "inspect", trace, "--html", marked, "--divergence", "40"])
        check(r.returncode == 0 and "a replay diverged at event 40" in open(marked).read(), "--divergence marks a point")
        r = run([args.deja, "inspect", trace, "--divergence", "40"])
        check(r.returncode == 2, "--divergence without --html is refused")

        cut = os.path.join(work, "cut.trace")
        with open(trace, "rb") as src, open(cut, "wb") as dst:
            dst.write(src.read()[:os.path.getsize(trace) * 2 // 3])
        cut_page = os.path.join(work, "cut.html")
        r = run([args.deja, "inspect", cut, "--html", cut_page])
        check(os.path.exists(cut_page) and "truncated" in open(cut_page).read(),
              f"a truncated trace gets its page, saying so (status {r.returncode})")
        before = open(trace, "rb").read()
        r = run([args.deja, "inspect", trace, "--html", trace])
        check(r.returncode == 2 and open(trace, "rb").read() == before, "--html onto the trace is refused")
    finally:
        if not FAILURES:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    print(f"{'FAILED' if FAILURES else 'passed'}: {len(FAILURES)} failures")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
