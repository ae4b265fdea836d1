"""The tuning database's file: SQLite in WAL mode, checked, created or migrated, and set
aside when damaged.

:class:`SQLiteFile` owns the connection. Opening never crashes: a file that is not a
SQLite database, fails ``PRAGMA integrity_check`` or holds a schema this version does not
know is renamed ``<name>.corrupt-<UTC timestamp>`` beside it, with a
:class:`~pyc_lab.kernels.tuning.keys.TuningDBWarning`, and a fresh database takes its
place; corruption found later is handled the same way and the operation retried once.
Every call runs under one lock; every write is one ``BEGIN IMMEDIATE`` transaction that
waits (``busy_timeout``) for another process's writer.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import random
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

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

# SQLite primary result codes that mean the file itself is damaged.
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26
_CORRUPTION_HINTS = ("malformed", "not a database", "database corrupt")



def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return True
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _is_corruption(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return True
    text = str(exc).lower()
    return any(h in text for h in _CORRUPTION_HINTS)


class SQLiteFile:
    """One tuning-database file (or a private in-memory database), ready to use.

    Parameters
    ----------
    path
        The file, or ``None`` for a private in-memory database. Parent folders are
        created; when they cannot be, the database falls back to memory with a warning.

    Attributes
    ----------
    path : Path or None
        The file in use (``None`` when in memory).
    in_memory : bool
        Whether the data lives in memory only (asked for, or a fallback).
    quarantined : list of Path
        Damaged files this instance set aside.
    """

    def __init__(self, path: Path | None) -> None:
        self.in_memory = path is None
        self.path = path
        self.quarantined: list[Path] = []
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._open()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed


    def _connect(self, target: str) -> sqlite3.Connection:
        conn = sqlite3.connect(target, timeout=_BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False)
        conn.row_factory = sqlite3.Row
        return conn

    def _open(self) -> None:
        if self.in_memory:
            self._conn = self._open_memory()
            return
        assert self.path is not None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._fall_back_to_memory(f"cannot create {self.path.parent}: {exc}")
            return
        reason = ""
        for attempt in range(2):
            reason, inode = self._check_header()
            conn = None
            if reason is None:
                try:
                    conn, reason = self._connect_and_prepare()
                except sqlite3.Error as exc:
                    if _is_busy(exc):
                        raise TuningDBError(
                            f"tuning database {self.path} stayed locked by another process "
                            f"for {_BUSY_TIMEOUT_S:.0f} s while opening; try again") from exc
                    if not _is_corruption(exc):
                        self._fall_back_to_memory(f"cannot open {self.path}: {exc}")
                        return
                    reason = f"{type(exc).__name__}: {exc}"
                if reason is None:
                    self._conn = conn
                    return
                if conn is not None:
                    conn.close()
            if attempt == 0:
                self._quarantine(reason, inode)
        self._fall_back_to_memory(f"{self.path} is still unusable after quarantine: {reason}")

    def _connect_and_prepare(self) -> tuple[sqlite3.Connection, str | None]:
        """Connect and :meth:`_prepare`, retrying while another process holds a lock.

        SQLite answers ``SQLITE_BUSY`` at once, without waiting in the busy handler, when
        waiting could deadlock, e.g. two processes switching a new file to WAL or creating
        the schema at the same moment; those attempts are retried until the busy timeout.
        """
        deadline = time.monotonic() + _BUSY_TIMEOUT_S
        delay = 0.005
        while True:
            conn = self._connect(str(self.path))
            try:
                return conn, self._prepare(conn)
            except sqlite3.Error as exc:
                conn.close()
                if not _is_busy(exc) or time.monotonic() + delay > deadline:
                    raise
                log.debug("tuning database %s busy while opening (%s); retrying", self.path,
                          exc)
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.25)

    def _open_memory(self) -> sqlite3.Connection:
        conn = self._connect(":memory:")
        reason = self._prepare(conn)
        if reason is not None:  # pragma: no cover - a fresh in-memory DB is always fine
            raise TuningDBError(f"cannot initialise an in-memory tuning database: {reason}")
        return conn

    def _fall_back_to_memory(self, why: str) -> None:
        message = (f"tuning database: {why}; using a temporary in-memory database "
                   "instead, so results of this session will not be kept")
        log.warning(message)
        warnings.warn(message, TuningDBWarning, stacklevel=5)
        self.in_memory = True
        self._conn = self._open_memory()

    def _check_header(self) -> tuple[str | None, int | None]:
        """Whether the file (if any, and not empty) starts like a SQLite database."""
        assert self.path is not None
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None, None
        try:
            with self.path.open("rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
        except OSError as exc:
            return f"cannot read the file: {exc}", st.st_ino
        if head and head != _SQLITE_MAGIC:  # an empty file is a valid, empty database
            return "not a SQLite database (bad header)", st.st_ino
        return None, st.st_ino

    def _prepare(self, conn: sqlite3.Connection) -> str | None:
        """Set pragmas, check integrity, create or migrate the schema.

        Returns ``None`` when the database is ready, else why it is unusable.
        """
        conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
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

    @staticmethod
    def _plan(conn: sqlite3.Connection) -> str | None:
        """``None`` (ready), ``"create"``, ``"migrate"`` or why the schema is unknown."""
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' "
            "AND name NOT LIKE 'sqlite_%'")}
        if version == 0:
            if not tables:
                return "create"
            return f"unrecognised schema: version 0 with tables {sorted(tables)}"
        if version == SCHEMA_VERSION:
            return None
        if version in _MIGRATIONS:
            return "migrate"
        if version > SCHEMA_VERSION:
            return (f"schema version {version} is newer than this pyc_lab understands "
                    f"({SCHEMA_VERSION}); upgrade pyc_lab to use it")
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

    def _quarantine(self, reason: str, inode: int | None, stacklevel: int = 5) -> None:
        """Rename the damaged file (and its WAL) aside, with a log record and a warning."""
        assert self.path is not None
        try:
            st = self.path.stat()
        except FileNotFoundError:
            log.info("tuning database %s vanished before quarantine (another process "
                     "set it aside?)", self.path)
            return
        if inode is not None and st.st_ino != inode:
            log.info("tuning database %s was replaced meanwhile; not quarantined", self.path)
            return
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
            n += 1
        try:
            os.rename(self.path, target)
        except FileNotFoundError:
            return
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

    def _recover(self, exc: sqlite3.Error) -> None:
        """Corruption found while working: close, quarantine, reopen fresh."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self.in_memory:  # pragma: no cover - an in-memory DB cannot be corrupted on disk
            self._conn = self._open_memory()
            return
        _, inode = self._check_header()
        self._quarantine(f"{type(exc).__name__}: {exc}", inode, stacklevel=6)
        self._open()

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
                    raise TuningDBError(f"tuning database {self.path}: {exc}") from exc
            raise AssertionError("unreachable")  # pragma: no cover

    def _require_open(self) -> sqlite3.Connection:
        if self._closed or self._conn is None:
            raise TuningDBError("the tuning database is closed; open a new TuningDB")
        return self._conn

    @staticmethod
    @contextmanager
    def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
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
