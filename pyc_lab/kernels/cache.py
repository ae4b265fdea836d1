"""A content-addressed on-disk cache of built kernels, verified by hash before use.

An entry is everything one build produced (device code, a host library, the emitted
source) under a key that hashes what determines the build: the emitted source, the GPU
architecture and the toolchain versions (nvcc, CUTLASS). Each entry has a manifest with
the SHA-256 of every file; :meth:`KernelCache.get` checks them before handing out a path,
and a file that does not match is refused: the entry is quarantined and the caller
rebuilds. The whole cache exports to one ``.tar.gz`` and imports on another machine,
with the same checks.

An export may come from anyone, so an import trusts nothing in it: every member must be
a regular file at ``<xx>/<key>/<plain name>`` (checked with :func:`tarfile.data_filter`
as well as against that layout), every manifest may only name plain files of its own
entry, and the archive is streamed to disk under the caps of :class:`ImportLimits`, so
that a decompression bomb, a million members or a huge header fail fast instead of
filling the memory or the disk.

The cache lives in the user cache directory (:func:`pyc_lab.paths.cache_dir`), never in
the working directory.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import shutil
import stat
import tarfile
import tempfile
import time
import warnings
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import PycLabError
from ..paths import cache_dir, replacing

__all__ = ["CacheEntry", "ImportLimits", "KernelCache", "KernelCacheWarning", "cache_key"]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"

_HEX = frozenset("0123456789abcdef")
_MIB = 1 << 20
#: A manifest on disk larger than this is refused unread (a real one is a few KiB).
_MAX_MANIFEST_ON_DISK = _MIB
_CHUNK = 1 << 16


class KernelCacheWarning(UserWarning):
    """A cache entry was refused (tampered or incomplete) and set aside."""


@dataclass(frozen=True)
class ImportLimits:
    """Caps on what :meth:`KernelCache.import_` accepts from one archive.

    An archive may come from another machine or another person; these caps make a
    broken or hostile one (a decompression bomb, a flood of members, a huge header) fail
    at once with an error naming the cap, instead of filling the memory or the disk.
    The defaults are far above what an export of real kernels holds (a built kernel is
    a few MiB, a manifest a few KiB).

    Attributes
    ----------
    max_member_bytes
        The largest file (512 MiB).
    max_total_bytes
        The most bytes of all files together (16 GiB).
    max_members
        The most members, files and folders (100 000).
    max_manifest_bytes
        The largest manifest (1 MiB).
    max_header_bytes
        The most tar header bytes (long names, pax records) before one member (1 MiB).
    """

    max_member_bytes: int = 512 * _MIB
    max_total_bytes: int = 16 * 1024 * _MIB
    max_members: int = 100_000
    max_manifest_bytes: int = _MIB
    max_header_bytes: int = _MIB

    def __post_init__(self) -> None:
        for name in ("max_member_bytes", "max_total_bytes", "max_members",
                     "max_manifest_bytes", "max_header_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise PycLabError(f"ImportLimits.{name} must be a positive integer, "
                                  f"got {value!r}")


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


def _is_key(text: object) -> bool:
    return isinstance(text, str) and len(text) == 64 and set(text) <= _HEX


def _name_problem(name: object) -> str:
    """Why ``name`` is not a plain file name of an entry (``""`` when it is one).

    A plain name has no folder part, so ``<entry folder>/<name>`` stays inside the entry
    whatever the name says: no ``/``, ``\\``, NUL, ``.`` or ``..``, and not the manifest.
    """
    if not isinstance(name, str):
        return f"file name {name!r} is not a string"
    if (name in ("", ".", "..", MANIFEST) or PurePosixPath(name).name != name
            or any(c in name for c in "/\\\x00") or len(name) > 255):
        return f"file name {name!r} is not a plain file name inside the entry"
    return ""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def _mib(n: int) -> str:
    """A byte count for a message: ``16 GiB``, ``512 MiB`` or ``1000 bytes``."""
    if n >= 1024 * _MIB:
        return f"{n / (1024 * _MIB):g} GiB"
    return f"{n / _MIB:g} MiB" if n >= _MIB else f"{n} bytes"


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


class _BoundedReader:
    """The decompressed bytes of an archive, read within a moving budget.

    :mod:`tarfile` reads headers (long names, pax records) whole into memory before
    the importer sees a member; the budget (what the importer allows before the next
    member: its data and at most one header's worth) stops a huge header, or a stream
    longer than its members declare, while it is being read. Errors of the compressed
    stream itself become a :class:`PycLabError` naming the file.
    """

    def __init__(self, raw: Any, path: Path, limit: int, why: str) -> None:
        self._raw = raw
        self._path = path
        self.pos = 0
        self.limit = limit
        self.why = why

    def allow(self, n: int, why: str) -> None:
        """Let ``n`` more bytes be read from here; past them the import fails with ``why``."""
        self.limit = self.pos + n
        self.why = why

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > self.limit - self.pos + 1:
            size = self.limit - self.pos + 1
        try:
            data = self._raw.read(size)
        except (OSError, EOFError, zlib.error) as exc:
            raise PycLabError(f"{self._path} is not a kernel-cache export or is damaged "
                              f"({exc}); make one with KernelCache.export()") from None
        self.pos += len(data)
        if self.pos > self.limit:
            raise PycLabError(f"{self._path}: {self.why}; refusing the whole file")
        return data


class KernelCache:
    """Built kernels on disk, addressed by :func:`cache_key`, checked on every read.

    Parameters
    ----------
    root
        Cache folder; ``<user cache dir>/pyc_lab/kernels`` by default. It is created when
        missing; an existing read-only folder serves verified entries but cannot take
        new ones.

    Raises
    ------
    PycLabError
        If the folder is missing and cannot be created.
    """

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_dir("kernels", create=False)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PycLabError(f"cannot create the kernel cache folder {self.root} "
                              f"({exc.strerror or exc}); pass root= a writable folder or "
                              "set PYC_LAB_CACHE_DIR") from None
        self.stats = {"hits": 0, "misses": 0, "refused": 0}

    def _dir(self, key: str) -> Path:
        if not _is_key(key):
            raise PycLabError(f"not a cache key: {key!r} (expected 64 hex digits from "
                              "cache_key())")
        return self.root / key[:2] / key

    def _staging(self, parent: Path, prefix: str) -> Path:
        """A fresh private folder under ``parent`` (same file system: renames are atomic)."""
        try:
            parent.mkdir(parents=True, exist_ok=True)
            return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        except OSError as exc:
            raise PycLabError(f"cannot write to the kernel cache {self.root} "
                              f"({exc.strerror or exc}); is it read-only? Pass root= a "
                              "writable folder or set PYC_LAB_CACHE_DIR") from None

    # -- writing ---------------------------------------------------------------------------
    def put(self, key: str, files: Mapping[str, bytes | str | Path],
            meta: Mapping[str, Any] | None = None) -> CacheEntry:
        """Store a build atomically; returns the verified entry.

        ``files`` maps a plain file name to its bytes, text or a path to copy.

        Raises
        ------
        PycLabError
            For a bad key or file name, or when the cache cannot be written.
        """
        target = self._dir(key)
        for name in files:
            if _name_problem(name):
                raise PycLabError(f"cache file names must be plain names, got {name!r}")
        staging = self._staging(target.parent, f".{key[:8]}-")
        try:
            digests = {}
            for name, content in files.items():
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
        except OSError as exc:
            raise PycLabError(f"cannot store kernel cache entry {key[:12]} in {self.root} "
                              f"({exc})") from None
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        entry = self.get(key)
        if entry is None:  # pragma: no cover - replaced by another process meanwhile
            raise PycLabError(f"kernel cache entry {key[:12]} vanished right after it was "
                              "stored (another process cleared the cache?); try again")
        return entry

    # -- reading ---------------------------------------------------------------------------
    def get(self, key: str) -> CacheEntry | None:
        """The entry for ``key`` if present and intact, else ``None``.

        A present entry whose files do not match its manifest, or whose manifest names a
        file outside the entry, is refused: it is moved to ``<root>/quarantine`` with a
        :class:`KernelCacheWarning` (left in place, and ignored, when the cache is
        read-only), and ``None`` comes back so that the caller rebuilds.
        """
        folder = self._dir(key)
        if not (folder / MANIFEST).is_file():
            self.stats["misses"] += 1
            return None
        problem, manifest = self._verify(folder, key)
        if problem:
            self._quarantine(folder, problem)
            self.stats["refused"] += 1
            self.stats["misses"] += 1
            return None
        self.stats["hits"] += 1
        return CacheEntry(key, folder, {n: folder / n for n in manifest["files"]},
                          manifest.get("meta", {}))

    @staticmethod
    def _read_manifest(folder: Path, max_bytes: int) -> tuple[str, dict[str, Any]]:
        """The manifest of ``folder`` as ``("", data)``, or ``(why not, {})``."""
        path = folder / MANIFEST
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                return "the manifest is not a regular file", {}
            if st.st_size > max_bytes:
                return f"the manifest is larger than {_mib(max_bytes)}", {}
            data = json.loads(path.read_bytes().decode("utf-8"))
        except RecursionError:
            return "unreadable manifest (nested too deeply)", {}
        except (OSError, ValueError) as exc:
            return f"unreadable manifest ({exc})", {}
        if not isinstance(data, dict):
            return "the manifest is not a JSON object", {}
        return "", data

    @classmethod
    def _verify(cls, folder: Path, key: str) -> tuple[str, dict[str, Any]]:
        """Check an entry folder against its manifest.

        Returns ``("", manifest)`` when intact, else why not and ``{}``. Every name the
        manifest gives must be a plain file name (so that it cannot point outside the
        folder) of a regular file (not a link) with the recorded SHA-256, and the folder
        may hold nothing else.
        """
        problem, manifest = cls._read_manifest(folder, _MAX_MANIFEST_ON_DISK)
        if problem:
            return problem, {}
        if manifest.get("key") != key:
            return f"manifest names key {str(manifest.get('key'))[:12]}, not {key[:12]}", {}
        files = manifest.get("files")
        if not isinstance(files, dict):
            return "the manifest has no 'files' object", {}
        if not isinstance(manifest.get("meta", {}), dict):
            return "the manifest's 'meta' is not an object", {}
        for name, digest in files.items():
            problem = _name_problem(name)
            if problem:
                return f"the manifest's {problem}", {}
            if not (isinstance(digest, str) and len(digest) == 64 and set(digest) <= _HEX):
                return f"the manifest's SHA-256 of {name} is not 64 hex digits", {}
            path = folder / name
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                return f"file {name} is missing", {}
            except OSError as exc:
                return f"file {name} cannot be read ({exc})", {}
            if not stat.S_ISREG(mode):
                return f"file {name} is not a regular file (a link or a special file)", {}
            try:
                actual = _sha256(path)
            except OSError as exc:
                return f"file {name} cannot be read ({exc})", {}
            if actual != digest:
                return (f"file {name} does not match its recorded SHA-256 (tampered or "
                        "corrupt)"), {}
        try:
            extra = {p.name for p in folder.iterdir()} - set(files) - {MANIFEST}
        except OSError as exc:
            return f"the entry folder cannot be listed ({exc})", {}
        if extra:
            return f"unexpected files {sorted(extra)}", {}
        return "", manifest

    def _quarantine(self, folder: Path, problem: str) -> None:
        """Move a refused entry aside, with a log record and a warning.

        On a read-only cache the entry cannot be moved: it stays where it is, refused
        again by every :meth:`get`, and the warning says so.
        """
        dest_root = self.root / "quarantine"
        dest = dest_root / f"{folder.name}-{int(time.time() * 1e6)}"
        try:
            dest_root.mkdir(exist_ok=True)
            shutil.move(str(folder), dest)
        except OSError as exc:
            message = (f"kernel cache entry {folder.name[:12]} refused: {problem}; it could "
                       f"not be moved to {dest_root} ({exc.strerror or exc}: read-only "
                       "cache?), so it stays in place and is ignored")
        else:
            message = (f"kernel cache entry {folder.name[:12]} refused: {problem}; moved to "
                       f"{dest}")
        log.warning(message)
        warnings.warn(message, KernelCacheWarning, stacklevel=3)

    def keys(self) -> list[str]:
        """Keys of the entries present (not verified; :meth:`get` verifies)."""
        return sorted(p.parent.name for p in self.root.glob("??/*/" + MANIFEST)
                      if _is_key(p.parent.name) and p.parent.parent.name == p.parent.name[:2])

    def __len__(self) -> int:
        return len(self.keys())

    def clear(self) -> None:
        """Remove every entry (and the quarantine)."""
        for child in self.root.iterdir():
            if child.is_dir():
                shutil.rmtree(child)

    # -- moving between machines -------------------------------------------------------------
    def export(self, path: str | Path) -> int:
        """Write every intact entry into one ``.tar.gz``; returns how many.

        The file is written beside its final name and renamed into place, so a failed
        export never leaves a truncated archive (or destroys an earlier one); a link is
        followed, and a target that is not a regular file (a pipe, ``/dev/stdout``) is
        written directly.

        Raises
        ------
        PycLabError
            If the folder of ``path`` does not exist or cannot be written.
        """
        n = 0
        with replacing(path, "export the kernel cache") as out, tarfile.open(out, "w:gz") as tar:
            for key in self.keys():
                entry = self.get(key)
                if entry is None:
                    continue
                tar.add(entry.path, arcname=f"{key[:2]}/{key}")
                n += 1
        return n

    def import_(self, path: str | Path, *, limits: ImportLimits | None = None) -> int:
        """Add the entries of an exported file; each is verified as it lands.

        The archive is streamed into a private folder of the cache, member by member,
        under ``limits``. Every member must be a regular file at ``<xx>/<key>/<name>``
        (:func:`tarfile.data_filter` refuses absolute names, ``..``, links and device
        files; the layout refuses anything else); one that is not, a duplicate, or a cap
        exceeded refuses the whole file before any entry is added. Then each entry is
        verified against its manifest: a bad entry is quarantined with a
        :class:`KernelCacheWarning` and the others are added.

        Parameters
        ----------
        path
            A ``.tar.gz`` written by :meth:`export`.
        limits
            Caps on sizes and counts; :class:`ImportLimits` () by default.

        Returns
        -------
        int
            The number of entries added (an entry already here and intact is not).

        Raises
        ------
        PycLabError
            If the file is not an export, is unsafe or too large, or the cache is
            read-only; nothing is added then.
        """
        limits = limits if limits is not None else ImportLimits()
        if getattr(tarfile, "data_filter", None) is None:  # pragma: no cover - old Python
            raise PycLabError("importing a kernel cache needs tarfile's extraction filters "
                              "(Python 3.10.12+, 3.11.4+ or 3.12+); upgrade Python")
        path = Path(path)
        if not path.is_file():
            raise PycLabError(f"{path} does not exist or is not a file; make a kernel-cache "
                              "export with KernelCache.export()")
        staging = self._staging(self.root, ".import-")
        try:
            keys = self._unpack(path, staging, limits)
            added = 0
            for key in keys:
                if self._adopt(key, staging / key[:2] / key):
                    added += 1
            return added
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _unpack(self, path: Path, staging: Path, limits: ImportLimits) -> list[str]:
        """Stream the archive's files into ``staging``; returns the keys, in order.

        Raises :class:`PycLabError` for the first member that is unsafe, out of the
        layout, duplicated or over a cap.
        """
        # tarfile reads ahead by up to one record: every budget allows for it.
        header = limits.max_header_bytes + tarfile.RECORDSIZE
        header_why = (f"a tar header (long name or pax records) is larger than "
                      f"{_mib(limits.max_header_bytes)} (ImportLimits.max_header_bytes)")
        keys: dict[str, None] = {}
        seen: set[tuple[str, str]] = set()
        total = 0
        try:
            with gzip.open(path, "rb") as raw:
                reader = _BoundedReader(raw, path, header, header_why)
                with tarfile.open(fileobj=reader, mode="r|") as tar:
                    for count, member in enumerate(iter(tar.next, None), start=1):
                        if count > limits.max_members:
                            raise PycLabError(
                                f"{path} has more than {limits.max_members} members "
                                "(ImportLimits.max_members); refusing the whole file")
                        key, name = self._check_member(path, member, staging)
                        if name:
                            total += self._check_size(path, member, name, total, limits)
                            if (key, name) in seen:
                                raise PycLabError(f"{path}: member {member.name!r} appears "
                                                  "twice; refusing the whole file")
                            seen.add((key, name))
                            keys[key] = None
                            reader.allow(member.size + header, header_why)
                            self._extract(tar, member, staging, path)
                        else:  # a folder: made as its files land
                            reader.allow(header, header_why)
        except tarfile.TarError as exc:
            raise PycLabError(f"{path} is not a kernel-cache export or is damaged ({exc}); "
                              "make one with KernelCache.export()") from None
        return list(keys)

    @staticmethod
    def _check_size(path: Path, member: tarfile.TarInfo, name: str, total: int,
                    limits: ImportLimits) -> int:
        """The member's size, once it is within its cap and the total's."""
        what = "manifest" if name == MANIFEST else "member"
        cap = getattr(limits, f"max_{what}_bytes")
        if member.size > cap:
            raise PycLabError(f"{path}: member {member.name!r} holds {member.size} bytes, over "
                              f"the {_mib(cap)} allowed per {what} "
                              f"(ImportLimits.max_{what}_bytes); refusing the whole file")
        if total + member.size > limits.max_total_bytes:
            raise PycLabError(f"{path} holds more than {_mib(limits.max_total_bytes)} of files "
                              "(ImportLimits.max_total_bytes); refusing the whole file")
        return member.size

    def _extract(self, tar: tarfile.TarFile, member: tarfile.TarInfo, staging: Path,
                 path: Path) -> None:
        """Stream one checked member to disk with tarfile's ``"data"`` filter."""
        try:
            tar.extract(member, staging, set_attrs=False, filter="data")
        except OSError as exc:
            raise PycLabError(f"cannot unpack {member.name!r} of {path} into {self.root} "
                              f"({exc})") from None

    @staticmethod
    def _check_member(path: Path, member: tarfile.TarInfo, staging: Path) -> tuple[str, str]:
        """``(key, file name)`` of a safe member, ``(key or "", "")`` for a folder.

        :func:`tarfile.data_filter` refuses what could land outside ``staging`` (absolute
        names, ``..``, links pointing out) and device files; the layout refuses the rest:
        only folders ``<xx>`` or ``<xx>/<key>`` and regular files ``<xx>/<key>/<name>``.
        """
        try:
            tarfile.data_filter(member, str(staging))
        except tarfile.FilterError as exc:
            raise PycLabError(f"{path}: unsafe member {member.name!r} ({exc}); refusing the "
                              "whole file") from None
        raw_parts = member.name.split("/")
        parts = PurePosixPath(member.name).parts
        kind = ("a folder" if member.isdir() else "a regular file" if member.isreg()
                else "a symbolic link" if member.issym() else "a hard link" if member.islnk()
                else "a device file or FIFO")
        layout_ok = (not member.name.startswith("/") and ".." not in raw_parts
                     and 1 <= len(parts) <= 3 and len(parts[0]) == 2 and set(parts[0]) <= _HEX
                     and (len(parts) == 1 or (_is_key(parts[1]) and parts[1][:2] == parts[0])))
        if layout_ok and member.isdir() and len(parts) <= 2:
            return "", ""
        if not layout_ok or len(parts) != 3 or not member.isreg():
            raise PycLabError(f"{path}: unexpected member {member.name!r} ({kind}); an "
                              "export holds only regular files <xx>/<key>/<name>; refusing "
                              "the whole file")
        problem = "" if parts[2] == MANIFEST else _name_problem(parts[2])
        if problem:
            raise PycLabError(f"{path}: unexpected member {member.name!r}: {problem}; "
                              "refusing the whole file")
        return parts[1], parts[2]

    def _adopt(self, key: str, staged: Path) -> bool:
        """Move a staged entry into the cache if it verifies; ``True`` when added."""
        folder = self._dir(key)
        if (folder / MANIFEST).is_file() and not self._verify(folder, key)[0]:
            return False  # already here and intact
        if not (staged / MANIFEST).is_file():
            message = f"imported entry {key[:12]} has no manifest; skipped"
            log.warning(message)
            warnings.warn(message, KernelCacheWarning, stacklevel=4)
            return False
        problem, _ = self._verify(staged, key)
        if problem:
            self._quarantine(staged, f"imported entry {key[:12]}: {problem}")
            return False
        if folder.exists():  # a damaged copy: set aside, never silently deleted
            self._quarantine(folder, "replaced by an intact imported copy")
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            staged.rename(folder)
        except OSError as exc:
            if (folder / MANIFEST).is_file() and not self._verify(folder, key)[0]:
                return False  # another process imported it meanwhile
            raise PycLabError(f"cannot add kernel cache entry {key[:12]} to {self.root} "
                              f"({exc})") from None
        return True

    def size_bytes(self) -> int:
        """Bytes used by the entries."""
        return sum(p.stat().st_size for p in self.root.glob("??/*/*") if p.is_file())
