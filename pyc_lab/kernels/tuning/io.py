"""Tuning-database files: every row as JSON or CSV, and back, checked before use.

:meth:`TuningDB.export <pyc_lab.kernels.tuning.database.TuningDB.export>` writes what
:func:`write_rows` makes of the rows; :meth:`~pyc_lab.kernels.tuning.database.TuningDB.import_`
reads a file with :func:`read_rows`, which checks every field of every row and raises a
:class:`~pyc_lab.kernels.tuning.keys.TuningDBError` naming the first bad row and field
before anything is written.

An import file may come from anyone, so nothing in it is coerced: extents are positive
integers below 2**63 (JSON integers, or integral text in CSV), never ``1.9`` or ``true``;
times and rates are finite and not negative; configs are small JSON objects; strings
have a length cap. One bad row refuses the whole file, so a database never holds half an
import.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import re
import stat
from pathlib import Path
from typing import Any

from ...paths import replacing
from .keys import (
    _DEVICE_COLS,
    _KEY_COLS,
    _PROBLEM_COLS,
    COLUMNS,
    MAX_EXTENT,
    STATUSES,
    DeviceKey,
    Measurement,
    ProblemKey,
    TuningDBError,
    _canonical_json,
    _key_values,
    _now,
)

__all__ = ["MAX_FILE_BYTES", "read_rows", "write_rows"]

#: The largest file :func:`read_rows` reads (a million rows take about 600 MB).
MAX_FILE_BYTES = 1 << 30
#: Caps on the text of one field: names (device, op, dtypes, run ids), a config's JSON
#: and a message (compiler output is kept in full up to this).
_MAX_NAME = 256
_MAX_CONFIG = 64 * 1024
_MAX_MESSAGE = 1 << 20
#: How deeply a config may nest (a real one is a flat object of short lists).
_MAX_CONFIG_DEPTH = 16

_INTEGRAL = re.compile(r"\s*\+?[0-9]+\s*")
_TRUE = ("true", "1")
_FALSE = ("false", "0", "")


class _BadField(Exception):
    """One field of one row is wrong: ``(field, what is wrong)``."""


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in (".json", ".csv"):
        raise TuningDBError(f"{path}: export/import needs a .json or .csv file, "
                            f"not {suffix or 'no suffix'!r}")
    return suffix[1:]


def _read_json(path: Path) -> list[Any]:
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _text(row: dict, field: str, *, cap: int = _MAX_NAME, required: bool = True,
          default: str = "") -> str:
    value = row.get(field)
    if value is None or value == "":
        if required:
            raise _BadField(field, "is missing or empty")
        return default
    if not isinstance(value, str):
        raise _BadField(field, f"must be text, got {_short(value)}")
    if len(value) > cap:
        raise _BadField(field, f"is {len(value)} characters long, more than {cap}")
    return value


def _extent(row: dict, field: str) -> int:
    value = row.get(field)
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, str) and len(value) <= 40 and _INTEGRAL.fullmatch(value):
        number = int(value)
    else:
        number = None
    if number is None or not 0 < number <= MAX_EXTENT:
        raise _BadField(field, f"must be a positive integer below 2**63, got {_short(value)}")
    return number


def _number(row: dict, field: str) -> float | None:
    value = row.get(field)
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or \
            (isinstance(value, str) and len(value) > 40):
        raise _BadField(field, f"must be a number or empty, got {_short(value)}")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise _BadField(field, f"must be a number or empty, got {_short(value)}") from None
    if not math.isfinite(number) or number < 0:
        raise _BadField(field, f"must be finite and not negative, got {_short(value)}")
    return number


def _depth(value: Any) -> int:
    """How deeply JSON data nests (iteratively: deep data cannot exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth > _MAX_CONFIG_DEPTH:
                break
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _config(row: dict) -> dict:
    value = row.get("config")
    if isinstance(value, str):
        if len(value) > _MAX_CONFIG:
            raise _BadField("config", f"is {len(value)} characters of JSON, more than "
                                      f"{_MAX_CONFIG}")
        try:
            value = json.loads(value)
        except RecursionError:
            raise _BadField("config", "is JSON nested too deeply") from None
        except ValueError as exc:
            raise _BadField("config", f"is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _BadField("config", f"must be a JSON object, got {_short(value)}")
    if _depth(value) > _MAX_CONFIG_DEPTH:
        raise _BadField("config", f"nests deeper than {_MAX_CONFIG_DEPTH} levels")
    try:
        text = _canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise _BadField("config", f"is not plain JSON ({exc})") from None
    if len(text) > _MAX_CONFIG:
        raise _BadField("config", f"is {len(text)} characters of JSON, more than {_MAX_CONFIG}")
    return value


def _flag(row: dict, field: str, values: tuple[str, ...]) -> str:
    value = row.get(field)
    if value is None or isinstance(value, bool):
        return "" if value is None else str(value).lower()
    if isinstance(value, int) and value in (0, 1) and "1" in values:
        return str(value)
    if not isinstance(value, str) or value.strip().lower() not in values:
        raise _BadField(field, f"must be one of {values}, got {_short(value)}")
    return value.strip().lower()


def _parse_row(row: Any) -> tuple[tuple, Measurement, str, str, bool]:
    """One exported row as (key, measurement, run_id, recorded_at, pinned).

    Raises :class:`_BadField` naming the first wrong field.
    """
    if not isinstance(row, dict):
        raise _BadField("(row)", f"must be an object, got {_short(row)}")
    device = DeviceKey(*(_text(row, c) for c in _DEVICE_COLS))
    problem = ProblemKey(*(_text(row, c) for c in _PROBLEM_COLS[:5]),
                         *(_extent(row, c) for c in ("m", "n", "k")))
    config = _config(row)
    status = row.get("status")
    if not isinstance(status, str) or status not in STATUSES:
        raise _BadField("status", f"must be one of {STATUSES}, got {_short(status)}")
    times = {c: _number(row, c) for c in ("time_ms", "tflops", "error")}
    if status == "ok" and not times["time_ms"]:
        raise _BadField("time_ms", "must be a positive number for status 'ok'")
    message = _text(row, "message", cap=_MAX_MESSAGE, required=False)
    try:
        m = Measurement(config=config, status=status, message=message, **times)
    except TuningDBError as exc:  # pragma: no cover - every field was checked above
        raise _BadField("(measurement)", str(exc)) from None
    given = _text(row, "config_id", required=False)
    if given and given != m.config_id:
        raise _BadField("config_id", f"is {given!r}, which does not match its config "
                                     f"(hash {m.config_id})")
    run_id = _text(row, "run_id", required=False)
    recorded_at = _text(row, "recorded_at", cap=64, required=False)
    if recorded_at:
        try:
            _dt.datetime.fromisoformat(recorded_at)
        except ValueError:
            raise _BadField("recorded_at", f"is not an ISO 8601 time, got "
                                           f"{_short(recorded_at)}") from None
    else:
        recorded_at = _now()
    is_winner = _flag(row, "is_winner", _TRUE + _FALSE) in _TRUE
    source = _flag(row, "winner_source", ("", "auto", "manual"))
    return _key_values(device, problem), m, run_id, recorded_at, is_winner and \
        source == "manual"


def write_rows(path: Path, rows: list[dict[str, Any]], schema_version: int) -> None:
    """Write database rows (:data:`~pyc_lab.kernels.tuning.keys.COLUMNS`, ``config`` as
    JSON text) to ``path``: JSON for ``.json``, CSV for ``.csv``.

    Raises
    ------
    TuningDBError
        For another suffix, or a folder that does not exist or cannot be written.
    """
    if _format_of(path) == "json":
        doc = {"format": "pyc_lab.tuning_db", "schema_version": schema_version,
               "exported_at": _now(),
               "rows": [{**r, "config": json.loads(r["config"])} for r in rows]}
        text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
        with replacing(path, "export the tuning database", TuningDBError) as out:
            out.write_text(text, encoding="utf-8")
        return

    with replacing(path, "export the tuning database", TuningDBError) as out, \
            out.open("w", newline="", encoding="utf-8") as f:
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
        If the file cannot be read, is larger than :data:`MAX_FILE_BYTES`, or a row is
        malformed (the message names the row and the field).
    """
    fmt = _format_of(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a pipe or a device would block or never end
            raise TuningDBError(f"{path} is not a regular file; import a file written by "
                                "TuningDB.export")
        size = st.st_size
        if size > MAX_FILE_BYTES:
            raise TuningDBError(f"{path} is {size} bytes, more than the {MAX_FILE_BYTES} "
                                "an import reads; split it")
        raw_rows = _read_json(path) if fmt == "json" else _read_csv(path)
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as exc:
        raise TuningDBError(f"cannot read tuning data from {path}: {exc}") from exc
    parsed = []
    for number, row in enumerate(raw_rows, start=1):
        try:
            parsed.append(_parse_row(row))
        except _BadField as exc:
            field, what = exc.args
            raise TuningDBError(f"{path}: row {number} is malformed: field {field!r} {what}; "
                                "nothing was imported") from None
        except TuningDBError as exc:
            raise TuningDBError(f"{path}: row {number} is malformed: {exc}; nothing was "
                                "imported") from None
    return parsed
