"""The tuning database: every measured kernel candidate, and the winner, per GPU and problem.

The autotuner measures many candidate kernels (tile shapes, clusters, schedules) for one
problem (op, dtypes, layout, M, N, K) on one GPU, and keeps them all here, failures
included, so that a notebook can show why a candidate lost and a later session can skip
the search. Entries are keyed by the device (GPU name, compute capability, driver and CUDA
versions) and the problem; a result tuned on one device never answers for another.

The keys and rows are :mod:`~pyc_lab.kernels.tuning.keys`; export and import files are
:mod:`~pyc_lab.kernels.tuning.io`; the file itself — one SQLite file in the user cache
directory (:func:`pyc_lab.paths.cache_dir`), in WAL mode, so that two notebooks tuning
at once can both write without losing rows, set aside and rebuilt when damaged — is
:mod:`~pyc_lab.kernels.tuning.sqlite_file`. This module is what the rows mean: recording,
the winner policy, exact and bucketed lookup, export and import.

Examples
--------
>>> db = TuningDB(":memory:")
>>> dev = DeviceKey("NVIDIA H200", "9.0", "580.159.04", "13.0")
>>> prob = ProblemKey("gemm", "f16", "f16", "f32", "tn", 4096, 4096, 4096)
>>> db.record(dev, prob, Measurement({"tile": [128, 256, 64]}, "ok", time_ms=0.9))
>>> db.record(dev, prob, Measurement({"tile": [64, 64, 32]}, "compile_error",
...                                  message="smem overflow"))
>>> db.best(dev, prob).config
{'tile': [128, 256, 64]}
>>> db.lookup(dev, ProblemKey("gemm", "f16", "f16", "f32", "tn", 4000, 4096, 4096)).match
'bucket'
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ...paths import cache_dir
from . import io
from .keys import (
    _DEVICE_COLS,
    _FAMILY_COLS,
    _KEY_COLS,
    _PROBLEM_COLS,
    _VALUE_COLS,
    COLUMNS,
    MAX_EXTENT,
    DeviceKey,
    LookupResult,
    Measurement,
    ProblemKey,
    TuningDBError,
    TuningRecord,
    _canonical_json,
    _in_bucket,
    _key_values,
    _log_distance,
    _now,
)
from .sqlite_file import _KEY_LIST, SCHEMA_VERSION, SQLiteFile

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["SCHEMA_VERSION", "TuningDB", "default_path", "generation"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

_GENERATION = [0]
_GENERATION_LOCK = threading.Lock()


def generation() -> int:
    """How many writes this process has made to any tuning database.

    A lookup memoised under this number is never stale after a tuning in this process
    (writes by other processes show in the database file's modification time).
    """
    return _GENERATION[0]


def _wrote() -> None:
    with _GENERATION_LOCK:
        _GENERATION[0] += 1

def default_path() -> Path:
    """The default database file: ``<user cache dir>/pyc_lab/tuning.sqlite``
    (:func:`pyc_lab.paths.cache_dir`)."""
    return cache_dir(create=False) / "tuning.sqlite"



def _where(cols: Iterable[str], prefix: str = "") -> str:
    return " AND ".join(f"{prefix}{c} = ?" for c in cols)


_INSERT = (f"INSERT INTO measurements ({_KEY_LIST}, {', '.join(_VALUE_COLS)}) "
           f"VALUES ({', '.join('?' * (len(_KEY_COLS) + len(_VALUE_COLS)))}) "
           f"ON CONFLICT ({_KEY_LIST}, config_id, run_id) ")
_UPSERT = _INSERT + ("DO UPDATE SET config = excluded.config, status = excluded.status, "
                     "time_ms = excluded.time_ms, tflops = excluded.tflops, "
                     "error = excluded.error, message = excluded.message, "
                     "recorded_at = excluded.recorded_at")
_INSERT_IGNORE = _INSERT + "DO NOTHING"

_SELECT_ROWS = (
    "SELECT m.*, (w.measurement_id IS NOT NULL) AS is_winner, "
    "COALESCE(w.source, '') AS winner_source "
    "FROM measurements AS m LEFT JOIN winners AS w ON w.measurement_id = m.id"
)


class TuningDB:
    """The tuning database: every candidate measured per device and problem, and the winner.

    Parameters
    ----------
    path
        The SQLite file; default :func:`default_path` (the user cache directory). Parent
        folders are created. ``":memory:"`` gives a private, non-persistent database.
    read_only
        Only read the file, even where it could be written (a shared, curated database).
        A file this process cannot write, or one with a newer schema (a newer pyc_lab's),
        is opened read-only without being asked.

    Attributes
    ----------
    path : Path or None
        The file in use (``None`` when in memory).
    session_id : str
        The ``run_id`` given to measurements recorded without one.
    quarantined : list of Path
        Damaged files this instance set aside.

    Raises
    ------
    TuningDBError
        If ``path`` is a folder or lies under a file (it could never hold a database).

    Notes
    -----
    Every write is one ``BEGIN IMMEDIATE`` transaction; concurrent writers (threads,
    notebooks, processes) wait for each other up to 30 s. The winner of each problem is
    kept up to date in the same transaction: the ``"ok"`` measurement with the lowest
    ``time_ms`` (ties: the earlier), unless :meth:`set_winner` pinned a config. On a
    read-only database every write raises :class:`TuningDBError` (saying why it is
    read-only) before anything is written; lookups work as usual.
    """

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False) -> None:
        memory = str(path) == ":memory:"
        self._file = SQLiteFile(None if memory else Path(
            default_path() if path is None else path).expanduser(), read_only=read_only)
        self.session_id = uuid.uuid4().hex

    @property
    def path(self) -> Path | None:
        """The file in use (``None`` when in memory)."""
        return self._file.path

    @property
    def in_memory(self) -> bool:
        """Whether the data lives in memory only (asked for, or a fallback)."""
        return self._file.in_memory

    @property
    def read_only(self) -> bool:
        """Whether writes are refused (asked for, not writable, or a newer schema)."""
        return self._file.read_only

    @property
    def read_only_reason(self) -> str:
        """Why the database is read-only (``""`` when it is not)."""
        return self._file.read_only_reason if self._file.read_only else ""

    @property
    def quarantined(self) -> list[Path]:
        """Damaged files this instance set aside."""
        return self._file.quarantined

    # -- writing --------------------------------------------------------------------------

    def record(self, device: DeviceKey, problem: ProblemKey, m: Measurement, *,
               run_id: str | None = None) -> None:
        """Store one measurement and update the problem's winner.

        A measurement of the same config in the same run replaces the earlier one.

        Parameters
        ----------
        device, problem
            The key.
        m
            The measurement; failures are stored too, with their message.
        run_id
            The tuning run; default :attr:`session_id`.
        """
        self.record_many(device, problem, [m], run_id=run_id)

    def record_many(self, device: DeviceKey, problem: ProblemKey,
                    measurements: Iterable[Measurement], *, run_id: str | None = None) -> int:
        """Store several measurements of one problem in one transaction.

        Returns
        -------
        int
            How many measurements were stored.
        """
        key = _key_values(device, problem)
        items = list(measurements)
        for m in items:
            if not isinstance(m, Measurement):
                raise TuningDBError(f"expected a Measurement, got {type(m).__name__}")
        run = self.session_id if run_id is None else str(run_id)
        stamp = _now()
        rows = [(*key, m.config_id, _canonical_json(m.config), m.status, m.time_ms, m.tflops,
                 m.error, m.message, run, stamp) for m in items]

        def write(conn: sqlite3.Connection) -> int:
            with self._file.transaction(conn):
                conn.executemany(_UPSERT, rows)
                if rows:
                    self._refresh_winner(conn, key)
            return len(rows)

        try:
            return self._file.call(write)
        finally:
            _wrote()

    def set_winner(self, device: DeviceKey, problem: ProblemKey, config_id: str) -> None:
        """Pin ``config_id`` as the winner of a problem, over the fastest candidate.

        Its fastest ``"ok"`` measurement is what :meth:`best` and :meth:`lookup` return.

        Raises
        ------
        TuningDBError
            If that config has no ``"ok"`` measurement for this device and problem.
        """
        key = _key_values(device, problem)

        def write(conn: sqlite3.Connection) -> None:
            with self._file.transaction(conn):
                row = conn.execute(
                    f"SELECT id FROM measurements WHERE {_where(_KEY_COLS)} AND config_id = ? "
                    "AND status = 'ok' ORDER BY time_ms, id LIMIT 1",
                    (*key, config_id)).fetchone()
                if row is None:
                    raise TuningDBError(
                        f"config {config_id} has no 'ok' measurement for {problem} on "
                        f"{device.gpu_name}; only a candidate that ran correctly can win")
                self._put_winner(conn, key, config_id, row["id"], "manual")

        try:
            self._file.call(write)
        finally:
            _wrote()

    def clear_winner(self, device: DeviceKey, problem: ProblemKey) -> None:
        """Undo :meth:`set_winner`: the fastest ``"ok"`` candidate wins again."""
        key = _key_values(device, problem)

        def write(conn: sqlite3.Connection) -> None:
            with self._file.transaction(conn):
                conn.execute(f"DELETE FROM winners WHERE {_where(_KEY_COLS)}", key)
                self._refresh_winner(conn, key)

        try:
            self._file.call(write)
        finally:
            _wrote()

    @staticmethod
    def _put_winner(conn: sqlite3.Connection, key: tuple, config_id: str, mid: int,
                    source: str) -> None:
        conn.execute(
            f"INSERT INTO winners ({_KEY_LIST}, config_id, measurement_id, source, updated_at) "
            f"VALUES ({', '.join('?' * (len(_KEY_COLS) + 4))}) "
            f"ON CONFLICT ({_KEY_LIST}) DO UPDATE SET config_id = excluded.config_id, "
            "measurement_id = excluded.measurement_id, source = excluded.source, "
            "updated_at = excluded.updated_at",
            (*key, config_id, mid, source, _now()))

    def _refresh_winner(self, conn: sqlite3.Connection, key: tuple) -> None:
        """Recompute one problem's winner (inside the caller's transaction)."""
        where = _where(_KEY_COLS)
        current = conn.execute(
            f"SELECT config_id, measurement_id, source FROM winners WHERE {where}",
            key).fetchone()
        if current is not None and current["source"] == "manual":
            row = conn.execute(
                f"SELECT id FROM measurements WHERE {where} AND config_id = ? "
                "AND status = 'ok' AND time_ms IS NOT NULL ORDER BY time_ms, id LIMIT 1",
                (*key, current["config_id"])).fetchone()
            if row is not None:
                if row["id"] != current["measurement_id"]:
                    self._put_winner(conn, key, current["config_id"], row["id"], "manual")
                return
            log.warning("pinned winner %s of %s has no 'ok' measurement any more; the "
                        "fastest candidate wins again", current["config_id"], key)
        row = conn.execute(
            f"SELECT id, config_id FROM measurements WHERE {where} AND status = 'ok' "
            "AND time_ms IS NOT NULL ORDER BY time_ms, id LIMIT 1", key).fetchone()
        if row is None:
            conn.execute(f"DELETE FROM winners WHERE {where}", key)
        elif current is None or current["source"] != "auto" or \
                current["measurement_id"] != row["id"]:
            self._put_winner(conn, key, row["config_id"], row["id"], "auto")

    # -- reading --------------------------------------------------------------------------

    @staticmethod
    def _measurement(row: sqlite3.Row) -> Measurement:
        return Measurement(
            config=json.loads(row["config"]), status=row["status"], time_ms=row["time_ms"],
            tflops=row["tflops"], error=row["error"], message=row["message"],
            run_id=row["run_id"], recorded_at=row["recorded_at"])

    @staticmethod
    def _device(row: sqlite3.Row) -> DeviceKey:
        return DeviceKey(*(row[c] for c in _DEVICE_COLS))

    @staticmethod
    def _problem(row: sqlite3.Row) -> ProblemKey:
        return ProblemKey(*(row[c] for c in _PROBLEM_COLS))

    def best(self, device: DeviceKey, problem: ProblemKey) -> Measurement | None:
        """The winner of exactly this problem on this device, or ``None`` if none ran ok.

        The winner is the pinned config (:meth:`set_winner`) if any, else the ``"ok"``
        measurement with the lowest ``time_ms``; failed candidates never win.
        """
        key = _key_values(device, problem)

        def read(conn: sqlite3.Connection) -> Measurement | None:
            row = conn.execute(
                "SELECT m.* FROM winners AS w JOIN measurements AS m "
                f"ON m.id = w.measurement_id WHERE {_where(_KEY_COLS, 'w.')}", key).fetchone()
            return None if row is None else self._measurement(row)

        return self._file.call(read)

    def lookup(self, device: DeviceKey, problem: ProblemKey) -> LookupResult | None:
        """The best known kernel for a problem: exact shape first, then the nearest bucket.

        Parameters
        ----------
        device, problem
            What to look up.

        Returns
        -------
        LookupResult or None
            ``match="exact"`` when this very problem has a winner; else the winner of the
            tuned problem with the same device, op, dtypes and layout whose ``(m, n, k)``
            is nearest in log space among those with every dimension within a factor of 2
            (``match="bucket"``, ``distance`` = Euclidean distance of ``log2`` sizes; ties
            go to the smaller problem); else ``None``.
        """
        best = self.best(device, problem)
        if best is not None:
            return LookupResult(best, problem, "exact", 0.0)
        key = _key_values(device, problem)
        family = key[:len(_FAMILY_COLS)]
        shape = problem.shape

        def read(conn: sqlite3.Connection) -> list[sqlite3.Row]:
            return conn.execute(
                f"SELECT m, n, k FROM winners WHERE {_where(_FAMILY_COLS)} "
                "AND m BETWEEN ? AND ? AND n BETWEEN ? AND ? AND k BETWEEN ? AND ?",
                (*family, *(b for d in shape for b in (d / 2, min(d * 2, MAX_EXTENT))))
            ).fetchall()

        candidates = [(r["m"], r["n"], r["k"]) for r in self._file.call(read)]
        candidates = [c for c in candidates if _in_bucket(shape, c)]
        if not candidates:
            return None
        nearest = min(candidates, key=lambda c: (_log_distance(shape, c), c))
        matched = ProblemKey(problem.op, problem.dtype_a, problem.dtype_b, problem.dtype_c,
                             problem.layout, *nearest)
        measurement = self.best(device, matched)
        if measurement is None:  # pragma: no cover - removed by another process meanwhile
            return None
        return LookupResult(measurement, matched, "bucket", _log_distance(shape, nearest))

    def baselines(self, device: DeviceKey, problem: ProblemKey,
                  run_id: str | None = None) -> dict[str, float]:
        """The library times stored beside a problem's candidates (``"baseline"`` rows).

        Parameters
        ----------
        device, problem
            The key.
        run_id
            Only that tuning run's baselines (the run a winner was measured in); without
            it, each library's fastest over all runs.

        Returns
        -------
        dict
            ``library -> time_ms`` (``{"cublas": 0.398, "torch": 0.401}``); empty if none.
        """
        key = _key_values(device, problem)
        sql = (f"SELECT config, MIN(time_ms) AS ms FROM measurements WHERE {_where(_KEY_COLS)} "
               "AND status = 'baseline' AND time_ms IS NOT NULL"
               + (" AND run_id = ?" if run_id is not None else "") + " GROUP BY config")
        params = (*key, run_id) if run_id is not None else key

        def read(conn: sqlite3.Connection) -> dict[str, float]:
            out: dict[str, float] = {}
            for row in conn.execute(sql, params):
                name = json.loads(row["config"]).get("baseline")
                if isinstance(name, str):
                    out[name] = float(row["ms"])
            return out

        return self._file.call(read)

    def measurements(self, device: DeviceKey | None = None,
                     problem: ProblemKey | None = None) -> list[TuningRecord]:
        """Stored rows, oldest first, optionally for one device and/or one problem."""
        clauses: list[str] = []
        params: list[Any] = []
        if device is not None:
            if not isinstance(device, DeviceKey):
                raise TuningDBError(f"expected a DeviceKey, got {type(device).__name__}")
            clauses.append(_where(_DEVICE_COLS, "m."))
            params += [getattr(device, c) for c in _DEVICE_COLS]
        if problem is not None:
            if not isinstance(problem, ProblemKey):
                raise TuningDBError(f"expected a ProblemKey, got {type(problem).__name__}")
            clauses.append(_where(_PROBLEM_COLS, "m."))
            params += [getattr(problem, c) for c in _PROBLEM_COLS]
        sql = _SELECT_ROWS + (" WHERE " + " AND ".join(clauses) if clauses else "")
        sql += " ORDER BY m.id"

        def read(conn: sqlite3.Connection) -> list[TuningRecord]:
            return [TuningRecord(self._device(r), self._problem(r), self._measurement(r),
                                 bool(r["is_winner"]))
                    for r in conn.execute(sql, params)]

        return self._file.call(read)

    def __len__(self) -> int:
        return self._file.call(lambda c: c.execute("SELECT COUNT(*) FROM measurements")
                          .fetchone()[0])

    def _rows(self) -> list[dict[str, Any]]:
        def read(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            out = []
            for r in conn.execute(_SELECT_ROWS + " ORDER BY m.id"):
                row = {c: r[c] for c in COLUMNS}
                row["is_winner"] = bool(row["is_winner"])
                out.append(row)
            return out

        return self._file.call(read)

    def to_frame(self) -> pd.DataFrame:
        """All rows as a pandas DataFrame, one per measurement, columns :data:`COLUMNS`.

        ``config`` is the config's JSON text; ``is_winner`` marks each problem's winner.
        """
        import pandas as pd

        return pd.DataFrame(self._rows(), columns=list(COLUMNS))

    # -- export / import ------------------------------------------------------------------

    def export(self, path: str | Path) -> int:
        """Write every row to ``path``: JSON for ``.json``, CSV for ``.csv``.

        Returns
        -------
        int
            The number of rows written.

        Raises
        ------
        TuningDBError
            For another suffix.
        """
        path = Path(path)
        rows = self._rows()
        io.write_rows(path, rows, SCHEMA_VERSION)
        log.info("tuning database: exported %d rows to %s", len(rows), path)
        return len(rows)

    def import_(self, path: str | Path) -> int:
        """Add the rows of a file written by :meth:`export` (``.json`` or ``.csv``).

        Rows already present (same device, problem, config and run) are skipped, so
        importing a file twice adds nothing. A config pinned as winner in the file is
        pinned here too unless this database already pins one for that problem. The
        whole file is checked before anything is written.

        Returns
        -------
        int
            The number of rows added.

        Raises
        ------
        TuningDBError
            If the file cannot be read or a row is malformed (nothing is added then).
        """
        path = Path(path)
        parsed = io.read_rows(path)

        def write(conn: sqlite3.Connection) -> int:
            added = 0
            with self._file.transaction(conn):
                keys: dict[tuple, str | None] = {}
                for key, m, run_id, recorded_at, pinned in parsed:
                    cur = conn.execute(_INSERT_IGNORE, (
                        *key, m.config_id, _canonical_json(m.config), m.status, m.time_ms,
                        m.tflops, m.error, m.message, run_id, recorded_at))
                    added += cur.rowcount
                    if pinned or key not in keys:
                        keys[key] = m.config_id if pinned else None
                for key, pin in keys.items():
                    if pin is not None:
                        current = conn.execute(
                            f"SELECT source FROM winners WHERE {_where(_KEY_COLS)}",
                            key).fetchone()
                        if current is None or current["source"] != "manual":
                            row = conn.execute(
                                f"SELECT id FROM measurements WHERE {_where(_KEY_COLS)} "
                                "AND config_id = ? AND status = 'ok' "
                                "ORDER BY time_ms, id LIMIT 1", (*key, pin)).fetchone()
                            if row is not None:
                                self._put_winner(conn, key, pin, row["id"], "manual")
                    self._refresh_winner(conn, key)
            return added

        try:
            added = self._file.call(write)
        finally:
            _wrote()
        log.info("tuning database: imported %d new rows of %d from %s", added, len(parsed),
                 path)
        return added

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection; further use raises :class:`TuningDBError`."""
        self._file.close()

    def __enter__(self) -> TuningDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = ":memory:" if self.in_memory else str(self.path)
        state = "closed" if self._file.closed else "open"
        if self.read_only and not self._file.closed:
            state += ", read-only"
        return f"TuningDB({where!r}, {state})"
