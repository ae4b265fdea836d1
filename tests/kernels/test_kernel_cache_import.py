"""The kernel cache against hostile or broken archives and read-only folders.

Every archive here is built with ``tarfile`` by the test: members that climb out
(``../``, absolute names), links, device files, manifests naming files outside their
entry, and size bombs. Nothing of an unsafe archive may land anywhere, one bad entry of
a sound archive never costs the others, and memory stays flat however large the members.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import textwrap
import tracemalloc
from pathlib import Path

import pytest

import pyc_lab as pl
from pyc_lab.kernels import cache as cache_module
from pyc_lab.kernels.cache import ImportLimits, KernelCache, KernelCacheWarning, cache_key
from tests.kernels.readonly import run_read_only_child

TOOLS = {"nvcc": "13.0.88", "cutlass": "4.2.0.0"}
KEY = cache_key("__global__ void k() {}", "sm_90a", TOOLS)
OTHER = cache_key("__global__ void other() {}", "sm_90a", TOOLS)


@pytest.fixture
def cache(tmp_path: Path) -> KernelCache:
    return KernelCache(tmp_path / "kernels")


def _info(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE, **extra) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode = size, kind, 0o644
    for attr, value in extra.items():
        setattr(info, attr, value)
    return info


def _entry(key: str, files: dict[str, bytes], manifest: dict | None = None) -> list:
    """The members of one entry as an export writes them: folder, files, manifest."""
    if manifest is None:
        manifest = {"key": key, "meta": {},
                    "files": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}}
    blob = json.dumps(manifest).encode()
    members = [(_info(f"{key[:2]}/{key}", kind=tarfile.DIRTYPE), None)]
    members += [(_info(f"{key[:2]}/{key}/{n}", len(d)), d) for n, d in files.items()]
    return [*members, (_info(f"{key[:2]}/{key}/manifest.json", len(blob)), blob)]


def _archive(path: Path, members: list, fmt: int = tarfile.PAX_FORMAT) -> Path:
    with tarfile.open(path, "w:gz", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return path


def _good(key: str = KEY) -> list:
    return _entry(key, {"kernel.so": b"\x7fELF" + key.encode(), "kernel.cu": b"// src"})


def _leftovers(cache: KernelCache) -> list[str]:
    return sorted(p.name for p in cache.root.iterdir() if p.name.startswith(".import-"))


# -- item: manifests may only name files of their own entry -------------------------------

@pytest.mark.parametrize("name", ["ABSOLUTE", "../../secret.txt", "../" + KEY + "/x",
                                  "sub/kernel.so", "..", ".", "", "manifest.json", "a\\b"])
def test_a_manifest_naming_a_file_outside_its_entry_is_refused(cache, tmp_path, name):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not yours")
    name = str(secret) if name == "ABSOLUTE" else name
    files = {"kernel.so": b"\x7fELF"}
    manifest = {"key": KEY, "meta": {}, "files": {
        "kernel.so": hashlib.sha256(b"\x7fELF").hexdigest(),
        name: hashlib.sha256(b"not yours").hexdigest()}}
    bundle = _archive(tmp_path / "evil.tar.gz", _entry(KEY, files, manifest))
    with pytest.warns(KernelCacheWarning, match="not a plain file name inside the entry"):
        assert cache.import_(bundle) == 0
    assert cache.keys() == [] and cache.get(KEY) is None
    assert secret.read_bytes() == b"not yours"
    assert _leftovers(cache) == []


def test_a_manifest_tampered_on_disk_never_hands_out_a_path_outside(cache, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not yours")
    entry = cache.put(KEY, {"kernel.so": b"\x7fELF"})
    manifest = json.loads((entry.path / "manifest.json").read_text())
    manifest["files"][str(secret)] = hashlib.sha256(b"not yours").hexdigest()
    (entry.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(KernelCacheWarning, match="not a plain file name"):
        assert cache.get(KEY) is None
    assert secret.is_file()


def test_a_symlinked_file_in_an_entry_is_refused(cache, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"\x7fELF")
    entry = cache.put(KEY, {"kernel.so": b"\x7fELF"})
    entry.file("kernel.so").unlink()
    entry.file("kernel.so").symlink_to(secret)  # same bytes, so the hash would match
    with pytest.warns(KernelCacheWarning, match="not a regular file"):
        assert cache.get(KEY) is None


@pytest.mark.parametrize("manifest", [
    [1, 2], {"key": KEY}, {"key": KEY, "files": ["kernel.so"]},
    {"key": KEY, "files": {"kernel.so": "abc"}}, {"key": KEY, "files": {}, "meta": 3},
])
def test_malformed_manifests_are_refused(cache, tmp_path, manifest):
    bundle = _archive(tmp_path / "m.tar.gz", _entry(KEY, {"kernel.so": b"x"}, manifest))
    with pytest.warns(KernelCacheWarning, match="refused"):
        assert cache.import_(bundle) == 0


def test_a_deeply_nested_manifest_is_refused_not_a_recursion_error(cache, tmp_path):
    blob = b'{"key": "' + KEY.encode() + b'", "files": {}, "meta": ' + b"[" * 100_000 + \
        b"]" * 100_000 + b"}"
    members = [(_info(f"{KEY[:2]}/{KEY}/manifest.json", len(blob)), blob)]
    with pytest.warns(KernelCacheWarning, match="nested too deeply"):
        assert cache.import_(_archive(tmp_path / "deep.tar.gz", members)) == 0


# -- item: unsafe members refuse the whole file --------------------------------------------

def _unsafe(tmp_path: Path) -> dict[str, list]:
    where = f"{KEY[:2]}/{KEY}"
    outside = str(tmp_path / "planted")
    return {
        "dotdot": [(_info(f"{where}/../../../planted", 3), b"bad")],
        "dotdot-inside": [(_info(f"{where}/../{KEY}/kernel.so", 3), b"bad")],
        "absolute": [(_info(f"/{where}/kernel.so", 3), b"bad")],
        "absolute-outside": [(_info(outside, 3), b"bad")],
        "symlink-out": [(_info(f"{where}/kernel.so", kind=tarfile.SYMTYPE,
                               linkname=outside), None)],
        "symlink-in": [(_info(f"{where}/kernel.so", kind=tarfile.SYMTYPE,
                              linkname="kernel.cu"), None)],
        "hardlink": [(_info(f"{where}/kernel.so", kind=tarfile.LNKTYPE,
                            linkname="/etc/passwd"), None)],
        "hardlink-in": [(_info(f"{where}/kernel.cu", 3), b"src"),
                        (_info(f"{where}/kernel.so", kind=tarfile.LNKTYPE,
                               linkname=f"{where}/kernel.cu"), None)],
        "char-device": [(_info(f"{where}/null", kind=tarfile.CHRTYPE, devmajor=1,
                               devminor=3), None)],
        "block-device": [(_info(f"{where}/sda", kind=tarfile.BLKTYPE, devmajor=8), None)],
        "fifo": [(_info(f"{where}/pipe", kind=tarfile.FIFOTYPE), None)],
        "folder-as-file": [(_info(f"{where}/sub", kind=tarfile.DIRTYPE), None)],
        "nested": [(_info(f"{where}/sub/kernel.so", 3), b"bad")],
        "not-a-key": [(_info("ab/not-a-key/kernel.so", 3), b"bad")],
        "wrong-prefix": [(_info(f"zz/{KEY}/kernel.so", 3), b"bad")],
        "top-level-file": [(_info("README", 3), b"bad")],
        "duplicate": [(_info(f"{where}/kernel.so", 3), b"one"),
                      (_info(f"{where}/kernel.so", 3), b"two")],
    }


@pytest.mark.parametrize("case", sorted(_unsafe(Path("/x"))))
def test_unsafe_members_refuse_the_whole_file(cache, tmp_path, case):
    members = _good(OTHER) + _unsafe(tmp_path)[case] + _good(KEY)
    bundle = _archive(tmp_path / "evil.tar.gz", members)
    with pytest.raises(pl.PycLabError, match="refusing the whole file") as info:
        cache.import_(bundle)
    assert str(bundle) in str(info.value) and "\n" not in str(info.value)
    assert cache.keys() == [], "a refused file adds nothing, not even its sound entries"
    assert not (tmp_path / "planted").exists()
    assert _leftovers(cache) == []


def test_the_cli_refuses_an_unsafe_archive_in_one_line(tmp_path, monkeypatch, capsys):
    from pyc_lab.cli import main

    monkeypatch.setenv("PYC_LAB_CACHE_DIR", str(tmp_path / "cache"))
    bundle = _archive(tmp_path / "evil.tar.gz", _unsafe(tmp_path)["symlink-out"])
    assert main(["cache", "import", str(bundle)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyc-lab: error: ") and "unsafe member" in err
    assert "is a link to an absolute path" in err
    assert err.count("\n") == 1 and "Traceback" not in err


# -- item: caps on sizes and counts ---------------------------------------------------------

def test_a_member_over_its_cap_is_refused_before_it_is_read(cache, tmp_path):
    where = f"{KEY[:2]}/{KEY}"
    path = tmp_path / "bomb.tar.gz"
    # a header declaring 1 TiB followed by 4 bytes: refused on the header, never read
    header = _info(f"{where}/kernel.so", 1 << 40).tobuf(tarfile.GNU_FORMAT)
    path.write_bytes(gzip.compress(header + b"\x7fELF"))
    with pytest.raises(pl.PycLabError, match=r"holds 1099511627776 bytes, over the 512 MiB "
                                             r"allowed per member \(ImportLimits\."
                                             r"max_member_bytes\)"):
        cache.import_(path)
    assert _leftovers(cache) == []


@pytest.mark.parametrize(("limits", "message"), [
    (ImportLimits(max_member_bytes=1000), r"holds 1500 bytes, over the 1000 bytes allowed "
                                          r"per member \(ImportLimits\.max_member_bytes\)"),
    (ImportLimits(max_manifest_bytes=100), r"allowed per manifest \(ImportLimits\.max_manifest"),
    (ImportLimits(max_total_bytes=2500), r"more than 2500 bytes of files \(ImportLimits\."
                                         r"max_total_bytes\)"),
    (ImportLimits(max_members=5), r"more than 5 members \(ImportLimits\.max_members\)"),
])
def test_caps_on_sizes_and_counts(cache, tmp_path, limits, message):
    members = _entry(KEY, {"kernel.so": b"x" * 1500}) + _entry(OTHER, {"kernel.so": b"y" * 900})
    bundle = _archive(tmp_path / "b.tar.gz", members)
    assert KernelCache(tmp_path / "roomy").import_(bundle) == 2
    with pytest.raises(pl.PycLabError, match=message):
        cache.import_(bundle, limits=limits)
    assert cache.keys() == [] and _leftovers(cache) == []


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_a_huge_header_is_stopped_while_it_is_read(cache, tmp_path, fmt):
    name = f"{KEY[:2]}/{KEY}/" + "k" * 200_000  # a pax record or a GNU long name
    info = _info(name, 1)
    if fmt == tarfile.PAX_FORMAT:
        info.pax_headers = {"comment": "x" * 300_000}
    bundle = _archive(tmp_path / "h.tar.gz", [(info, b"x")], fmt=fmt)
    tracemalloc.start()
    try:
        with pytest.raises(pl.PycLabError, match=r"a tar header .* is larger than "
                                                 r"65536 bytes \(ImportLimits\.max_header"):
            cache.import_(bundle, limits=ImportLimits(max_header_bytes=65536))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_a_decompression_bomb_streams_to_disk_in_flat_memory(cache, tmp_path):
    """64 MiB of zeros compress to about 64 KiB; importing it must not hold it in memory
    (the whole-member reads this replaces took 214 MiB for a 199 KiB archive)."""
    size = 64 << 20
    zeros = hashlib.sha256()
    chunk = bytes(1 << 20)
    for _ in range(size >> 20):
        zeros.update(chunk)
    manifest = {"key": KEY, "meta": {}, "files": {"kernel.so": zeros.hexdigest()}}
    blob = json.dumps(manifest).encode()
    path = tmp_path / "bomb.tar.gz"

    class Zeros(io.RawIOBase):
        left = size

        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:
            n = min(len(buffer), self.left)
            buffer[:n] = bytes(n)
            self.left -= n
            return n

    with tarfile.open(path, "w:gz", compresslevel=6) as tar:
        tar.addfile(_info(f"{KEY[:2]}/{KEY}/kernel.so", size), io.BufferedReader(Zeros()))
        tar.addfile(_info(f"{KEY[:2]}/{KEY}/manifest.json", len(blob)), io.BytesIO(blob))
    assert path.stat().st_size < 128 << 10
    tracemalloc.start()
    try:
        assert cache.import_(path) == 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak / 2**20:.0f} MiB: the archive was read into memory"
    assert cache.get(KEY).file("kernel.so").stat().st_size == size
    with pytest.raises(pl.PycLabError, match=r"ImportLimits\.max_member_bytes"):
        KernelCache(tmp_path / "small").import_(path, limits=ImportLimits(
            max_member_bytes=32 << 20))


def test_damaged_or_foreign_files_are_clear_errors(cache, tmp_path):
    good = _archive(tmp_path / "good.tar.gz", _good())
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    plain = tmp_path / "plain.tar"
    with tarfile.open(plain, "w") as tar:
        tar.addfile(_info("x", 1), io.BytesIO(b"x"))
    empty = tmp_path / "empty.tar.gz"
    empty.write_bytes(b"")
    for bad in (truncated, plain, empty, tmp_path):
        with pytest.raises(pl.PycLabError, match=r"not a kernel-cache export|not a file"):
            cache.import_(bad)
    assert cache.keys() == [] and _leftovers(cache) == []
    with pytest.raises(pl.PycLabError, match="max_members must be a positive integer"):
        ImportLimits(max_members=0)


# -- nothing is lost: one bad entry never costs the others ----------------------------------

def test_one_bad_entry_does_not_take_down_the_rest(cache, tmp_path):
    third = cache_key("__global__ void third() {}", "sm_90a", TOOLS)
    tampered = _entry(OTHER, {"kernel.so": b"\x7fELF"},
                      {"key": OTHER, "meta": {}, "files": {"kernel.so": "0" * 64}})
    stray = _good(third)[:-1]  # no manifest
    bundle = _archive(tmp_path / "mixed.tar.gz", _good(KEY) + tampered + stray)
    with pytest.warns(KernelCacheWarning) as caught:
        assert cache.import_(bundle) == 1
    text = " ".join(str(w.message) for w in caught)
    assert "does not match its recorded SHA-256" in text and "has no manifest" in text
    assert cache.keys() == [KEY] and cache.get(KEY) is not None
    assert any((cache.root / "quarantine").iterdir())


def test_an_import_sets_a_damaged_local_copy_aside_instead_of_deleting_it(cache, tmp_path):
    entry = cache.put(KEY, {"kernel.so": b"\x7fELF" + KEY.encode(), "kernel.cu": b"// src"})
    entry.file("kernel.cu").write_bytes(b"// damaged")
    with pytest.warns(KernelCacheWarning, match="replaced by an intact imported copy"):
        assert cache.import_(_archive(tmp_path / "g.tar.gz", _good(KEY))) == 1
    assert cache.get(KEY).file("kernel.cu").read_bytes() == b"// src"
    kept = [p for p in (cache.root / "quarantine").iterdir()]
    assert len(kept) == 1 and (kept[0] / "kernel.cu").read_bytes() == b"// damaged"


def test_keys_ignore_half_written_folders(cache):
    cache.put(KEY, {"kernel.so": b"x"})
    staging = cache.root / KEY[:2] / f".{KEY[:8]}-tmp"
    staging.mkdir()
    (staging / "manifest.json").write_text("{}")
    assert cache.keys() == [KEY]


# -- read-only caches, missing folders -------------------------------------------------------

def test_a_tampered_entry_in_a_cache_that_cannot_be_moved_is_refused_not_raised(
        cache, monkeypatch):
    entry = cache.put(KEY, {"kernel.so": b"\x7fELF"})
    entry.file("kernel.so").write_bytes(b"\x7fELF tampered")

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache_module.shutil, "move", read_only)
    with pytest.warns(KernelCacheWarning, match="could not be moved .* stays in place"):
        assert cache.get(KEY) is None
    assert entry.file("kernel.so").is_file()  # left where it was, and still refused
    with pytest.warns(KernelCacheWarning):
        assert cache.get(KEY) is None


_CHILD = textwrap.dedent("""
    import json, sys, warnings
    from pathlib import Path
    from pyc_lab.kernels.cache import KernelCache, KernelCacheWarning
    from pyc_lab.errors import PycLabError

    root, key, bundle = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = KernelCache(root)
        out["intact"] = cache.get(sys.argv[4]) is not None
        out["tampered"] = cache.get(key)
    out["warnings"] = [str(w.message) for w in caught]
    for name, call in (("put", lambda: cache.put(key, {"x": b"1"})),
                       ("import", lambda: cache.import_(bundle))):
        try:
            call()
            out[name] = "no error"
        except PycLabError as exc:
            out[name] = str(exc)
    print(json.dumps(out))
