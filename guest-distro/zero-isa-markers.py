#!/usr/bin/env python3
"""Zeroes the "x86 ISA needed" GNU property of every ELF file under a directory, in place (a diagnostic only:
guest-distro/build-rootfs.sh --zero-isa-markers). glibc 2.36 refuses to load an object whose
GNU_PROPERTY_X86_ISA_1_NEEDED names an ISA level the CPU lacks ("CPU ISA level is lower than required"); Debian
marks its binaries x86-64-baseline, which includes MMX. Usage: zero-isa-markers.py DIR"""
import os
import struct
import sys

PT_NOTE, PT_GNU_PROPERTY = 4, 0x6474E553
NT_GNU_PROPERTY_TYPE_0 = 5
ISA_1_NEEDED = (0xC0008002, 0xC0000008)  # the current and the pre-2.35 property numbers


def patch(path):
    with open(path, "r+b") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return 0
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        patched = 0
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            ph = f.read(56)
            if len(ph) < 56:
                break
            p_type, _, p_offset, _, _, p_filesz, _, p_align = struct.unpack_from("<IIQQQQQQ", ph)
            if p_type not in (PT_NOTE, PT_GNU_PROPERTY) or p_filesz > 1 << 16:
                continue
            align = 8 if p_align == 8 else 4  # the descriptor and the next note start aligned to the segment
            f.seek(p_offset)
            notes = f.read(p_filesz)
            at = 0
            while at + 12 <= len(notes):
                namesz, descsz, ntype = struct.unpack_from("<III", notes, at)
                desc_at = at + (12 + namesz + align - 1) // align * align
                if ntype == NT_GNU_PROPERTY_TYPE_0 and notes[at + 12:at + 16] == b"GNU\0":
                    prop = desc_at
                    while prop + 8 <= min(desc_at + descsz, len(notes)):
                        pr_type, pr_datasz = struct.unpack_from("<II", notes, prop)
                        if pr_type in ISA_1_NEEDED and pr_datasz == 4 and notes[prop + 8:prop + 12] != b"\0" * 4:
                            f.seek(p_offset + prop + 8)
                            f.write(b"\0\0\0\0")
                            patched += 1
                        prop += 8 + (pr_datasz + 7) // 8 * 8
                at = desc_at + (descsz + align - 1) // align * align
        return 1 if patched else 0


def main():
    count = 0
    for root, _, files in os.walk(sys.argv[1]):
        for name in files:
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                try:
                    count += patch(path)
                except OSError:
                    pass
    print(f"zero-isa-markers: zeroed the ISA-needed property of {count} ELF files under {sys.argv[1]}")


if __name__ == "__main__":
    main()
