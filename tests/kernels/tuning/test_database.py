"""The tuning database: keys, lookup, winners, export/import, corruption, migration, concurrency.

Every database lives under ``tmp_path``; none touches the real user cache.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import sqlite3
import warnings
from pathlib import Path

import pytest

import pyc_lab
from pyc_lab.kernels.tuning.database import TuningDB
from pyc_lab.kernels.tuning.keys import (
    COLUMNS,
    DeviceKey,
    Measurement,
    ProblemKey,
    TuningDBError,
    TuningDBWarning,
)
from pyc_lab.kernels.tuning.sqlite_file import SCHEMA_VERSION

H200 = DeviceKey("NVIDIA H200", "9.0", "580.159.04", "13.0")
H100 = DeviceKey("NVIDIA H100 80GB HBM3", "9.0", "580.159.04", "13.0")


def gemm(m: int, n: int, k: int, *, dtypes=("f16", "f16", "f32"), layout="tn") -> ProblemKey:
    return ProblemKey("gemm", *dtypes, layout, m, n, k)


def ok(tile: int, time_ms: float) -> Measurement:
    return Measurement({"tile": [tile, tile, 64], "stages": 4}, "ok", time_ms=time_ms,
                       tflops=100.0 / time_ms, error=1e-3)


@pytest.fixture
def db(tmp_path: Path):
    with TuningDB(tmp_path / "tuning.sqlite") as d:
        yield d


# -- keys and measurements ----------------------------------------------------------------

def test_device_key_from_the_h200_snapshot():
    profile = pyc_lab.detect_hardware(snapshot="h200")
    key = DeviceKey.from_profile(profile)
    assert key == DeviceKey("NVIDIA H200", "9.0", profile.driver_version,
                            profile.cuda_driver_version)
    assert key.driver == "580.159.04" and key.cuda == "13.0"
    with pytest.raises(TuningDBError, match="no GPU 7"):
        DeviceKey.from_profile(profile, index=7)


def test_config_id_is_stable_and_order_independent():
    a = Measurement({"tile": (128, 256, 64), "cluster": [2, 1, 1]}, "skipped")
    b = Measurement({"cluster": [2, 1, 1], "tile": [128, 256, 64]}, "skipped")
    c = Measurement({"cluster": [1, 1, 1], "tile": [128, 256, 64]}, "skipped")
    assert a.config_id == b.config_id != c.config_id
    assert len(a.config_id) == 16 and int(a.config_id, 16) >= 0
    assert a.config == {"tile": [128, 256, 64], "cluster": [2, 1, 1]}  # JSON-normalised


def test_bad_measurements_and_keys_are_refused():
    with pytest.raises(TuningDBError, match="status"):
        Measurement({"tile": 1}, "fast")
    with pytest.raises(TuningDBError, match="time_ms"):
        Measurement({"tile": 1}, "ok")
    with pytest.raises(TuningDBError, match="JSON"):
        Measurement({"tile": object()}, "skipped")
    with pytest.raises(TuningDBError, match="positive"):
        gemm(0, 128, 128)
    assert Measurement({"t": 1}, "nan", time_ms=float("nan")).time_ms is None


# -- lookup -------------------------------------------------------------------------------

def test_exact_lookup(db: TuningDB):
    prob = gemm(4096, 4096, 4096)
    db.record(H200, prob, ok(128, 1.25))
    db.record(H200, prob, ok(256, 0.75))
    hit = db.lookup(H200, prob)
    assert hit is not None
    assert hit.match == "exact" and hit.distance == 0.0 and hit.problem_matched == prob
    assert hit.measurement == ok(256, 0.75)
    assert hit.measurement.run_id == db.session_id and hit.measurement.recorded_at


def test_bucket_lookup_picks_the_nearest(db: TuningDB):
    for size, t in ((1024, 0.1), (2048, 0.5), (4096, 3.0)):
        db.record(H200, gemm(size, size, size), ok(size // 16, t))
    hit = db.lookup(H200, gemm(1536, 1536, 1536))
    assert hit is not None and hit.match == "bucket"
    # log2(2048/1536) = 0.415 per dim beats log2(1536/1024) = 0.585
    assert hit.problem_matched == gemm(2048, 2048, 2048)
    assert hit.distance == pytest.approx(math.sqrt(3) * math.log2(2048 / 1536))
    assert hit.measurement.config["tile"][0] == 128

    hit = db.lookup(H200, gemm(1100, 1000, 1024))
    assert hit is not None and hit.problem_matched == gemm(1024, 1024, 1024)
    assert hit.distance == pytest.approx(math.hypot(math.log2(1100 / 1024),
                                                    math.log2(1000 / 1024)))


def test_lookup_outside_every_bucket_is_none(db: TuningDB):
    db.record(H200, gemm(1024, 1024, 1024), ok(64, 0.1))
    assert db.lookup(H200, gemm(100, 100, 100)) is None
    # two dims match exactly, the third is 2.9x away: not in the bucket
    assert db.lookup(H200, gemm(1024, 1024, 3000)) is None
    # exactly a factor of 2 is still inside
    assert db.lookup(H200, gemm(1024, 1024, 2048)).match == "bucket"


def test_other_device_dtype_or_layout_never_matches(db: TuningDB):
    prob = gemm(4096, 4096, 4096)
    db.record(H100, prob, ok(128, 1.0))
    assert db.lookup(H200, prob) is None
    new_driver = DeviceKey(H100.gpu_name, H100.compute_capability, "590.1", H100.cuda)
    assert db.lookup(new_driver, prob) is None
    assert db.lookup(H100, gemm(4096, 4096, 4096, layout="nn")) is None
    assert db.lookup(H100, gemm(4000, 4096, 4096, dtypes=("bf16", "bf16", "f32"))) is None
    assert db.lookup(H100, gemm(4000, 4096, 4096)).match == "bucket"


# -- winners and failures -----------------------------------------------------------------

def test_winner_ignores_failed_candidates(db: TuningDB):
    prob = gemm(8192, 8192, 8192)
    db.record_many(H200, prob, [
        Measurement({"tile": [256, 256, 64]}, "wrong_result", time_ms=0.01, error=3.5,
                    message="max abs error 3.5 > 0.01"),
        Measurement({"tile": [64, 64, 16]}, "nan", time_ms=0.02, message="output has NaN"),
        Measurement({"tile": [32, 32, 16]}, "timeout", message="killed after 10 s"),
        ok(128, 2.0),
        ok(64, 3.0),
    ])
    assert db.best(H200, prob) == ok(128, 2.0)
    winners = [r for r in db.measurements(H200, prob) if r.is_winner]
    assert [w.measurement.config_id for w in winners] == [ok(128, 2.0).config_id]
    db.record(H200, prob, ok(96, 1.5), run_id="later")
    assert db.best(H200, prob) == ok(96, 1.5)


def test_only_failures_means_no_winner(db: TuningDB):
    prob = gemm(512, 512, 512)
    db.record(H200, prob, Measurement({"tile": [1]}, "compile_error", message="smem"))
    assert db.best(H200, prob) is None and db.lookup(H200, prob) is None


def test_set_winner_pins_and_clear_winner_unpins(db: TuningDB):
    prob = gemm(2048, 2048, 2048)
    fast, slow = ok(128, 1.0), ok(64, 1.2)
    failed = Measurement({"tile": [7]}, "compile_error", message="no")
    db.record_many(H200, prob, [fast, slow, failed])
    db.set_winner(H200, prob, slow.config_id)
    assert db.best(H200, prob) == slow
    db.record(H200, prob, ok(256, 0.5), run_id="r2")  # faster, but the pin holds
    assert db.best(H200, prob) == slow
    with pytest.raises(TuningDBError, match="no 'ok' measurement"):
        db.set_winner(H200, prob, failed.config_id)
    db.clear_winner(H200, prob)
    assert db.best(H200, prob) == ok(256, 0.5)


def test_failures_are_stored_with_their_messages(db: TuningDB):
    prob = gemm(1024, 1024, 64)
    msgs = {"compile_error": "ptxas error: too much shared data\nline 2",
            "wrong_result": "max abs error 0.7 at (3, 5)",
            "timeout": "no result after 30 s", "skipped": "needs sm_100"}
    for i, (status, msg) in enumerate(msgs.items()):
        db.record(H200, prob, Measurement({"tile": [i]}, status, message=msg))
    stored = {r.measurement.status: r.measurement.message for r in db.measurements(H200, prob)}
    assert stored == msgs
    assert all(not r.is_winner for r in db.measurements(H200, prob))


def test_same_config_same_run_replaces_other_run_adds(db: TuningDB):
    prob = gemm(256, 256, 256)
    db.record(H200, prob, ok(64, 2.0), run_id="a")
    db.record(H200, prob, ok(64, 1.0), run_id="a")
    assert len(db) == 1 and db.best(H200, prob).time_ms == 1.0
    db.record(H200, prob, ok(64, 3.0), run_id="b")
    assert len(db) == 2 and db.best(H200, prob).time_ms == 1.0
    assert len(db.measurements(H100)) == 0 and len(db.measurements(H200)) == 2


# -- export / import / frame --------------------------------------------------------------

def _fill(db: TuningDB) -> None:
    db.record_many(H200, gemm(4096, 4096, 4096), [
        ok(128, 1.0), ok(64, 1.5),
        Measurement({"tile": [8]}, "compile_error", message='bad "quote", comma\nnewline'),
    ], run_id="run-1")
    db.record(H100, gemm(1024, 512, 256, layout="nn"), ok(32, 0.125), run_id="run-2")
    db.set_winner(H200, gemm(4096, 4096, 4096), ok(64, 1.5).config_id)


def _comparable(db: TuningDB) -> list[tuple]:
    return [(r.device, r.problem, r.measurement, r.measurement.run_id,
             r.measurement.recorded_at, r.is_winner) for r in db.measurements()]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_export_import_round_trip(tmp_path: Path, db: TuningDB, suffix: str):
    _fill(db)
    out = tmp_path / f"export{suffix}"
    assert db.export(out) == 4
    with TuningDB(tmp_path / "other.sqlite") as other:
        assert other.import_(out) == 4
        assert _comparable(other) == _comparable(db)
        # the pin travels: the slower config stays the winner even after a faster one
        other.record(H200, gemm(4096, 4096, 4096), ok(256, 0.1))
        assert other.best(H200, gemm(4096, 4096, 4096)) == ok(64, 1.5)


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_import_is_idempotent(tmp_path: Path, db: TuningDB, suffix: str):
    _fill(db)
    out = tmp_path / f"export{suffix}"
    db.export(out)
    assert db.import_(out) == 0 and len(db) == 4
    with TuningDB(tmp_path / "other.sqlite") as other:
        assert other.import_(out) == 4
        assert other.import_(out) == 0
        assert len(other) == 4


def test_import_refuses_malformed_files_and_adds_nothing(tmp_path: Path, db: TuningDB):
    _fill(db)
    out = tmp_path / "export.json"
    db.export(out)
    doc = json.loads(out.read_text())
    doc["rows"][1]["status"] = "great"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with TuningDB(tmp_path / "other.sqlite") as other:
        with pytest.raises(TuningDBError, match="row 2 is malformed"):
            other.import_(bad)
        assert len(other) == 0
        (tmp_path / "x.json").write_text("[1, 2]")
        with pytest.raises(TuningDBError, match="not a pyc_lab"):
            other.import_(tmp_path / "x.json")
        with pytest.raises(TuningDBError, match=r"\.json or \.csv"):
            other.export(tmp_path / "x.parquet")


def test_to_frame_columns_and_winners(db: TuningDB):
    _fill(db)
    df = db.to_frame()
    assert list(df.columns) == list(COLUMNS)
    expected = {"gpu_name", "compute_capability", "driver", "cuda", "op", "dtype_a", "dtype_b",
                "dtype_c", "layout", "m", "n", "k", "config_id", "config", "status", "time_ms",
                "tflops", "error", "message", "recorded_at", "is_winner"}
    assert expected <= set(df.columns)
    assert len(df) == 4
    assert df["is_winner"].sum() == 2  # one per problem
    win = df[df["is_winner"] & (df["gpu_name"] == "NVIDIA H200")].iloc[0]
    assert json.loads(win["config"]) == ok(64, 1.5).config and win["winner_source"] == "manual"
    failed = df[df["status"] == "compile_error"].iloc[0]
    assert math.isnan(failed["time_ms"]) and "newline" in failed["message"]
    assert df["recorded_at"].str.endswith("+00:00").all()


def test_empty_frame_still_has_columns(db: TuningDB):
    assert list(db.to_frame().columns) == list(COLUMNS) and len(db.to_frame()) == 0


# -- file handling: default path, WAL, closing --------------------------------------------

def test_default_path_is_in_the_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import platformdirs

    from pyc_lab.kernels.tuning import database as tuning_db

    monkeypatch.setattr(platformdirs, "user_cache_path", lambda app: tmp_path / "cache" / app)
    # conftest points default_path at a private file; this test checks the real one
    monkeypatch.setattr(tuning_db, "default_path", tuning_db.user_default_path)
    with TuningDB() as d:
        assert d.path == tmp_path / "cache" / "pyc_lab" / "tuning.sqlite"
        d.record(H200, gemm(64, 64, 64), ok(16, 0.01))
    assert d.path.is_file()


def test_wal_mode_schema_version_and_close(tmp_path: Path):
    path = tmp_path / "deep" / "er" / "t.sqlite"
    with TuningDB(path) as d:
        d.record(H200, gemm(64, 64, 64), ok(16, 0.01))
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        con.close()
    with pytest.raises(TuningDBError, match="closed"):
        d.best(H200, gemm(64, 64, 64))


# -- corruption ---------------------------------------------------------------------------

def _open_expecting_quarantine(path: Path) -> tuple[TuningDB, Path]:
    with pytest.warns(TuningDBWarning) as caught:
        d = TuningDB(path)
    assert len(d.quarantined) == 1
    moved = d.quarantined[0]
    assert any(str(moved) in str(w.message) for w in caught)
    assert moved.parent == path.parent and moved.name.startswith(f"{path.name}.corrupt-")
    assert moved.name.endswith("Z")
    return d, moved


def _works(d: TuningDB) -> None:
    d.record(H200, gemm(128, 128, 128), ok(32, 0.02))
    assert d.best(H200, gemm(128, 128, 128)) == ok(32, 0.02) and len(d) == 1


def test_garbage_file_is_quarantined_and_rebuilt(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture):
    path = tmp_path / "tuning.sqlite"
    garbage = b"this is not a database\x00\xff" * 100
    path.write_bytes(garbage)
    with caplog.at_level("WARNING", logger="pyc_lab.kernels.tuning.database"):
        d, moved = _open_expecting_quarantine(path)
    assert moved.read_bytes() == garbage
    assert any("corrupt-" in r.getMessage() for r in caplog.records)
    with d:
        assert not d.in_memory and path.is_file()
        _works(d)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a healthy file reopens without a warning
        with TuningDB(path) as again:
            assert len(again) == 1


def test_damaged_pages_fail_integrity_check(tmp_path: Path):
    path = tmp_path / "tuning.sqlite"
    with TuningDB(path) as d:
        d.record_many(H200, gemm(64, 64, 64),
                      [Measurement({"tile": [i]}, "skipped", message="x" * 500)
                       for i in range(200)])
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    raw = bytearray(path.read_bytes())
    assert raw.startswith(b"SQLite format 3\x00") and len(raw) > 20 * 4096
    raw[4096 + 100:len(raw) - 4096] = b"\xa5" * (len(raw) - 8192 - 100)
    path.write_bytes(bytes(raw))
    d, moved = _open_expecting_quarantine(path)
    with d:
        _works(d)
    assert moved.read_bytes()[:16] == b"SQLite format 3\x00"


def test_corruption_found_while_open_is_recovered(tmp_path: Path):
    path = tmp_path / "tuning.sqlite"
    d = TuningDB(path)
    d.record(H200, gemm(64, 64, 64), ok(16, 0.01))
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    with path.open("r+b") as f:  # clobbered in place under the open connection
        f.write(b"\xa5" * path.stat().st_size)
    with pytest.warns(TuningDBWarning, match="corrupt-"):
        d.record(H200, gemm(128, 128, 128), ok(32, 0.02))  # retried in a fresh file
    with d:
        assert len(d.quarantined) == 1 and d.quarantined[0].is_file()
        assert d.best(H200, gemm(128, 128, 128)) == ok(32, 0.02) and len(d) == 1


def test_unrecognised_schema_is_quarantined(tmp_path: Path):
    path = tmp_path / "tuning.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE something_else (x INTEGER)")
    con.commit()
    con.close()
    d, moved = _open_expecting_quarantine(path)
    with d:
        _works(d)
    con = sqlite3.connect(moved)
    try:  # the user's data is kept, renamed
        assert con.execute("SELECT name FROM sqlite_master").fetchone()[0] == "something_else"
    finally:
        con.close()


def test_newer_schema_it_cannot_read_is_left_untouched_not_misread(tmp_path: Path):
    """A newer pyc_lab's file whose tables this version cannot read: never set aside or
    changed (the newer install still needs it); this session runs in memory."""
    path = tmp_path / "tuning.sqlite"
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    con.execute("CREATE TABLE measurements (id INTEGER PRIMARY KEY)")
    con.commit()
    con.close()
    before = path.read_bytes()
    with pytest.warns(TuningDBWarning) as caught:
        d = TuningDB(path)
    messages = [str(w.message) for w in caught]
    assert any("newer than this pyc_lab" in m for m in messages)
    assert any("it is left as it is" in m for m in messages)
    with d:
        assert d.quarantined == [] and d.in_memory
        _works(d)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["tuning.sqlite"]


# -- migration ----------------------------------------------------------------------------

_KEY_V1 = """gpu_name TEXT NOT NULL, compute_capability TEXT NOT NULL, driver TEXT NOT NULL,
    cuda TEXT NOT NULL, op TEXT NOT NULL, dtype_a TEXT NOT NULL, dtype_b TEXT NOT NULL,
    dtype_c TEXT NOT NULL, layout TEXT NOT NULL, m INTEGER NOT NULL, n INTEGER NOT NULL,
    k INTEGER NOT NULL"""
_KEYS = ("gpu_name, compute_capability, driver, cuda, op, dtype_a, dtype_b, dtype_c, layout, "
         "m, n, k")


def _write_v1(path: Path) -> Measurement:
    """A version-1 file by hand: no ``message`` column; one measurement and its winner."""
    m = ok(128, 0.5)
    con = sqlite3.connect(path)
    con.executescript(f"""
        CREATE TABLE measurements (id INTEGER PRIMARY KEY, {_KEY_V1},
            config_id TEXT NOT NULL, config TEXT NOT NULL, status TEXT NOT NULL,
            time_ms REAL, tflops REAL, error REAL, run_id TEXT NOT NULL DEFAULT '',
            recorded_at TEXT NOT NULL, UNIQUE ({_KEYS}, config_id, run_id));
        CREATE TABLE winners ({_KEY_V1}, config_id TEXT NOT NULL,
            measurement_id INTEGER NOT NULL, source TEXT NOT NULL, updated_at TEXT NOT NULL,
            PRIMARY KEY ({_KEYS}));
        PRAGMA user_version = 1;
    """)
    key = ("NVIDIA H200", "9.0", "580.159.04", "13.0", "gemm", "f16", "f16", "f32", "tn",
           4096, 4096, 4096)
    con.execute(f"INSERT INTO measurements (id, {_KEYS}, config_id, config, status, time_ms, "
                "tflops, error, run_id, recorded_at) VALUES (1, ?,?,?,?,?,?,?,?,?,?,?,?, "
                "?,?,?,?,?,?,?,?)",
                (*key, m.config_id, json.dumps(m.config), "ok", m.time_ms, m.tflops, m.error,
                 "old-run", "2024-01-01T00:00:00+00:00"))
    con.execute(f"INSERT INTO winners ({_KEYS}, config_id, measurement_id, source, "
                "updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?, ?, 1, 'auto', ?)",
                (*key, m.config_id, "2024-01-01T00:00:00+00:00"))
    con.commit()
    con.close()
    return m


def test_migration_from_version_1_keeps_the_data(tmp_path: Path):
    path = tmp_path / "tuning.sqlite"
    old = _write_v1(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a migration is not a corruption
        d = TuningDB(path)
    with d:
        assert d.quarantined == []
        prob = gemm(4096, 4096, 4096)
        assert d.best(H200, prob) == old
        rec = d.measurements()[0].measurement
        assert rec.message == "" and rec.run_id == "old-run"
        d.record(H200, prob, Measurement({"tile": [1]}, "timeout", message="too slow"))
        assert {r.measurement.message for r in d.measurements()} == {"", "too slow"}
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        cols = {r[1] for r in con.execute("PRAGMA table_info(measurements)")}
        assert "message" in cols
    finally:
        con.close()


# -- concurrency --------------------------------------------------------------------------

N_EACH = 200


def _writer(path: str, tag: str, barrier) -> None:
    """Child process: record N_EACH measurements one transaction at a time."""
    warnings.simplefilter("error", TuningDBWarning)  # no quarantine, no in-memory fallback
    barrier.wait(timeout=60)
    with TuningDB(path) as d:
        assert not d.in_memory and d.path == Path(path)
        for i in range(N_EACH):
            size = 256 * (1 + i % 4)
            d.record(H200, gemm(size, size, size),
                     Measurement({"tile": [i], "writer": tag}, "ok", time_ms=1.0 + i))


def test_two_processes_write_at_once_and_lose_nothing(tmp_path: Path):
    path = tmp_path / "shared.sqlite"  # created by the racing writers themselves
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(str(path), tag, barrier)) for tag in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    with TuningDB(path) as d:
        assert d.quarantined == []
        rows = d.measurements()
        assert len(rows) == 2 * N_EACH
        by_writer = {"a": 0, "b": 0}
        for r in rows:
            by_writer[r.measurement.config["writer"]] += 1
        assert by_writer == {"a": N_EACH, "b": N_EACH}
        assert len({r.measurement.run_id for r in rows}) == 2
        # 4 problems, each with exactly one winner: time 1.0 (i = 0) for size 256
        assert sum(r.is_winner for r in rows) == 4
        assert d.best(H200, gemm(256, 256, 256)).time_ms == 1.0
