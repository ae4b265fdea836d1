"""A content-addressed on-disk cache of built kernels, verified by hash before use.

An entry is everything one build produced (device code, a host library, the emitted
source) under a key that hashes what determines the build: the emitted source, the GPU
architecture and the toolchain versions (nvcc, CUTLASS). Each entry has a manifest with
the SHA-256 of every file; :meth:`KernelCache.get` checks them before handing out a path,
and a file that does not match is refused: the entry is quarantined and the caller
rebuilds. The whole cache exports to one ``.tar.gz`` and imports on another machine,
with the same checks.

The cache lives in the user cache directory (:func:`pyc_lab.paths.cache_dir`), never in
the working directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tarfile
import tempfile
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import PycLabError
from ..paths import cache_dir

__all__ = ["CacheEntry", "KernelCache", "KernelCacheWarning", "cache_key"]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


class KernelCacheWarning(UserWarning):
    """A cache entry was refused (tampered or incomplete) and set aside."""


def cache_key(source: str, arch: str, toolchain: Mapping[str, str]) -> str:
    """The key of a build: SHA-256 over the emitted source, the arch and the toolchain.

    Parameters
    ----------
    source
        The emitted source text (CUDA C++) of the kernel.
    arch
        Target architecture, e.g. ``"sm_90a"``.
    toolchain
        Versions that change the binary, e.g. ``{"nvcc": "13.0.88", "cutlass": "4.2.0"}``.
    """
    blob = json.dumps({"source_sha256": hashlib.sha256(source.encode()).hexdigest(),
                       "arch": arch, "toolchain": dict(sorted(toolchain.items()))},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """A verified entry: its key, folder, files and metadata."""

    key: str
    path: Path
    files: dict[str, Path]
    meta: dict[str, Any]

    def file(self, name: str) -> Path:
        """Path of one of the entry's files (verified when the entry was fetched)."""
        try:
            return self.files[name]
        except KeyError:
            raise PycLabError(f"cache entry {self.key[:12]} has no file {name!r}; it has "
                              f"{sorted(self.files)}") from None