""")


def test_a_read_only_cache_serves_intact_entries_and_refuses_tampered_ones(cache, tmp_path):
    """Really read-only (chmod, in a process the permission bits bind, also under root)."""
    cache.put(OTHER, {"kernel.so": b"\x7fELF other"})
    entry = cache.put(KEY, {"kernel.so": b"\x7fELF"})
    entry.file("kernel.so").write_bytes(b"\x7fELF tampered")
    bundle = _archive(tmp_path / "g.tar.gz", _good(cache_key("x", "sm_90a", TOOLS)))
    folders = [cache.root, *(p for p in cache.root.rglob("*") if p.is_dir())]
    for folder in folders:
        folder.chmod(0o555)
    try:
        run = run_read_only_child(_CHILD, str(cache.root), KEY, str(bundle), OTHER)
    finally:
        for folder in folders:
            folder.chmod(0o755)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["intact"] is True and out["tampered"] is None
    assert any("stays in place and is ignored" in w for w in out["warnings"])
    assert "read-only" in out["put"] and "read-only" in out["import"]
    assert entry.file("kernel.so").read_bytes() == b"\x7fELF tampered"  # nothing moved


def test_exporting_into_a_missing_folder_is_one_clear_error(cache, tmp_path):
    cache.put(KEY, {"kernel.so": b"x"})
    with pytest.raises(pl.PycLabError, match="does not exist; create it first"):
        cache.export(tmp_path / "missing" / "k.tar.gz")
    target = tmp_path / "k.tar.gz"
    target.write_bytes(b"an earlier export")
    assert cache.export(target) == 1  # replaced whole, nothing partial left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.tar.gz", "kernels"]


def test_a_cache_folder_under_a_file_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(pl.PycLabError, match="cannot create the kernel cache folder"):
        KernelCache(tmp_path / "file" / "kernels")
    assert os.path.isfile(tmp_path / "file")


def test_an_export_into_a_pipe_is_written_in_place(cache, tmp_path):
    import threading

    cache.put(KEY, {"kernel.so": b"x"})
    pipe = tmp_path / "out.tar.gz"
    os.mkfifo(pipe)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()), daemon=True)
    reader.start()
    assert cache.export(pipe) == 1
    reader.join(timeout=30)
    assert pipe.is_fifo() and got and got[0][:2] == b"\x1f\x8b"  # gzip, through the pipe
