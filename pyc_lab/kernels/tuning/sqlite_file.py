"""The tuning database's file: SQLite in WAL mode, checked, created or migrated, set
aside when damaged, and opened read-only when it cannot or must not be written.

:class:`SQLiteFile` owns the connection. Opening never loses data:

- a file that is not a SQLite database, fails ``PRAGMA integrity_check`` or holds a
  schema this version does not know is renamed ``<name>.corrupt-<UTC timestamp>`` beside
  it, with a :class:`~pyc_lab.kernels.tuning.keys.TuningDBWarning`, and a fresh database
  takes its place; corruption found later is handled the same way and the operation
  retried once;
- a file this process may not write (a read-only file or folder, a shared install) is
  opened read-only (``mode=ro``): lookups are served, and every write raises a
  :class:`~pyc_lab.kernels.tuning.keys.TuningDBError` that says so and where;
- a file with a *newer* schema version belongs to a newer pyc_lab: it is opened
  read-only with a warning, never set aside or changed;
- when none of that works (no folder can be made, a read-only file that is damaged) a
  private in-memory database is used, with a warning, and the file is left as it is.

Every call runs under one lock; every write is one ``BEGIN IMMEDIATE`` transaction that
waits (``busy_timeout``) for another process's writer.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import random
import sqlite3
import stat
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from .keys import _KEY_COLS, _VALUE_COLS, TuningDBError, TuningDBWarning

__all__ = ["SCHEMA_VERSION", "SQLiteFile"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: The schema version this module writes (``PRAGMA user_version``).
SCHEMA_VERSION = 2

_SQLITE_MAGIC = b"SQLite format 3\x00"
_BUSY_TIMEOUT_S = 30.0

_KEY_DDL = """
    gpu_name TEXT NOT NULL,
    compute_capability TEXT NOT NULL,
    driver TEXT NOT NULL,
    cuda TEXT NOT NULL,
    op TEXT NOT NULL,
    dtype_a TEXT NOT NULL,
    dtype_b TEXT NOT NULL,
    dtype_c TEXT NOT NULL,
    layout TEXT NOT NULL,
    m INTEGER NOT NULL,
    n INTEGER NOT NULL,
    k INTEGER NOT NULL"""

_KEY_LIST = ", ".join(_KEY_COLS)

_SCHEMA = [
    f"""CREATE TABLE measurements (
    id INTEGER PRIMARY KEY,{_KEY_DDL},
    config_id TEXT NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL,
    time_ms REAL,
    tflops REAL,
    error REAL,
    message TEXT NOT NULL DEFAULT '',
    run_id TEXT NOT NULL DEFAULT '',
    recorded_at TEXT NOT NULL,
    UNIQUE ({_KEY_LIST}, config_id, run_id)
)""",
    f"""CREATE TABLE winners ({_KEY_DDL},
    config_id TEXT NOT NULL,
    measurement_id INTEGER NOT NULL,
    source TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY ({_KEY_LIST})
)""",
]

#: One step per old version: the statements that bring version ``v`` to ``v + 1``.
#: Version 1 had no ``message`` column on ``measurements``.
_MIGRATIONS: dict[int, list[str]] = {
    1: ["ALTER TABLE measurements ADD COLUMN message TEXT NOT NULL DEFAULT ''"],
}

_REQUIRED_COLUMNS = {
    "measurements": {"id", *_KEY_COLS, *_VALUE_COLS},
    "winners": {*_KEY_COLS, "config_id", "measurement_id", "source", "updated_at"},
}

# SQLite primary result codes that mean busy, damaged or not writable.
_SQLITE_PERM = 3
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_READONLY = 8
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26
_CORRUPTION_HINTS = ("malformed", "not a database", "database corrupt")


def _code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _is_busy(exc: sqlite3.Error) -> bool:
    if _code(exc) in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return True
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _is_corruption(exc: sqlite3.Error) -> bool:
    if _code(exc) in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return True
    text = str(exc).lower()
    return any(h in text for h in _CORRUPTION_HINTS)


def _is_read_only(exc: sqlite3.Error) -> bool:
    return _code(exc) in (_SQLITE_READONLY, _SQLITE_PERM) or "readonly" in str(exc).lower()


class _Unusable(Exception):
    """The file cannot be used and must not be set aside: use memory, leave the file."""


class _NewerSchema(Exception):
    """The file's schema is newer than this module's: open it read-only instead."""


class SQLiteFile:
    """One tuning-database file (or a private in-memory database), ready to use.

    Parameters
    ----------
    path
        The file, or ``None`` for a private in-memory database. Parent folders are
        created; when they cannot be, the database falls back to memory with a warning.
    read_only
        Open the file read-only even where it could be written. A file that cannot be
        written, or has a newer schema, is opened read-only without being asked.

    Attributes
    ----------
    path : Path or None
        The file in use (``None`` when in memory).
    in_memory : bool
        Whether the data lives in memory only (asked for, or a fallback).
    read_only : bool
        Whether writes are refused; :attr:`read_only_reason` says why.
    quarantined : list of Path
        Damaged files this instance set aside.

    Raises
    ------
    TuningDBError
        If ``path`` is a folder, or lies under a file, or stays locked by another
        process while opening.
    """

    def __init__(self, path: Path | None, *, read_only: bool = False) -> None:
        self.in_memory = path is None
        self.path = path
        self.read_only = bool(read_only)
        self.read_only_reason = "opened with read_only=True" if read_only else ""
        self._asked_read_only = self.read_only
        self._warned_newer = False
        self._pending_warnings: list[str] = []
        self.quarantined: list[Path] = []
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._open()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _connect(self, target: str, *, uri: bool = False) -> sqlite3.Connection:
        conn = sqlite3.connect(target, timeout=_BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False, uri=uri)
        conn.row_factory = sqlite3.Row
        return conn

    def _connect_file(self, immutable: bool = False) -> sqlite3.Connection:
        """A connection to the file: read-write, or ``mode=ro`` when read-only.

        ``immutable=1`` is for a read-only WAL file in a folder this process cannot write
        (SQLite cannot create the ``-shm`` file it needs to read it otherwise).
        """
        assert self.path is not None
        if not self.read_only:
            return self._connect(str(self.path))
        uri = f"file:{quote(str(self.path), safe='/')}?mode=ro"
        return self._connect(uri + ("&immutable=1" if immutable else ""), uri=True)

    def _mark_read_only(self, why: str) -> None:
        if not self.read_only:
            log.info("tuning database %s: opened read-only (%s)", self.path, why)
        self.read_only = True
        self.read_only_reason = self.read_only_reason or why

    def _open(self) -> None:
        if self.in_memory:
            self._conn = self._open_memory()
            return
        assert self.path is not None
        try:
            self._check_place()
            if self.read_only and not self.path.exists():
                raise _Unusable(f"{self.path} does not exist, and read-only it is not created")
            if not self.read_only:
                why = self._not_writable()
                if why:
                    self._mark_read_only(why)
            reason = ""
            for attempt in range(2):
                reason, inode = self._check_header()
                if reason is None:
                    reason = self._attempt()
                    if reason is None:
                        self._flush_warnings()
                        return
                if attempt == 0 and not self._quarantine(reason, inode):
                    raise _Unusable(f"{self.path} is unusable ({reason}); it is left as it is")
            raise _Unusable(f"{self.path} is still unusable after quarantine: {reason}")
        except _Unusable as exc:
            self._flush_warnings()
            self._fall_back_to_memory(str(exc))

    def _check_place(self) -> None:
        """Make the parent folders; a path that can never hold a database is an error."""
        assert self.path is not None
        for folder in (self.path, *self.path.parents):
            if folder.exists():
                break
        else:  # pragma: no cover - the root always exists
            folder = self.path
        if folder == self.path:
            if not self.path.is_file():
                raise TuningDBError(f"tuning database {self.path} is a folder or a special "
                                    "file, not a database file; pass the path of a file")
        elif not folder.is_dir():
            raise TuningDBError(f"cannot use {self.path} as the tuning database: {folder} is "
                                "a file, not a folder; pass a path inside a folder")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _Unusable(f"cannot create {self.path.parent}: {exc}") from None

    def _not_writable(self) -> str:
        """Why this process cannot write the existing file (``""`` when it can)."""
        assert self.path is not None
        if not self.path.exists():
            return ""
        if not os.access(self.path, os.W_OK):
            return "the file is not writable"
        if not os.access(self.path.parent, os.W_OK | os.X_OK):
            return f"its folder {self.path.parent} is not writable"
        return ""

    def _attempt(self) -> str | None:
        """Connect and prepare; ``None`` when ready (the connection is kept), else why
        the file is unusable. Switches to read-only when the file cannot be written or
        has a newer schema."""
        try:
            conn, reason = self._connect_and_prepare()
        except _NewerSchema as exc:
            self._mark_read_only(str(exc))
            return self._attempt()
        except sqlite3.Error as exc:
            if _is_busy(exc):
                raise TuningDBError(
                    f"tuning database {self.path} stayed locked by another process "
                    f"for {_BUSY_TIMEOUT_S:.0f} s while opening; try again") from exc
            if _is_read_only(exc) and not self.read_only:
                self._mark_read_only(f"SQLite cannot write it: {exc}")
                return self._attempt()
            if not _is_corruption(exc):
                raise _Unusable(f"cannot open {self.path}: {exc}") from None
            return f"{type(exc).__name__}: {exc}"
        if reason is None:
            self._conn = conn
            return None
        conn.close()
        return reason

    def _connect_and_prepare(self) -> tuple[sqlite3.Connection, str | None]:
        """Connect and :meth:`_prepare`, retrying while another process holds a lock.

        SQLite answers ``SQLITE_BUSY`` at once, without waiting in the busy handler, when
        waiting could deadlock, e.g. two processes switching a new file to WAL or creating
        the schema at the same moment; those attempts are retried until the busy timeout.
        A read-only WAL file whose folder cannot be written is read as immutable.
        """
        deadline = time.monotonic() + _BUSY_TIMEOUT_S
        delay = 0.005
        immutable = False
        while True:
            conn = self._connect_file(immutable)
            try:
                return self._ready(conn)
            except sqlite3.Error as exc:
                conn.close()
                if self.read_only and not immutable and _is_read_only(exc):
                    log.info("tuning database %s: read as immutable (%s)", self.path, exc)
                    immutable = True
                    continue
                if not _is_busy(exc) or time.monotonic() + delay > deadline:
                    raise
                log.debug("tuning database %s busy while opening (%s); retrying", self.path,
                          exc)
            except BaseException:
                conn.close()
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.25)

    def _ready(self, conn: sqlite3.Connection) -> tuple[sqlite3.Connection, str | None]:
        """:meth:`_prepare` the connection; a read-only file that would need creating or
        migrating is copied into memory and prepared there (still read-only)."""
        reason = self._prepare(conn, writable=not self.read_only)
        if reason not in ("create", "migrate"):
            return conn, reason
        memory = self._connect(":memory:")
        conn.backup(memory)
        conn.close()
        log.info("tuning database %s is read-only and needs its schema %s; serving a copy "
                 "in memory", self.path, "created" if reason == "create" else "migrated")
        return memory, self._prepare(memory, writable=True)

    def _open_memory(self) -> sqlite3.Connection:
        conn = self._connect(":memory:")
        reason = self._prepare(conn, writable=True)
        if reason is not None:  # pragma: no cover - a fresh in-memory DB is always fine
            raise TuningDBError(f"cannot initialise an in-memory tuning database: {reason}")
        return conn

    def _fall_back_to_memory(self, why: str) -> None:
        message = (f"tuning database: {why}; using a temporary in-memory database "
                   "instead, so results of this session will not be kept")
        log.warning(message)
        warnings.warn(message, TuningDBWarning, stacklevel=5)
        self.in_memory = True
        self.read_only = self._asked_read_only
        self._conn = self._open_memory()

    def _check_header(self) -> tuple[str | None, int | None]:
        """Whether the file (if any, and not empty) starts like a SQLite database.

        Raises :class:`_Unusable` for a file this process may not read (not damaged, so
        not to be set aside).
        """
        assert self.path is not None
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            raise _Unusable(f"cannot read {self.path}: {exc}") from None
        if not stat.S_ISREG(st.st_mode):
            raise TuningDBError(f"tuning database {self.path} is not a regular file; pass "
                                "the path of a file")
        try:
            with self.path.open("rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
        except OSError as exc:
            raise _Unusable(f"cannot read {self.path}: {exc}") from None
        if head and head != _SQLITE_MAGIC:  # an empty file is a valid, empty database
            return "not a SQLite database (bad header)", st.st_ino
        return None, st.st_ino

    def _prepare(self, conn: sqlite3.Connection, *, writable: bool) -> str | None:
        """Set pragmas, check integrity, create or migrate the schema.

        Returns ``None`` when the database is ready, ``"create"`` or ``"migrate"`` when a
        read-only one (``writable=False``) would need that, else why it is unusable.
        Raises :class:`_NewerSchema` for a writable file of a newer schema, before
        anything in it is changed.
        """
        conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            why = (f"schema version {version} is newer than this pyc_lab understands "
                   f"({SCHEMA_VERSION})")
            if writable:
                raise _NewerSchema(why)
            self._warn_newer(why)
        if writable:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() not in ("wal", "memory"):
                log.warning("tuning database %s: journal_mode is %s, not WAL (file system "
                            "without shared memory?); concurrent writers will wait longer",
                            self.path, mode)
            conn.execute("PRAGMA synchronous = NORMAL")
        problems = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
        if problems != ["ok"]:
            return "integrity_check failed: " + "; ".join(map(str, problems[:5]))
        reason = self._plan(conn)
        if reason in ("create", "migrate"):
            if not writable:
                return reason
            conn.execute("BEGIN IMMEDIATE")
            try:
                reason = self._plan(conn)  # re-check: another process may have done it
                if reason == "create":
                    for stmt in _SCHEMA:
                        conn.execute(stmt)
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    log.info("tuning database %s: created (schema %d)", self.path,
                             SCHEMA_VERSION)
                elif reason == "migrate":
                    self._migrate(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            reason = self._plan(conn)
        if reason is not None:
            return reason
        return self._check_columns(conn)

    def _warn_newer(self, why: str) -> None:
        """Log now, warn once :meth:`_open` is done (at the caller's line)."""
        if self._warned_newer:
            return
        self._warned_newer = True
        message = (f"tuning database {self.path}: {why}; it is opened read-only (lookups "
                   "work, nothing is recorded into it) and left unchanged for the newer "
                   "pyc_lab; upgrade pyc_lab to record into it")
        log.warning(message)
        self._pending_warnings.append(message)

    def _flush_warnings(self) -> None:
        while self._pending_warnings:
            # _flush_warnings <- _open <- SQLiteFile() <- TuningDB() <- the caller
            warnings.warn(self._pending_warnings.pop(0), TuningDBWarning, stacklevel=5)

    @staticmethod
    def _plan(conn: sqlite3.Connection) -> str | None:
        """``None`` (ready), ``"create"``, ``"migrate"`` or why the schema is unknown.

        A newer version is ready: it is only ever opened read-only, and its columns are
        checked by :meth:`_check_columns`.
        """
        # one statement, so one snapshot: read apart, another process's schema creation
        # could commit in between (version 0, and its tables) and look like damage
        version, names = conn.execute(
            "SELECT (SELECT user_version FROM pragma_user_version), "
            "(SELECT group_concat(name, char(31)) FROM sqlite_master "
            "WHERE type = 'table' AND name NOT LIKE 'sqlite_%')").fetchone()
        tables = set(names.split("\x1f")) if names else set()
        if version == 0:
            if not tables:
                return "create"
            return f"unrecognised schema: version 0 with tables {sorted(tables)}"
        if version >= SCHEMA_VERSION:
            return None
        if version in _MIGRATIONS:
            return "migrate"
        return f"unrecognised schema version {version}"

    def _migrate(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        while version < SCHEMA_VERSION:
            for stmt in _MIGRATIONS[version]:
                conn.execute(stmt)
            log.info("tuning database %s: migrated schema %d -> %d", self.path, version,
                     version + 1)
            version += 1
            conn.execute(f"PRAGMA user_version = {version}")

    @staticmethod
    def _check_columns(conn: sqlite3.Connection) -> str | None:
        for table, required in _REQUIRED_COLUMNS.items():
            have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
            missing = required - have
            if missing:
                return f"unrecognised schema: table {table} lacks {sorted(missing)}"
        return None

    def _quarantine(self, reason: str, inode: int | None, stacklevel: int = 5) -> bool:
        """Rename the damaged file (and its WAL) aside, with a log record and a warning.

        Returns whether the path is free for a fresh database: ``False`` for a read-only
        database or one that cannot be renamed (it is then left as it is).
        """
        assert self.path is not None
        if self.read_only:
            return False
        try:
            st = self.path.stat()
        except FileNotFoundError:
            log.info("tuning database %s vanished before quarantine (another process "
                     "set it aside?)", self.path)
            return True
        if inode is not None and st.st_ino != inode:
            log.info("tuning database %s was replaced meanwhile; not quarantined", self.path)
            return True
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            n += 1
        try:
            os.rename(self.path, target)
        except FileNotFoundError:
            return True
        except OSError as exc:
            log.warning("tuning database %s is unusable (%s) and cannot be moved aside: %s",
                        self.path, reason, exc)
            return False
        for suffix in ("-wal", "-shm"):
            side = self.path.with_name(self.path.name + suffix)
            try:
                if suffix == "-wal":
                    os.rename(side, target.with_name(target.name + suffix))
                else:
                    side.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:  # pragma: no cover - best effort
                log.debug("could not move %s aside: %s", side, exc)
        self.quarantined.append(target)
        message = (f"tuning database {self.path} is unusable ({reason}); it was moved to "
                   f"{target} and a fresh database was started")
        log.warning(message)
        warnings.warn(message, TuningDBWarning, stacklevel=stacklevel)
        return True

    def _recover(self, exc: sqlite3.Error) -> None:
        """Corruption found while working: close, quarantine, reopen fresh.

        A read-only file is left as it is and the session goes on in memory.
        """
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self.in_memory:  # pragma: no cover - an in-memory DB cannot be corrupted on disk
            self._conn = self._open_memory()
            return
        if self.read_only:
            self._fall_back_to_memory(f"{self.path} is damaged ({exc}); it is read-only and "
                                      "left as it is")
            return
        try:
            _, inode = self._check_header()
        except _Unusable:
            inode = None
        if self._quarantine(f"{type(exc).__name__}: {exc}", inode, stacklevel=6):
            self._open()
        else:
            self._fall_back_to_memory(f"{self.path} is damaged ({exc}) and could not be "
                                      "moved aside; it is left as it is")

    def _read_only_error(self, detail: str = "") -> TuningDBError:
        where = self.path if self.path is not None else "(in memory)"
        why = "; ".join(w for w in (self.read_only_reason, detail) if w)
        return TuningDBError(
            f"tuning database {where} is read-only ({why or 'not writable'}); nothing was "
            "written. Record into a database you can write: TuningDB(path) with a writable "
            "path, or TuningDB(':memory:') for this session only")

    def call(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``fn(conn)``; on corruption quarantine, reopen and retry once."""
        with self._lock:
            for attempt in range(2):
                conn = self._require_open()
                try:
                    return fn(conn)
                except sqlite3.Error as exc:
                    if attempt == 0 and _is_corruption(exc):
                        self._recover(exc)
                        continue
                    if _is_busy(exc):
                        raise TuningDBError(
                            f"tuning database {self.path} stayed locked by another writer "
                            f"for {_BUSY_TIMEOUT_S:.0f} s; try again") from exc
                    if _is_read_only(exc):
                        raise self._read_only_error(str(exc)) from exc
                    raise TuningDBError(f"tuning database {self.path}: {exc}") from exc
            raise AssertionError("unreachable")  # pragma: no cover

    def _require_open(self) -> sqlite3.Connection:
        if self._closed or self._conn is None:
            raise TuningDBError("the tuning database is closed; open a new TuningDB")
        return self._conn

    @contextmanager
    def transaction(self, conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` write transaction, rolled back on any error.

        Raises
        ------
        TuningDBError
            On a read-only database, before anything is written.
        """
        if self.read_only:
            raise self._read_only_error()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        """Close the connection; further calls raise :class:`TuningDBError`."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._closed = True
