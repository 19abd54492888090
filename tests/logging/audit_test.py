#!/usr/bin/env python3
"""Signed traces through the deja binary (issue 26): keygen, record --sign with seals, a recorder killed mid-way,
verify with and without keys, deja sign, RFC 3161 time-stamps from a throwaway local `openssl ts` authority, custody
records, inspect --audit, checkpoint files of a signed trace, the old traces, and docs/audit.md's stock-tool commands
run exactly as written there."""
import argparse
import json
import os
import re
import signal
import socket
import struct
import hashlib
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--deja", required=True)
ap.add_argument("--guests", required=True)
ap.add_argument("--docs", required=True, help="docs/audit.md")
ap.add_argument("--old-traces", required=True)
args = ap.parse_args()
for name in ("deja", "guests", "docs", "old_traces"):
    setattr(args, name, os.path.abspath(getattr(args, name)))
failures = []
passed = 0


def check(ok, what, detail=""):
    global passed
    print(("ok   " if ok else "FAIL ") + what)
    if ok:
        passed += 1
    else:
        failures.append(what)
        if detail:
            print("     " + detail.replace("\n", "\n     ")[-3000:])


def deja(*argv, timeout=600, **kw):
    return subprocess.run([args.deja, *argv], capture_output=True, text=True, timeout=timeout, **kw)


def sh(script, env, cwd):
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **env}, timeout=120)


def doc_block(name):
    text = open(args.docs).read()
    m = re.search(r"<!-- audit-test: " + re.escape(name) + r" -->\s*```sh\n(.*?)```", text, re.S)
    if not m:
        sys.exit(f"docs/audit.md has no block marked audit-test: {name}")
    return m.group(1)


def guest(name):
    return os.path.join(args.guests, name + ".elf")


work = tempfile.mkdtemp(prefix="deja-audit-")
os.chdir(work)
W = lambda name: os.path.join(work, name)

# Keys: made once, never replaced; a bad key stops a recording before anything is written.
r = deja("keygen", "-o", "alice")
check(r.returncode == 0 and oct(os.stat("alice").st_mode & 0o777) == "0o600"
      and oct(os.stat("alice.pub").st_mode & 0o777) == "0o644", "keygen: private key 0600, public key 0644", r.stderr)
deja("keygen", "-o", "bob")
before = open("alice", "rb").read()
r = deja("keygen", "-o", "alice")
check(r.returncode == 2 and open("alice", "rb").read() == before and "exists" in r.stderr,
      "keygen refuses to replace a key", r.stderr)
open("junk.key", "w").write("not a key\n")
open("enc.key", "w").write("-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n")
for bad in ("missing.key", "junk.key", "alice.pub", "enc.key"):
    r = deja("record", "--backend", "interp", "--sign", bad, "-o", "bad.trace", guest("hello"))
    written = [f for f in os.listdir(work) if f.startswith("bad.trace")]
    check(r.returncode == 2 and not written and bad in r.stderr,
          f"record --sign {bad}: exit 2 before anything is written", r.stderr + str(written))

# A signed recording verifies by its key only, and says so.
r = deja("record", "--backend", "interp", "--sign", "alice", "-o", "t.trace", guest("hello"))
check(r.returncode == 1 and os.path.exists("t.trace.sig") and oct(os.stat("t.trace.sig").st_mode & 0o777) == "0o600",
      "record --sign writes TRACE.sig (0600)", r.stderr)
r = deja("verify", "t.trace", "--key", "alice.pub")
check(r.returncode == 0 and r.stdout.startswith("VERIFIED") and "signed by alice.pub" in r.stdout,
      "verify --key: VERIFIED, naming the signer", r.stdout + r.stderr)
r = deja("verify", "t.trace")
check(r.returncode == 0 and r.stdout.startswith("OK:") and "VERIFIED" not in r.stdout and "vouches" in r.stdout,
      "verify without a key: OK, signer not vouched for", r.stdout)
r = deja("verify", "t.trace", "--key", "bob.pub")
check(r.returncode == 8 and "FAILED (signature)" in r.stdout and "not a trusted key" in r.stdout,
      "verify --key of another key: refused", r.stdout)
