"""The on-disk kernel cache: keys, hash verification, tamper refusal, export/import."""

from __future__ import annotations

import tarfile

import pytest

import pyc_lab as pl
from pyc_lab.kernels.cache import KernelCache, KernelCacheWarning, cache_key

TOOLS = {"nvcc": "13.0.88", "cutlass": "4.2.0.0"}


@pytest.fixture
def cache(tmp_path):
    return KernelCache(tmp_path / "kernels")


def build(cache, source="__global__ void k() {}", arch="sm_90a"):
    key = cache_key(source, arch, TOOLS)
    entry = cache.put(key, {"kernel.cubin": b"\x7fELF" + source.encode() * 3,
                            "host.so": b"\x7fELFhost", "kernel.cu": source},
                      {"arch": arch, "tile": [128, 256, 64]})
    return key, entry


def test_key_depends_on_source_arch_and_toolchain():
    k = cache_key("src", "sm_90a", TOOLS)
    assert len(k) == 64
    assert k == cache_key("src", "sm_90a", dict(reversed(list(TOOLS.items()))))
    assert k != cache_key("src ", "sm_90a", TOOLS)
    assert k != cache_key("src", "sm_80", TOOLS)
    assert k != cache_key("src", "sm_90a", {**TOOLS, "nvcc": "13.1"})


def test_put_then_get_returns_verified_files(cache):
    key, _ = build(cache)
    again = cache.get(key)
    assert again is not None and again.files.keys() == {"kernel.cubin", "host.so", "kernel.cu"}
    assert again.file("kernel.cu").read_text() == "__global__ void k() {}"
    assert again.meta == {"arch": "sm_90a", "tile": [128, 256, 64]}
    assert cache.keys() == [key] and len(cache) == 1
    assert cache.get(cache_key("other", "sm_90a", TOOLS)) is None
    assert cache.stats["hits"] >= 1 and cache.stats["misses"] == 1


def test_tampered_binary_is_refused_and_quarantined(cache):
    key, entry = build(cache)
    cubin = entry.file("kernel.cubin")
    data = bytearray(cubin.read_bytes())
    data[5] ^= 0xFF
    cubin.write_bytes(bytes(data))
    with pytest.warns(KernelCacheWarning, match="does not match its recorded SHA-256"):
        assert cache.get(key) is None
    assert cache.stats["refused"] == 1
    assert cache.keys() == []
    assert any((cache.root / "quarantine").iterdir())
    build(cache)  # the caller rebuilds
    assert cache.get(key) is not None


def test_missing_or_extra_files_are_refused(cache):
    key, entry = build(cache)
    entry.file("host.so").unlink()
    with pytest.warns(KernelCacheWarning, match="host.so is missing"):
        assert cache.get(key) is None
    key, entry = build(cache)
    (entry.path / "evil.so").write_bytes(b"x")
    with pytest.warns(KernelCacheWarning, match="unexpected files"):
        assert cache.get(key) is None


def test_bad_keys_and_file_names_are_clear_errors(cache):
    with pytest.raises(pl.PycLabError, match="not a cache key"):
        cache.get("../../etc")
    with pytest.raises(pl.PycLabError, match="plain names"):
        cache.put(cache_key("s", "sm_90", TOOLS), {"../x": b""})


def test_export_import_moves_the_cache(cache, tmp_path):
    keys = [build(cache, source=f"__global__ void k{i}() {{}}")[0] for i in range(3)]
    bundle = tmp_path / "kernels.tar.gz"
    assert cache.export(bundle) == 3
    other = KernelCache(tmp_path / "elsewhere")
    assert other.import_(bundle) == 3
    assert other.keys() == sorted(keys)
    assert other.get(keys[0]).file("kernel.cu").read_text() == "__global__ void k0() {}"
    assert other.import_(bundle) == 0  # already there and intact


def test_import_refuses_tampered_entries(cache, tmp_path):
    build(cache)
    bundle = tmp_path / "b.tar.gz"
    cache.export(bundle)
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bundle) as src, tarfile.open(bad, "w:gz") as dst:
        for m in src.getmembers():
            f = src.extractfile(m) if m.isfile() else None
            if f is not None and m.name.endswith("host.so"):
                import io

                data = b"\x00" + f.read()
                m.size = len(data)
                dst.addfile(m, io.BytesIO(data))
            else:
                dst.addfile(m, f)
    other = KernelCache(tmp_path / "other")
    with pytest.warns(KernelCacheWarning, match="host.so does not match"):
        assert other.import_(bad) == 0
    assert other.keys() == []


def test_import_refuses_path_traversal_and_non_exports(cache, tmp_path):
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../../outside.txt")
        tar.addfile(info)
    with pytest.raises(pl.PycLabError, match=r"unsafe member '\.\./\.\./outside\.txt'"):
        cache.import_(evil)
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball")
    with pytest.raises(pl.PycLabError, match="not a kernel-cache export"):
        cache.import_(junk)


def test_default_root_is_the_user_cache_dir(monkeypatch, tmp_path):
    import platformdirs

    monkeypatch.setattr(platformdirs, "user_cache_path", lambda app: tmp_path / app)
    assert KernelCache().root == tmp_path / "pyc_lab" / "kernels"