class KernelCache:
    """Built kernels on disk, addressed by :func:`cache_key`, checked on every read.

    Parameters
    ----------
    root
        Cache folder; ``<user cache dir>/pyc_lab/kernels`` by default.
    """

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_dir("kernels")
        self.root.mkdir(parents=True, exist_ok=True)
        self.stats = {"hits": 0, "misses": 0, "refused": 0}

    def _dir(self, key: str) -> Path:
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise PycLabError(f"not a cache key: {key!r} (expected 64 hex digits from "
                              "cache_key())")
        return self.root / key[:2] / key

    # -- writing ---------------------------------------------------------------------------
    def put(self, key: str, files: Mapping[str, bytes | str | Path],
            meta: Mapping[str, Any] | None = None) -> CacheEntry:
        """Store a build atomically; returns the verified entry.

        ``files`` maps a plain file name to its bytes, text or a path to copy.
        """
        target = self._dir(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=target.parent))
        try:
            digests = {}
            for name, content in files.items():
                if PurePosixPath(name).name != name or name in ("", MANIFEST, ".", ".."):
                    raise PycLabError(f"cache file names must be plain names, got {name!r}")
                dest = staging / name
                if isinstance(content, Path):
                    shutil.copyfile(content, dest)
                else:
                    dest.write_bytes(content.encode() if isinstance(content, str) else content)
                digests[name] = _sha256(dest)
            manifest = {"key": key, "files": digests, "meta": dict(meta or {}),
                        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        entry = self.get(key)
        assert entry is not None
        return entry

    # -- reading ---------------------------------------------------------------------------
    def get(self, key: str) -> CacheEntry | None:
        """The entry for ``key`` if present and intact, else ``None``.

        A present entry whose files do not match its manifest is refused: it is moved to
        ``<root>/quarantine`` with a :class:`KernelCacheWarning`, and ``None`` comes back
        so that the caller rebuilds.
        """
        folder = self._dir(key)
        if not (folder / MANIFEST).is_file():
            self.stats["misses"] += 1
            return None
        problem = self._verify(folder, key)
        if problem:
            self._quarantine(folder, problem)
            self.stats["refused"] += 1
            self.stats["misses"] += 1
            return None
        manifest = json.loads((folder / MANIFEST).read_text())
        self.stats["hits"] += 1
        return CacheEntry(key, folder, {n: folder / n for n in manifest["files"]},
                          manifest.get("meta", {}))

    def _verify(self, folder: Path, key: str) -> str:
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
            files = manifest["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"unreadable manifest ({exc})"
        if manifest.get("key") != key:
            return f"manifest names key {str(manifest.get('key'))[:12]}, not {key[:12]}"
        for name, digest in files.items():
            path = folder / name
            if not path.is_file():
                return f"file {name} is missing"
            if _sha256(path) != digest:
                return f"file {name} does not match its recorded SHA-256 (tampered or corrupt)"
        extra = {p.name for p in folder.iterdir()} - set(files) - {MANIFEST}
        if extra:
            return f"unexpected files {sorted(extra)}"
        return ""

    def _quarantine(self, folder: Path, problem: str) -> None:
        dest_root = self.root / "quarantine"
        dest_root.mkdir(exist_ok=True)
        dest = dest_root / f"{folder.name}-{int(time.time() * 1e6)}"
        shutil.move(str(folder), dest)
        message = f"kernel cache entry {folder.name[:12]} refused: {problem}; moved to {dest}"
        log.warning(message)
        warnings.warn(message, KernelCacheWarning, stacklevel=3)

    def keys(self) -> list[str]:
        """Keys of the entries present (not verified; :meth:`get` verifies)."""
        return sorted(p.parent.name for p in self.root.glob("??/*/" + MANIFEST))

    def __len__(self) -> int:
        return len(self.keys())

    def clear(self) -> None:
        """Remove every entry (and the quarantine)."""
        for child in self.root.iterdir():
            if child.is_dir():
                shutil.rmtree(child)

    # -- moving between machines -------------------------------------------------------------
    def export(self, path: str | Path) -> int:
        """Write every intact entry into one ``.tar.gz``; returns how many."""
        n = 0
        with tarfile.open(path, "w:gz") as tar:
            for key in self.keys():
                entry = self.get(key)
                if entry is None:
                    continue
                tar.add(entry.path, arcname=f"{key[:2]}/{key}")
                n += 1
        return n

    def import_(self, path: str | Path) -> int:
        """Add the entries of an exported file; each is verified as it lands.

        Returns the number of entries added. Entries that fail verification are refused
        (quarantined, with a warning); members outside ``<xx>/<key>/<file>`` are refused
        outright.
        """
        added = 0
        try:
            tar = tarfile.open(path, "r:gz")  # noqa: SIM115 - closed by the with below
        except (OSError, tarfile.TarError) as exc:
            raise PycLabError(f"{path} is not a kernel-cache export ({exc}); make one with "
                              "KernelCache.export()") from None
        with tar:
            groups: dict[str, list[tarfile.TarInfo]] = {}
            for member in tar.getmembers():
                parts = PurePosixPath(member.name).parts
                if member.isdir() and len(parts) <= 2:
                    continue
                if (len(parts) != 3 or not member.isfile() or len(parts[1]) != 64
                        or parts[0] != parts[1][:2] or ".." in parts):
                    raise PycLabError(f"{path}: unexpected member {member.name!r}; refusing "
                                      "the whole file")
                groups.setdefault(parts[1], []).append(member)
            for key, members in groups.items():
                files = {}
                for m in members:
                    data = tar.extractfile(m)
                    assert data is not None
                    files[PurePosixPath(m.name).name] = data.read()
                manifest_bytes = files.pop(MANIFEST, None)
                if manifest_bytes is None:
                    warnings.warn(f"{path}: entry {key[:12]} has no manifest; skipped",
                                  KernelCacheWarning, stacklevel=2)
                    continue
                if self._import_entry(key, manifest_bytes, files):
                    added += 1
        return added

    def _import_entry(self, key: str, manifest_bytes: bytes, files: dict[str, bytes]) -> bool:
        folder = self._dir(key)
        if (folder / MANIFEST).is_file() and not self._verify(folder, key):
            return False  # already here and intact
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=folder.parent))
        for name, data in files.items():
            (staging / name).write_bytes(data)
        (staging / MANIFEST).write_bytes(manifest_bytes)
        problem = self._verify(staging, key)
        if problem:
            self._quarantine(staging, f"imported entry {key[:12]}: {problem}")
            return False
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
        return True

    def size_bytes(self) -> int:
        """Bytes used by the entries."""
        return sum(p.stat().st_size for p in self.root.glob("??/*/*") if p.is_file())

