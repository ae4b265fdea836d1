#!/usr/bin/env python3
"""Zero the GPU code of a shared library's fat binaries that is not for one SM arch.

A CUDA library's ``.nv_fatbin`` section holds its kernels once per GPU architecture
(onnxruntime-gpu's CUDA provider: sm_75, 80, 86, 89, 90 and 120 — 218 MiB). The CUDA
runtime loads the entry built for the device's own architecture, so for one GPU kind the
others can be zeroed in place: offsets and headers stay as they are, and the zeros
compress to nothing. That is how onnxruntime-gpu travels to the H200 (sm_90) within the
device tool's 64 MiB a call (see CONTRIBUTING.md).

    python scripts/slim_fatbin.py LIB.so --keep 90

The library is rewritten in place; a library whose device has another architecture
fails to load its kernels, so keep the original for anything but that device.
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50


def fatbin_section(data: bytes) -> tuple[int, int]:
    """(offset, size) of the ``.nv_fatbin`` section of a 64-bit little-endian ELF file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def section(i: int) -> tuple[int, int, int]:
        name, _, _, _, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, off, size

    _, str_off, _ = section(shstrndx)
    for i in range(shnum):
        name, off, size = section(i)
        end = data.index(b"\0", str_off + name)
        if data[str_off + name:end] == b".nv_fatbin":
            return off, size
    raise ValueError("no .nv_fatbin section")


def slim(data: bytearray, keep: int) -> tuple[int, dict[int, int]]:
    """Zero every fat-binary entry whose architecture is not ``keep``, in place.

    Returns the bytes zeroed and the bytes per architecture seen.
    """
    off, size = fatbin_section(bytes(data[:]))
    pos, end_sec, zeroed = off, off + size, 0
    per_arch: dict[int, int] = {}
    while pos + 16 <= end_sec:
        magic, _version, header, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # alignment padding between fat binaries
            continue
        entry, end = pos + header, pos + header + fat_size
        while entry < end:
            _kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch, = struct.unpack_from("<I", data, entry + 28)
            per_arch[arch] = per_arch.get(arch, 0) + payload
            if arch != keep:
                start = entry + entry_header
                data[start:start + payload] = bytes(payload)
                zeroed += payload
            entry += entry_header + payload
        pos = end
    if keep not in per_arch:
        raise ValueError(f"no sm_{keep} code in the fat binaries (found {sorted(per_arch)})")
    return zeroed, per_arch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("library", type=Path)
    parser.add_argument("--keep", type=int, required=True, help="the SM arch kept, e.g. 90")
    args = parser.parse_args(argv)
    data = bytearray(args.library.read_bytes())
    try:
        zeroed, per_arch = slim(data, args.keep)
    except ValueError as exc:
        print(f"slim_fatbin: {args.library}: {exc}", file=sys.stderr)
        return 1
    args.library.write_bytes(data)
    arches = ", ".join(f"sm_{a} {n >> 20} MiB" for a, n in sorted(per_arch.items()))
    print(f"{args.library.name}: {arches}; zeroed {zeroed >> 20} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
