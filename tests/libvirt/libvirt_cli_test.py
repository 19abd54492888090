#!/usr/bin/env python3
"""libvirt domains through `deja`: record a guest described by a domain XML, inspect the domain's name, UUID and XML
hash in the trace header, replay it, export the recorded machine as a domain XML that libvirt's schema accepts (xmllint)
and that runs the same guest again, fetch a domain by name through the libvirt API's in-process test driver, and refuse
what deja cannot honour (the test driver's own domain), mixed options, and outputs onto inputs.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

FAILURES = []
SCHEMA = "/usr/share/libvirt/schemas/domain.rng"


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)


def domain(image, disk, serial):
    return f"""<domain type='kvm'>
  <name>hello-vm</name>
  <uuid>3e3fce45-4f53-4fa7-bb32-11f34168b82b</uuid>
  <memory unit='MiB'>128</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{image}</kernel>
  </os>
  <clock offset='utc'/>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='{disk}'/>
      <target dev='vda' bus='virtio'/>
      <readonly/>
    </disk>
    <interface type='user'>
      <mac address='52:54:00:de:1a:01'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'><source path='{serial}'/><target port='0'/></serial>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deja", required=True)
    parser.add_argument("--guests", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="deja-libvirt-")
    try:
        image = os.path.abspath(os.path.join(args.guests, "hello.elf"))
        disk = os.path.join(work, "data.raw")
        with open(disk, "wb") as f:
            f.write(b"\0" * (1 << 20))
        serial = os.path.join(work, "serial.out")
        xml_path = os.path.join(work, "hello-vm.xml")
        xml = domain(image, disk, serial)
        with open(xml_path, "w") as f:
            f.write(xml)
        trace = os.path.join(work, "hello.trace")
        r = run([args.deja, "record", "--backend", "interp", "--libvirt-xml", xml_path, "-o", trace])
        check(r.returncode == 1, f"record --libvirt-xml runs the guest to its successful exit ({r.stderr[-400:]})")
        check("libvirt domain 'hello-vm' (3e3fce45-4f53-4fa7-bb32-11f34168b82b): 128 MiB, 1 vCPU" in r.stderr,
              "it says what the domain maps to")
        check(os.path.exists(serial) and "Hello" in open(serial, errors="replace").read(),
              "<serial type='file'> receives the guest's output")
        doc = json.loads(run([args.deja, "inspect", "--json", trace]).stdout)
        lv = doc["header"].get("libvirt_domain", {})
        check(lv.get("name") == "hello-vm" and lv.get("uuid") == "3e3fce45-4f53-4fa7-bb32-11f34168b82b",
              f"the trace header names the domain ({lv})")
        import base64
        check(base64.b64decode(lv.get("xml_sha256", "")) == hashlib.sha256(xml.encode()).digest(),
              "the header holds the XML's SHA-256")
        config = doc["header"]["config"]
        check(int(config["memory_bytes"]) == 128 << 20 and len(config.get("disks", [])) == 1 and config.get("rng"),
              "memory, the disk and the rng come from the domain")
        check(base64.b64decode(config["nets"][0]["mac"]) == bytes.fromhex("5254 00de 1a01"),
              "the NIC has the domain's MAC address")
        text = run([args.deja, "inspect", trace]).stdout
        check('libvirt      domain "hello-vm" uuid 3e3fce45-4f53-4fa7-bb32-11f34168b82b' in text,
              "inspect shows the domain")
        r = run([args.deja, "replay", trace, "--serial-out", "/dev/null"])
        check(r.returncode == 1 and "replay OK" in r.stderr, f"the recording replays ({r.stderr[-300:]})")

        exported = os.path.join(work, "exported.xml")
        r = run([args.deja, "export-libvirt", trace, "-o", exported])
        check(r.returncode == 0 and os.path.exists(exported), f"export-libvirt -o writes the XML ({r.stderr[-200:]})")
        if shutil.which("xmllint") and os.path.exists(SCHEMA):
            v = run(["xmllint", "--noout", "--relaxng", SCHEMA, exported])
            check(v.returncode == 0, f"xmllint validates the export against libvirt's domain.rng ({v.stderr[-400:]})")
        else:
            print("skip xmllint (libxml2-utils or libvirt0 missing)")
        r = run([args.deja, "export-libvirt", trace])
        check(r.returncode == 0 and "<name>hello-vm</name>" in r.stdout and "52:54:00:de:1a:01" in r.stdout,
              "export-libvirt without -o prints the XML, with the domain's name and MAC")
        r = run([args.deja, "run", "--backend", "interp", "--libvirt-xml", exported])
        check(r.returncode == 1 and "Hello" in r.stdout, f"the exported domain runs the guest again ({r.stderr[-300:]})")
        before = open(trace, "rb").read()
        r = run([args.deja, "export-libvirt", trace, "-o", trace])
        check(r.returncode == 2 and open(trace, "rb").read() == before, "export-libvirt -o onto the trace is refused")

        r = run([args.deja, "run", "--libvirt-xml", xml_path, "--mem", "64M"])
        check(r.returncode == 2 and "--mem" in r.stderr, f"an option the domain sets is refused ({r.stderr[-200:]})")
        r = run([args.deja, "run", "--libvirt-xml", xml_path, image])
        check(r.returncode == 2 and "IMAGE" in r.stderr, "an IMAGE with a domain is refused")

        bad = xml.replace("type='raw'", "type='qcow2'")
        with open(xml_path, "w") as f:
            f.write(bad)
        r = run([args.deja, "run", "--libvirt-xml", xml_path])
        check(r.returncode == 2 and "qemu-img convert -f qcow2 -O raw" in r.stderr, f"qcow2 is refused with the command to "
                                                                              f"convert it ({r.stderr[-300:]})")

        r = run([args.deja, "run", "--libvirt-domain", "test", "--connect", "test:///default"])
        if "without the libvirt API" in r.stderr:
            check(r.returncode == 2 and "libvirt-dev" in r.stderr, "built without libvirt: says how to get it")
        else:
            check(r.returncode == 2 and "firmware" in r.stderr and "<vcpu>2</vcpu>" in r.stderr,
                  f"the test driver's domain is refused on every count ({r.stderr[-500:]})")
            node = os.path.join(work, "node.xml")
            with open(node, "w") as f:
                f.write("<node>\n" + xml.replace("type='kvm'", "type='test'") + "</node>\n")
            r = run([args.deja, "run", "--backend", "interp", "--libvirt-domain", "hello-vm", "--connect",
                     "test://" + node])
            check(r.returncode == 1 and "libvirt domain 'hello-vm'" in r.stderr,
                  f"--libvirt-domain fetches a domain by name from the test driver and runs it ({r.stderr[-400:]})")
            r = run([args.deja, "run", "--libvirt-domain", "nope", "--connect", "test:///default"])
            check(r.returncode == 2 and "nope" in r.stderr, "an unknown domain is named")
    finally:
        if not FAILURES:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    print(f"{'FAILED' if FAILURES else 'passed'}: {len(FAILURES)} failures")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
