"""scripts/slim_fatbin.py on a shared library with a made-up fat binary: only the kept
architecture's code survives, and nothing else in the file changes."""

from __future__ import annotations

import importlib.util
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("slim_fatbin", ROOT / "scripts/slim_fatbin.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _entry(arch: int, payload: bytes) -> bytes:
    header = struct.pack("<HHIQ", 2, 0x101, 64, len(payload)) + bytes(12) \
        + struct.pack("<I", arch) + bytes(64 - 32)
    return header + payload


def _fatbin(entries: list[tuple[int, bytes]]) -> bytes:
    body = b"".join(_entry(a, p) for a, p in entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _library(tmp_path: Path, blob: bytes) -> Path:
    src = tmp_path / "fat.c"
    values = ", ".join(str(b) for b in blob)
    src.write_text("__attribute__((section(\".nv_fatbin\"), used, aligned(8))) "
                   f"const unsigned char fat[{len(blob)}] = {{{values}}};\n"
                   "int marker(void) { return 42; }\n")
    lib = tmp_path / "libfat.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def test_only_the_kept_architecture_survives(tmp_path):
    rng = np.random.default_rng(3)
    code = {arch: rng.integers(1, 255, size=40 + arch, dtype="uint8").tobytes()
            for arch in (80, 90, 120)}
    blob = _fatbin([(80, code[80]), (90, code[90])]) + bytes(8) + _fatbin([(120, code[120])])
    lib = _library(tmp_path, blob)
    before = lib.read_bytes()
    slim = _module()
    assert slim.main([str(lib), "--keep", "90"]) == 0
    after = lib.read_bytes()
    assert len(after) == len(before)
    start = before.index(blob)
    assert after[start:start + len(blob)].count(code[90]) == 1
    for arch in (80, 120):
        assert code[arch] not in after
    assert after[:start] == before[:start]
    assert after[start + len(blob):] == before[start + len(blob):]
    changed = [i for i, (x, y) in enumerate(zip(before, after, strict=True)) if x != y]
    assert all(after[i] == 0 for i in changed)
    assert len(changed) == sum(1 for arch in (80, 120) for b in code[arch] if b)


def test_a_library_without_the_kept_code_is_refused(tmp_path):
    lib = _library(tmp_path, _fatbin([(80, b"\x01" * 32)]))
    before = lib.read_bytes()
    assert _module().main([str(lib), "--keep", "90"]) == 1
    assert lib.read_bytes() == before


def test_not_an_elf_file_is_refused(tmp_path):
    bad = tmp_path / "x.so"
    bad.write_bytes(b"not an elf file at all" * 4)
    assert _module().main([str(bad), "--keep", "90"]) == 1
