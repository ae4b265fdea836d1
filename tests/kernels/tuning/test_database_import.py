"""Importing tuning data checks every field of every row: a wrong type or range refuses
the whole file with an error naming the row and the field, and nothing is written."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from pyc_lab.cli import main
from pyc_lab.kernels.tuning.database import TuningDB
from pyc_lab.kernels.tuning.keys import DeviceKey, Measurement, ProblemKey, TuningDBError

H200 = DeviceKey("NVIDIA H200", "9.0", "580.159.04", "13.0")
PROBLEM = ProblemKey("gemm", "f16", "f16", "f32", "tn", 4096, 4096, 4096)


@pytest.fixture
def export(tmp_path: Path) -> dict:
    """A valid JSON export of three rows, as a dict to damage."""
    with TuningDB(tmp_path / "source.sqlite") as db:
        db.record_many(H200, PROBLEM, [
            Measurement({"tile": [128, 256, 64]}, "ok", time_ms=0.9, tflops=150.0, error=1e-3),
            Measurement({"tile": [64, 64, 32]}, "ok", time_ms=1.5),
            Measurement({"tile": [8, 8, 8]}, "compile_error", message="smem"),
        ])
        db.export(tmp_path / "good.json")
    return json.loads((tmp_path / "good.json").read_text())


@pytest.fixture
def target(tmp_path: Path):
    with TuningDB(tmp_path / "target.sqlite") as db:
        db.record(H200, ProblemKey("gemm", "f16", "f16", "f32", "tn", 64, 64, 64),
                  Measurement({"tile": [1]}, "ok", time_ms=0.01))
        yield db


BAD_VALUES = [
    ("m", 2**70, "must be a positive integer below 2**63, got 1180591620717411303424"),
    ("m", 2**63, "must be a positive integer below 2**63"),
    ("n", 1.9, "must be a positive integer below 2**63, got 1.9"),
    ("k", "1.9", "must be a positive integer below 2**63, got '1.9'"),
    ("m", True, "must be a positive integer below 2**63, got True"),
    ("m", 0, "must be a positive integer"),
    ("m", -4096, "must be a positive integer"),
    ("m", "4096abc", "must be a positive integer"),
    ("m", None, "must be a positive integer"),
    ("time_ms", float("nan"), "must be finite and not negative, got nan"),
    ("time_ms", -1.0, "must be finite and not negative, got -1.0"),
    ("time_ms", "inf", "must be finite and not negative, got 'inf'"),
    ("time_ms", True, "must be a number or empty, got True"),
    ("time_ms", None, "must be a positive number for status 'ok'"),
    ("tflops", -5, "must be finite and not negative"),
    ("error", [1], "must be a number or empty, got [1]"),
    ("config", [128, 256], "must be a JSON object, got [128, 256]"),
    ("config", "[1]", "must be a JSON object, got [1]"),
    ("config", "{not json", "is not JSON"),
    ("config", {"a": "x" * 70_000}, "is 70008 characters of JSON, more than 65536"),
    ("config", json.loads("[" * 40 + "]" * 40), "must be a JSON object"),
    ("gpu_name", 123, "must be text, got 123"),
    ("gpu_name", "x" * 1000, "is 1000 characters long, more than 256"),
    ("gpu_name", "", "is missing or empty"),
    ("dtype_a", {"f16": 1}, "must be text"),
    ("status", None, "must be one of ('ok', "),
    ("status", "fast", "must be one of ('ok', "),
    ("message", ["a"], "must be text, got ['a']"),
    ("message", "x" * (2 << 20), "is 2097152 characters long, more than 1048576"),
    ("run_id", 7, "must be text, got 7"),
    ("recorded_at", "yesterday", "is not an ISO 8601 time, got 'yesterday'"),
    ("is_winner", "maybe", "must be one of"),
    ("winner_source", "magic", "must be one of ('', 'auto', 'manual')"),
    ("config_id", "0123456789abcdef", "is '0123456789abcdef', which does not match its"),
]


@pytest.mark.parametrize(("field", "value", "problem"), BAD_VALUES,
                         ids=[f"{f}={str(v)[:12]}" for f, v, _ in BAD_VALUES])
def test_a_bad_field_refuses_the_whole_file_naming_row_and_field(tmp_path, export, target,
                                                                  field, value, problem):
    export["rows"][1][field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(export))  # NaN is written as the JSON literal NaN
    before = target.measurements()
    with pytest.raises(TuningDBError) as info:
        target.import_(bad)
    message = str(info.value)
    assert f"row 2 is malformed: field {field!r} {problem}" in message, message
    assert "nothing was imported" in message and "\n" not in message
    assert target.measurements() == before  # not even the good rows 1 and 3


def test_a_row_that_is_not_an_object(tmp_path, export, target):
    export["rows"].insert(0, "NVIDIA H200,9.0")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(export))
    with pytest.raises(TuningDBError, match=r"row 1 is malformed: field '\(row\)' must be an "
                                            r"object"):
        target.import_(bad)
    assert len(target) == 1


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("m", "1.9", "must be a positive integer below 2**63, got '1.9'"),
    ("m", "", "must be a positive integer"),
    ("n", "99999999999999999999999", "must be a positive integer below 2**63"),
    ("time_ms", "nan", "must be finite and not negative, got 'nan'"),
    ("time_ms", "-0.5", "must be finite and not negative"),
    ("config", "[1, 2]", "must be a JSON object"),
    ("is_winner", "yes", "must be one of"),
])
def test_csv_rows_are_checked_the_same_way(tmp_path, export, target, field, value, problem):
    path = tmp_path / "good.csv"
    with TuningDB(tmp_path / "source.sqlite") as db:
        db.export(path)
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    rows[1][field] = value
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(TuningDBError, match="row 2 is malformed: field") as info:
        target.import_(path)
    assert problem in str(info.value)
    assert len(target) == 1


def test_integral_text_and_json_integers_are_accepted(tmp_path, export, target):
    export["rows"][0].update(m="4096", n=" 4096 ", k=4096)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(export))
    assert target.import_(good) == 3
    assert target.best(H200, PROBLEM).config == {"tile": [128, 256, 64]}


def test_deeply_nested_or_huge_files_are_clear_errors(tmp_path, target, monkeypatch):
    deep = tmp_path / "deep.json"
    deep.write_text('{"format": "pyc_lab.tuning_db", "rows": ' + "[" * 100_000 +
                    "]" * 100_000 + "}")
    with pytest.raises(TuningDBError, match="JSON nested too deeply"):
        target.import_(deep)
    deep_config = tmp_path / "deep_config.csv"
    deep_config.write_text("gpu_name,compute_capability,driver,cuda,op,dtype_a,dtype_b,"
                           "dtype_c,layout,m,n,k,config,status\n"
                           "G,9.0,1,13,gemm,f16,f16,f16,tn,8,8,8,"
                           '"' + '{"a":' * 5000 + "1" + "}" * 5000 + '",skipped\n')
    with pytest.raises(TuningDBError, match="row 1 is malformed: field 'config'"):
        target.import_(deep_config)
    from pyc_lab.kernels.tuning import io

    monkeypatch.setattr(io, "MAX_FILE_BYTES", 100)
    with pytest.raises(TuningDBError, match="more than the 100 an import reads"):
        target.import_(deep)
    assert len(target) == 1


def test_keys_refuse_what_sqlite_cannot_store_exactly():
    with pytest.raises(TuningDBError, match="below 2\\*\\*63"):
        ProblemKey("gemm", "f16", "f16", "f16", "tn", 2**70, 8, 8)
    with pytest.raises(TuningDBError, match="must be an integer, got True"):
        ProblemKey("gemm", "f16", "f16", "f16", "tn", True, 8, 8)
    with pytest.raises(TuningDBError, match="time_ms must be a number"):
        Measurement({"t": 1}, "ok", time_ms=10**400)
    with pytest.raises(TuningDBError, match="time_ms must be a number"):
        Measurement({"t": 1}, "ok", time_ms=True)
    deep: dict = {}
    for _ in range(5000):
        deep = {"a": deep}
    with pytest.raises(TuningDBError, match="nested too deeply"):
        Measurement(deep, "skipped")


def test_the_cli_reports_a_bad_import_in_one_line(tmp_path, export, monkeypatch, capsys):
    from pyc_lab.kernels.tuning import database as tuning_db

    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "cli.sqlite")
    export["rows"][2]["k"] = 2**70
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(export))
    assert main(["db", "import", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyc-lab: error: ") and "row 3 is malformed: field 'k'" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    with TuningDB(tmp_path / "cli.sqlite") as db:
        assert len(db) == 0
