#!/usr/bin/env python3
"""Loads a page in Debian's headless Chromium through the DevTools protocol and reports what a person would see.

Only the standard library: a small WebSocket client for the DevTools protocol and a PNG decoder for the screenshot.
Chromium runs with no network use of its own (no sync, no component updates, no background networking, no QUIC),
in a fresh profile directory. The page is loaded from about:blank by Page.navigate after the console and log
domains are enabled, so that every console message, uncaught exception and blocked fetch is seen.

As a module: check_page(html, png) -> dict with errors, render and load times, element counts and the screenshot's
colour statistics. As a script: prints that dict as JSON (exit 0), or 77 when no Chromium is installed.
"""
import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class WebSocket:
    """RFC 6455 client: text frames out (masked, as clients must), text frames in (fragmented or not)."""

    def __init__(self, url, timeout):
        m = re.match(r"ws://([^/:]+):(\d+)(/.*)", url)
        host, port, path = m.group(1), int(m.group(2)), m.group(3)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise RuntimeError("the DevTools WebSocket closed during the handshake")
            response += chunk
        head, self.buffer = response.split(b"\r\n\r\n", 1)
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        if b" 101 " not in head.split(b"\r\n")[0] or accept not in head:
            raise RuntimeError(f"the DevTools WebSocket handshake failed: {head[:200]!r}")

    def send(self, text):
        data = text.encode()
        header = bytes([0x81])
        if len(data) < 126:
            header += bytes([0x80 | len(data)])
        elif len(data) < 65536:
            header += bytes([0x80 | 126]) + struct.pack(">H", len(data))
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", len(data))
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _read(self, n):
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise RuntimeError("the DevTools WebSocket closed")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def receive(self):
        message = b""
        while True:
            b0, b1 = self._read(2)
            length = b1 & 0x7f
            if length == 126:
                length = struct.unpack(">H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(length)
            opcode = b0 & 0x0f
            if opcode == 0x8:
                raise RuntimeError("the DevTools WebSocket closed")
            if opcode in (0x9, 0xa):  # ping, pong: not part of a message
                continue
            message += payload
            if b0 & 0x80:
                return message.decode()


class DevTools:
    def __init__(self, ws_url, timeout):
        self.ws = WebSocket(ws_url, timeout)
        self.next_id = 0
        self.events = []

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.receive())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events:
                if e.get("method") == method:
                    return e
            self.events.append(json.loads(self.ws.receive()))
        raise RuntimeError(f"no {method} within {timeout} s")


def decode_png(data):
    """8-bit RGB or RGBA, non-interlaced (what Chromium writes): returns (width, height, channels, rows)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour not in (2, 6) or interlace:
                raise ValueError(f"PNG depth {depth} colour {colour} interlace {interlace} not handled")
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = previous[i]
            c = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xff
            elif kind == 2:
                line[i] = (line[i] + b) & 0xff
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xff
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xff
        rows.append(bytes(line))
        previous = line
    return width, height, channels, rows


def screenshot_stats(png):
    width, height, channels, rows = decode_png(png)
    colours, non_white = set(), 0
    for row in rows[::2]:
        for x in range(0, width * channels, channels * 2):
            pixel = row[x:x + 3]
            colours.add(pixel)
            if pixel != b"\xff\xff\xff":
                non_white += 1
    sampled = ((height + 1) // 2) * ((width + 1) // 2)
    return {"width": width, "height": height, "colours": len(colours), "non_white_fraction": non_white / sampled}


def check_page(html, png=None, timeout=60, expressions=None):
    """`expressions` (name -> JavaScript) are evaluated in the loaded page; their values go into the result."""
    chromium = find_chromium()
    if not chromium:
        return None
    profile = tempfile.mkdtemp(prefix="deja-chromium-")
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-default-apps", "--disable-extensions", "--user-data-dir=" + profile,
            "--remote-debugging-port=0", "--window-size=1280,1600", "about:blank"]
    # Chromium's crash handler refuses to start ("--database is required") where HOME and the XDG directories are
    # missing or read-only, as in the nested-KVM harness: give it the profile's.
    env = dict(os.environ, HOME=profile, XDG_CONFIG_HOME=os.path.join(profile, "config"),
               XDG_CACHE_HOME=os.path.join(profile, "cache"))
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        ws_url, stderr_lines, deadline = None, [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            stderr_lines.append(line)
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                ws_url = m.group(1)
                break
        if not ws_url:
            raise RuntimeError("Chromium did not start its DevTools server:\n" + "".join(stderr_lines[-20:]))
        port = re.match(r"ws://[^:]+:(\d+)/", ws_url).group(1)
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout).read())
        page = next(t for t in targets if t.get("type") == "page")
        dt = DevTools(page["webSocketDebuggerUrl"], timeout)
        for domain in ("Runtime", "Log", "Page", "Network"):
            dt.call(domain + ".enable")
        t0 = time.monotonic()
        url = "file://" + urllib.request.pathname2url(os.path.abspath(html))
        dt.call("Page.navigate", url=url)
        dt.wait_for("Page.loadEventFired", timeout)
        load_s = time.monotonic() - t0

        def evaluate(expression):
            return dt.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

        result = {
            "load_s": load_s,
            "render_ms": evaluate("window.dejaRenderMs"),
            "navigation_to_load_ms": evaluate(
                "performance.getEntriesByType('navigation')[0].loadEventEnd"),
            "rendered": evaluate("document.body.getAttribute('data-rendered')"),
            "svg_rects": evaluate("document.querySelectorAll('#chart svg rect').length"),
            "svg_lines": evaluate("document.querySelectorAll('#chart svg line').length"),
            "table_rows": evaluate("document.querySelectorAll('#events tbody tr').length"),
            "serial_chars": evaluate("document.getElementById('serial').textContent.length"),
            "title": evaluate("document.title"),
        }
        for name, expression in (expressions or {}).items():
            result[name] = evaluate(expression)
        errors, requests = [], []
        for e in dt.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                errors.append("exception: " + json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
                errors.append("console." + params["type"] + ": " + json.dumps(params.get("args", []))[:500])
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
                errors.append("log: " + params["entry"].get("text", "")[:500])
            elif method == "Network.requestWillBeSent":
                requests.append(params.get("request", {}).get("url", ""))
        result["errors"] = errors
        # Everything loaded other than the page itself (a local file too): nothing should be.
        result["other_requests"] = [u for u in requests if u != url]
        if png:
            shot = base64.b64decode(dt.call("Page.captureScreenshot", format="png")["data"])
            with open(png, "wb") as f:
                f.write(shot)
            result["screenshot"] = screenshot_stats(shot)
        return result
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("html")
    parser.add_argument("--screenshot", help="write the screenshot here (PNG)")
    args = parser.parse_args()
    result = check_page(args.html, args.screenshot)
    if result is None:
        print("no Chromium installed (scripts/setup.sh installs Debian's chromium)")
        return 77
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
