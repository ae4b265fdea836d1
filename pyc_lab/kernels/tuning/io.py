"""Tuning-database files: every row as JSON or CSV, and back, checked before use.

:meth:`TuningDB.export <pyc_lab.kernels.tuning.database.TuningDB.export>` writes what
:func:`write_rows` makes of the rows; :meth:`~pyc_lab.kernels.tuning.database.TuningDB.import_`
reads a file with :func:`read_rows`, which checks every row and raises a
:class:`~pyc_lab.kernels.tuning.keys.TuningDBError` naming the first bad one before
anything is written.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from .keys import (
    _DEVICE_COLS,
    _KEY_COLS,
    _PROBLEM_COLS,
    COLUMNS,
    DeviceKey,
    Measurement,
    ProblemKey,
    TuningDBError,
    _key_values,
    _now,
)

__all__ = ["read_rows", "write_rows"]


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in (".json", ".csv"):
        raise TuningDBError(f"{path}: export/import needs a .json or .csv file, "
                            f"not {suffix or 'no suffix'!r}")
    return suffix[1:]


def _read_json(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != "pyc_lab.tuning_db" or \
            not isinstance(doc.get("rows"), list):
        raise ValueError("not a pyc_lab tuning database export (no format/rows)")
    return doc["rows"]


def _read_csv(path: Path) -> list[dict[str, Any]]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = set(_KEY_COLS) | {"config", "status"}
        missing -= set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"missing columns {sorted(missing)}")
        return list(reader)


def _parse_row(row: Any, number: int, path: Path) -> tuple[tuple, Measurement, str, str, bool]:
    """One exported row as (key, measurement, run_id, recorded_at, pinned)."""
    try:
        if not isinstance(row, dict):
            raise TuningDBError("not an object")
        device = DeviceKey(*(str(row[c]) for c in _DEVICE_COLS))
        problem = ProblemKey(*(row[c] for c in _PROBLEM_COLS[:5]),
                             *(int(row[c]) for c in ("m", "n", "k")))
        config = row["config"]
        if isinstance(config, str):
            config = json.loads(config)
        m = Measurement(config=config, status=row["status"], time_ms=row.get("time_ms"),
                        tflops=row.get("tflops"), error=row.get("error"),
                        message=row.get("message") or "")
        given = row.get("config_id")
        if given and given != m.config_id:
            raise TuningDBError(f"config_id {given} does not match its config "
                                f"(hash {m.config_id})")
        run_id = str(row.get("run_id") or "")
        recorded_at = str(row.get("recorded_at") or _now())
        winner = row.get("is_winner")
        is_winner = winner is True or str(winner).strip().lower() in ("true", "1")
        pinned = is_winner and str(row.get("winner_source") or "") == "manual"
    except (KeyError, TypeError, ValueError, TuningDBError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise TuningDBError(f"{path}: row {number} is malformed: {what}") from None
    return _key_values(device, problem), m, run_id, recorded_at, pinned


def write_rows(path: Path, rows: list[dict[str, Any]], schema_version: int) -> None:
    """Write database rows (:data:`~pyc_lab.kernels.tuning.keys.COLUMNS`, ``config`` as
    JSON text) to ``path``: JSON for ``.json``, CSV for ``.csv``.

    Raises
    ------
    TuningDBError
        For another suffix.
    """
    if _format_of(path) == "json":
        doc = {"format": "pyc_lab.tuning_db", "schema_version": schema_version,
               "exported_at": _now(),
               "rows": [{**r, "config": json.loads(r["config"])} for r in rows]}
        path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        return
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: "" if v is None else v for k, v in r.items()})


def read_rows(path: Path) -> list[tuple[tuple, Measurement, str, str, bool]]:
    """Every row of an exported file as ``(key, measurement, run_id, recorded_at,
    pinned)``, all checked before any is returned.

    Raises
    ------
    TuningDBError
        If the file cannot be read or a row is malformed (the message names the row).
    """
    fmt = _format_of(path)
    try:
        raw_rows = _read_json(path) if fmt == "json" else _read_csv(path)
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as exc:
        raise TuningDBError(f"cannot read tuning data from {path}: {exc}") from exc
    return [_parse_row(r, i, path) for i, r in enumerate(raw_rows, start=1)]