os.makedirs("ring", exist_ok=True)
os.link("alice.pub", "ring/alice.pub")
r = deja("verify", "t.trace", "--keyring", "ring", "--input", guest("hello"))
check(r.returncode == 0 and "signed by alice (" in r.stdout and "is the recorded image" in r.stdout,
      "verify --keyring --input: the keyring's name for the key, the image matches", r.stdout)
r = deja("verify", "t.trace", "--key", "alice.pub", "--input", guest("cpuid"))
check(r.returncode == 8 and "FAILED (inputs)" in r.stdout, "verify --input of another file: refused", r.stdout)
r = deja("verify", "t.trace", "--key", "alice.pub", "--replay")
check(r.returncode == 0 and re.search(r"5 replay +ok", r.stdout), "verify --replay re-executes", r.stdout + r.stderr)

# docs/audit.md: the signature checked with openssl and jq alone, exactly as documented.
block = doc_block("openssl")
r = sh(block, {"TRACE": W("t.trace"), "KEY": W("alice.pub")}, work)
check(r.returncode == 0 and "Signature Verified Successfully" in r.stdout and "key id matches" in r.stdout
      and "subject matches" in r.stdout, "docs/audit.md: stock openssl verifies TRACE.sig", r.stdout + r.stderr)
data = bytearray(open("t.trace", "rb").read())
data[len(data) // 2] ^= 1
open("tampered.trace", "wb").write(data)
os.link("t.trace.sig", "tampered.trace.sig")
r = sh(block, {"TRACE": W("tampered.trace"), "KEY": W("alice.pub")}, work)
check(r.returncode != 0 and "subject matches" not in r.stdout, "docs/audit.md: a tampered trace fails the check",
      r.stdout + r.stderr)
r = sh(block, {"TRACE": W("t.trace"), "KEY": W("bob.pub")}, work)
check(r.returncode != 0, "docs/audit.md: another key fails the check", r.stdout + r.stderr)

# deja sign, and RFC 3161 time-stamps from a local authority.
r = deja("record", "--backend", "interp", "-o", "u.trace", guest("nondet"))
r = deja("verify", "u.trace")
check(r.returncode == 0 and "UNSIGNED" in r.stdout, "an unsigned trace is reported unsigned", r.stdout)
r = deja("verify", "u.trace", "--key", "alice.pub")
check(r.returncode == 8 and "unsigned" in r.stdout, "verify --key of an unsigned trace: refused", r.stdout)
r = deja("sign", "u.trace", "--key", "bob", "--tsa-request", "u.tsq")
check(r.returncode == 0 and os.path.exists("u.trace.sig") and os.path.exists("u.tsq"), "deja sign + --tsa-request",
      r.stderr)
r = deja("verify", "u.trace", "--key", "bob.pub")
check(r.returncode == 0 and "VERIFIED" in r.stdout, "a trace signed afterwards verifies by its key", r.stdout)

tsa_cnf = f"""
[ req ]
distinguished_name = dn
prompt = no
[ dn ]
CN = deja test TSA
[ tsa_ext ]
basicConstraints = critical,CA:false
keyUsage = critical,digitalSignature
extendedKeyUsage = critical,timeStamping
[ tsa ]
default_tsa = tsa_config
[ tsa_config ]
serial = {W("tsa.serial")}
signer_cert = {W("tsa.crt")}
signer_key = {W("tsa.key")}
signer_digest = sha256
default_policy = 1.2.3.4.1
digests = sha256
accuracy = secs:1
ess_cert_id_alg = sha256
"""
open("tsa.cnf", "w").write(tsa_cnf)
open("tsa.serial", "w").write("01\n")
setup = """
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj "/CN=deja test CA" 2>/dev/null
openssl req -new -newkey rsa:2048 -nodes -keyout tsa.key -out tsa.csr -config tsa.cnf 2>/dev/null
openssl x509 -req -in tsa.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tsa.crt -days 2 \
  -extfile tsa.cnf -extensions tsa_ext 2>/dev/null
openssl ts -reply -queryfile u.tsq -config tsa.cnf -section tsa_config -out u.tsr 2>/dev/null
"""
r = sh(setup, {}, work)
check(r.returncode == 0 and os.path.exists("u.tsr"), "a throwaway openssl ts authority answers the request",
      r.stdout + r.stderr)
r = deja("sign", "u.trace", "--tsa-response", "u.tsr", "--tsa-ca", "ca.crt")
check(r.returncode == 0 and os.path.exists("u.trace.sig.tsr"), "sign --tsa-response attaches the time-stamp", r.stderr)
r = deja("verify", "u.trace", "--key", "bob.pub", "--tsa-ca", "ca.crt")
check(r.returncode == 0 and "time-stamped" in r.stdout and "deja test TSA" in r.stdout and "checked against" in r.stdout,
      "verify checks the time-stamp against the CA", r.stdout + r.stderr)
r = sh(doc_block("openssl-ts"), {"TRACE": W("u.trace"), "CA": W("ca.crt")}, work)
check(r.returncode == 0 and "Verification: OK" in r.stdout, "docs/audit.md: stock openssl ts verifies the time-stamp",
      r.stdout + r.stderr)
r = deja("sign", "t.trace", "--tsa-response", "u.tsr")
check(r.returncode != 0 and "other data" in r.stderr, "a time-stamp of another signature is refused", r.stderr)
r = sh("openssl req -x509 -newkey rsa:2048 -nodes -keyout o.key -out other-ca.crt -days 2 -subj /CN=other 2>/dev/null",
       {}, work)
r = deja("verify", "u.trace", "--key", "bob.pub", "--tsa-ca", "other-ca.crt")
check(r.returncode == 8 and "does not verify against" in r.stdout, "a time-stamp from an untrusted authority fails",
      r.stdout)

# A recorder killed mid-way: the prefix is authenticated up to its last seal.
proc = subprocess.Popen([args.deja, "record", "--backend", "interp", "--sign", "alice", "--seal-every", "0.3",
                         "-o", "k.trace", "--cmdline", "seconds=60", guest("soak")],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(5)
proc.send_signal(signal.SIGKILL)
proc.wait()
r = deja("verify", "k.trace.partial", "--key", "alice.pub")
m = re.search(r"the seals by alice.pub \(\w+\) authenticate the first (\d+) chunk", r.stdout)
check(r.returncode == 8 and "FAILED (structure)" in r.stdout and m and int(m.group(1)) >= 2,
      "a killed recording: verify names how far the seals authenticate it", r.stdout)
r = deja("verify", "k.trace.partial", "--key", "bob.pub")
check(r.returncode == 8 and "not a trusted key" in r.stdout, "and by whom: not by another key", r.stdout)

# Custody records.
deja("custody", "add", "t.trace", "--action", "collected from the recording host", "--by", "Alice", "--key", "alice")
deja("custody", "add", "t.trace", "--action", "copied to case folder 7", "--by", "Bob", "--key", "bob")
r = deja("custody", "add", "t.trace", "--action", "hashed\x1b[2J for the report", "--by", "Alice", "--key", "alice")
check(r.returncode == 0 and "\x1b" not in r.stderr, "custody add (control characters shown escaped)", r.stderr)
os.link("bob.pub", "ring/bob.pub")
r = deja("custody", "show", "t.trace", "--keyring", "ring")
check(r.returncode == 0 and "3 records" in r.stdout and "signed by bob" in r.stdout and "\x1b" not in r.stdout,
      "custody show: every record checks out", r.stdout + r.stderr)
lines = open("t.trace.custody").read().splitlines(True)
open("t.trace.custody", "w").write(lines[0] + lines[2] + lines[1])
r = deja("custody", "show", "t.trace", "--keyring", "ring")
check(r.returncode == 8 and "custody record 1" in r.stderr, "custody show: a swapped record is refused", r.stderr)
r = deja("custody", "add", "t.trace", "--action", "x", "--by", "y", "--key", "alice")
check(r.returncode != 0 and "damaged custody log" in r.stderr, "custody add: a damaged log is not extended", r.stderr)
open("t.trace.custody", "w").write("".join(lines))

# The auditor's page.
r = deja("inspect", "--audit", "t.trace", "--keyring", "ring")
check(r.returncode == 0 and "WHAT WAS RECORDED" in r.stdout and "signer   alice" in r.stdout
      and "custody  3 record(s)" in r.stdout and "\x1b" not in r.stdout, "inspect --audit", r.stdout + r.stderr)
r = deja("inspect", "--audit", "--json", "t.trace", "--keyring", "ring")
try:
    page = json.loads(r.stdout)
    ok = page["verified"] and page["provenance"]["signer_trusted"] and len(page["custody"]["records"]) == 3 \
        and page["recorded"]["inputs"][0]["role"] == "image"
except (ValueError, KeyError) as e:
    ok = False
check(r.returncode == 0 and ok, "inspect --audit --json carries the same", r.stdout[-2000:])
r = deja("inspect", "--audit", "tampered.trace", "--keyring", "ring")
check(r.returncode == 8 and "FAILED" in r.stdout, "inspect --audit of a tampered trace says it fails", r.stdout)

# Old traces: read, verified (as unsigned) and replayed as before.
for name in sorted(os.listdir(args.old_traces)):
    if name.endswith(".trace"):
        r = deja("verify", os.path.join(args.old_traces, name))
        check(r.returncode == 0 and "UNSIGNED" in r.stdout, f"old trace {name}: verifies, reported unsigned", r.stdout)


# Checkpoint files of a signed trace: used only when its signer signed them, so a register changed and the
# checksum recomputed is refused.
def gdb_session(port, packets):
    s = socket.create_connection(("127.0.0.1", port), timeout=600)
    buf = b""
    for p in packets:
        s.sendall(b"$%s#%02x" % (p, sum(p) & 0xff))
        while not re.search(rb"\$[^#]*#[0-9a-f]{2}", buf):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        s.sendall(b"+")
        buf = re.sub(rb"^.*?\$[^#]*#[0-9a-f]{2}", b"", buf, count=1, flags=re.S)
    s.close()


def debug(trace, extra=(), packets=(b"D",)):
    proc = subprocess.Popen([args.deja, "debug", trace, "--gdb", "127.0.0.1:0", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    while True:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"waiting for gdb on 127\.0\.0\.1:(\d+)", line)
        if m:
            gdb_session(int(m.group(1)), packets)
            break
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, "".join(lines) + out


deja("record", "--backend", "interp", "--sign", "alice", "-o", "race.trace", guest("threads-race"))
rc, log = debug("race.trace", ["--save-checkpoints", "--sign", "alice", "--checkpoint-interval", "2000000"],
                [b"vCont;c", b"D"])
ckpts = sorted(f for f in os.listdir(work) if re.fullmatch(r"race\.trace\.\d+\.ckpt", f))
check(rc == 0 and len(ckpts) >= 3 and all(os.path.exists(f + ".sig") for f in ckpts),
      f"debug --save-checkpoints --sign: {len(ckpts)} checkpoint files, each signed", log)
rc, log = debug("race.trace")
# (the first checkpoint, at the start, is the one the timeline makes itself)
loaded = lambda log: int(re.search(r"loaded (\d+) checkpoints", log).group(1)) if "loaded" in log else 0
check(loaded(log) >= len(ckpts) - 1, "signed checkpoint files are loaded", log)


def resum(path, mutate):
    data = bytearray(open(path, "rb").read())
    at = 16
    while at < len(data) - 32:
        tag, length = data[at:at + 4], struct.unpack_from("<Q", data, at + 4)[0]
        if tag == b"CPU0":
            mutate(data, at + 12)
            break
        at += 12 + length
    data[-32:] = hashlib.sha256(bytes(data[:-32])).digest()
    open(path, "wb").write(bytes(data))


victim = ckpts[1]
resum(victim, lambda d, at: d.__setitem__(at + 8, d[at + 8] ^ 0x40))  # a register's byte, checksum made valid again
rc, log = debug("race.trace")
check(loaded(log) == len(ckpts) - 2 and victim in log and "changed after signing" in log,
      "a checkpoint changed and re-checksummed is refused, naming it", log)
os.unlink(ckpts[2] + ".sig")
rc, log = debug("race.trace")
check("not signed" in log and loaded(log) == len(ckpts) - 3, "an unsigned checkpoint is refused", log)

print(f"{passed} passed, {len(failures)} failed")
if failures:
    print("work directory kept: " + work)
    sys.exit(1)
subprocess.run(["rm", "-rf", work])
