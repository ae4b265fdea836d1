"""The tuning database's file: read-only files and folders, newer schemas, impossible
paths, exports, and readers beside writers in other processes.

Read-only here means two things. ``TuningDB(path, read_only=True)`` opens with SQLite's
``mode=ro`` and works for every user, root included. A file or folder made read-only with
``chmod`` binds only a process without ``CAP_DAC_OVERRIDE``: those tests run their
reader in such a child process (see ``tests/kernels/readonly.py``), or skip saying why.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sqlite3
import stat
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

from pyc_lab.cli import main
from pyc_lab.kernels.tuning.database import TuningDB
from pyc_lab.kernels.tuning.keys import (
    DeviceKey,
    Measurement,
    ProblemKey,
    TuningDBError,
    TuningDBWarning,
)
from pyc_lab.kernels.tuning.sqlite_file import SCHEMA_VERSION
from tests.kernels.readonly import run_read_only_child

H200 = DeviceKey("NVIDIA H200", "9.0", "580.159.04", "13.0")


def gemm(size: int) -> ProblemKey:
    return ProblemKey("gemm", "f16", "f16", "f32", "tn", size, size, size)


def ok(tile: int, time_ms: float) -> Measurement:
    return Measurement({"tile": [tile, tile, 64]}, "ok", time_ms=time_ms)


def _filled(path: Path) -> Path:
    with TuningDB(path) as db:
        db.record_many(H200, gemm(4096), [ok(128, 1.0), ok(64, 2.0)])
        db.record(H200, gemm(1024), ok(32, 0.1))
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _writes_refused(db: TuningDB, path: Path, tmp_path: Path) -> None:
    """Every kind of write raises the read-only error naming the file; nothing changes."""
    export = tmp_path / "rows.json"
    db.export(export)  # reading is fine
    for write in (lambda: db.record(H200, gemm(4096), ok(256, 0.5)),
                  lambda: db.record_many(H200, gemm(512), [ok(8, 1.0)]),
                  lambda: db.set_winner(H200, gemm(4096), ok(64, 2.0).config_id),
                  lambda: db.clear_winner(H200, gemm(4096)),
                  lambda: db.import_(export)):
        with pytest.raises(TuningDBError) as info:
            write()
        message = str(info.value)
        assert f"tuning database {path} is read-only (" in message
        assert "nothing was written" in message and "TuningDB(':memory:')" in message


# -- read-only ------------------------------------------------------------------------------

def test_read_only_serves_lookups_and_refuses_writes(tmp_path: Path):
    path = _filled(tmp_path / "tuning.sqlite")
    before = _digest(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked for: no warning
        db = TuningDB(path, read_only=True)
    with db:
        assert db.read_only and not db.in_memory and db.path == path
        assert db.read_only_reason == "opened with read_only=True"
        assert "read-only" in repr(db)
        assert db.best(H200, gemm(4096)) == ok(128, 1.0)
        assert db.lookup(H200, gemm(2000)).match == "bucket" and len(db) == 3
        _writes_refused(db, path, tmp_path)
        assert len(db) == 3
    assert _digest(path) == before


def test_a_missing_file_opened_read_only_is_not_created(tmp_path: Path):
    path = tmp_path / "none.sqlite"
    with pytest.warns(TuningDBWarning, match="does not exist, and read-only it is not created"):
        db = TuningDB(path, read_only=True)
    with db:
        assert db.in_memory and db.read_only and db.best(H200, gemm(64)) is None
        with pytest.raises(TuningDBError, match="is read-only"):
            db.record(H200, gemm(64), ok(8, 1.0))
    assert not path.exists()


def test_a_read_only_old_schema_is_migrated_in_memory_not_on_disk(tmp_path: Path):
    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE measurements (id INTEGER PRIMARY KEY, gpu_name TEXT, compute_capability
            TEXT, driver TEXT, cuda TEXT, op TEXT, dtype_a TEXT, dtype_b TEXT, dtype_c TEXT,
            layout TEXT, m INTEGER, n INTEGER, k INTEGER, config_id TEXT, config TEXT,
            status TEXT, time_ms REAL, tflops REAL, error REAL, run_id TEXT, recorded_at TEXT);
        CREATE TABLE winners (gpu_name TEXT, compute_capability TEXT, driver TEXT, cuda TEXT,
            op TEXT, dtype_a TEXT, dtype_b TEXT, dtype_c TEXT, layout TEXT, m INTEGER,
            n INTEGER, k INTEGER, config_id TEXT, measurement_id INTEGER, source TEXT,
            updated_at TEXT);
        PRAGMA user_version = 1;
    """)
    m = ok(128, 0.5)
    key = ("NVIDIA H200", "9.0", "580.159.04", "13.0", "gemm", "f16", "f16", "f32", "tn",
           4096, 4096, 4096)
    con.execute("INSERT INTO measurements VALUES (1, ?,?,?,?,?,?,?,?,?,?,?,?, ?,?,?,?,?,?,?,?)",
                (*key, m.config_id, json.dumps(m.config), "ok", 0.5, None, None, "r", "t"))
    con.execute("INSERT INTO winners VALUES (?,?,?,?,?,?,?,?,?,?,?,?, ?, 1, 'auto', 't')",
                (*key, m.config_id))
    con.commit()
    con.close()
    before = _digest(path)
    with TuningDB(path, read_only=True) as db:
        assert db.best(H200, gemm(4096)) == m
        assert db.measurements()[0].measurement.message == ""
    assert _digest(path) == before
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 1
    con.close()


_CHILD = textwrap.dedent("""
    import json, sys, warnings
    from pathlib import Path
    from pyc_lab.kernels.tuning.database import TuningDB
    from pyc_lab.kernels.tuning.keys import DeviceKey, Measurement, ProblemKey, TuningDBError

    path = Path(sys.argv[1])
    if sys.argv[2] == "lies":  # access() answers "writable" (some ACL or NFS setups)
        import os
        os.access = lambda *args, **kwargs: True
    dev = DeviceKey("NVIDIA H200", "9.0", "580.159.04", "13.0")
    prob = ProblemKey("gemm", "f16", "f16", "f32", "tn", 4096, 4096, 4096)
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        db = TuningDB(path)
        out["read_only"], out["in_memory"] = db.read_only, db.in_memory
        out["reason"] = db.read_only_reason
        best = db.best(dev, prob)
        out["best_ms"] = None if best is None else best.time_ms
        out["rows"] = len(db)
        try:
            db.record(dev, prob, Measurement({"tile": [1]}, "ok", time_ms=0.1))
            out["write"] = "no error"
        except TuningDBError as exc:
            out["write"] = str(exc)
    out["warnings"] = [str(w.message) for w in caught]
    print(json.dumps(out))
""")


@pytest.mark.parametrize("what", ["file", "folder"])
@pytest.mark.parametrize("access", ["true", "lies"])
def test_a_read_only_file_or_folder_is_opened_read_only_not_replaced(tmp_path: Path, what,
                                                                     access):
    """Made read-only with chmod; read by a process those bits bind (also under root).

    With ``access="lies"`` the child's ``os.access`` says everything is writable, so only
    SQLite's own refusal can tell: the result must be the same.
    """
    folder = tmp_path / "shared"
    folder.mkdir()
    path = _filled(folder / "tuning.sqlite")
    before = _digest(path)
    locked = path if what == "file" else folder
    locked.chmod(0o444 if what == "file" else 0o555)
    try:
        run = run_read_only_child(_CHILD, str(path), access)
    finally:
        locked.chmod(0o644 if what == "file" else 0o755)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert not out["in_memory"], out
    if access == "true":
        assert out["read_only"] and "not writable" in out["reason"], out
    elif what == "folder":
        assert out["read_only"] and "SQLite cannot write it" in out["reason"], out
    assert out["best_ms"] == 1.0 and out["rows"] == 3
    assert out["write"].startswith(f"tuning database {path} is read-only (")
    assert out["warnings"] == []  # a read-only file is served, not worth a warning
    assert _digest(path) == before
    assert sorted(p.name for p in folder.iterdir() if "corrupt" in p.name) == []


# -- newer schema ---------------------------------------------------------------------------

def _newer(path: Path) -> None:
    """What a newer pyc_lab might do: a new column and table, a higher version."""
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE measurements ADD COLUMN power_w REAL")
    con.execute("CREATE TABLE sessions (id TEXT)")
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.commit()
    con.close()


def test_a_newer_schema_is_opened_read_only_with_a_warning_and_left_untouched(tmp_path):
    path = _filled(tmp_path / "tuning.sqlite")
    _newer(path)
    before = _digest(path)
    with pytest.warns(TuningDBWarning, match=rf"schema version {SCHEMA_VERSION + 1} is newer "
                                             r"than this pyc_lab understands .* opened "
                                             r"read-only"):
        db = TuningDB(path)
    with db:
        assert db.read_only and not db.in_memory and db.quarantined == []
        assert db.best(H200, gemm(4096)) == ok(128, 1.0) and len(db) == 3
        _writes_refused(db, path, tmp_path)
    assert _digest(path) == before
    assert [p.name for p in tmp_path.iterdir() if "corrupt" in p.name] == []
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    con.close()


def test_the_cli_refuses_to_import_into_a_newer_database(tmp_path, monkeypatch, capsys):
    from pyc_lab.kernels.tuning import database as tuning_db

    path = _filled(tmp_path / "tuning.sqlite")
    export = tmp_path / "rows.json"
    with TuningDB(path) as db:
        db.export(export)
    _newer(path)
    monkeypatch.setattr(tuning_db, "default_path", lambda: path)
    with pytest.warns(TuningDBWarning, match="newer"):
        assert main(["db", "export", str(tmp_path / "again.json")]) == 0
    with pytest.warns(TuningDBWarning, match="newer"):
        assert main(["db", "import", str(export)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pyc-lab: error: tuning database {path} is read-only (schema")
    assert err.count("\n") == 1


# -- impossible paths and exports -------------------------------------------------------------

def test_a_path_under_a_file_or_a_folder_as_path_is_one_clear_error(tmp_path: Path):
    (tmp_path / "passwd").write_text("root:x:0:0")
    with pytest.raises(TuningDBError, match=r"passwd is a file, not a folder; pass a path "
                                            r"inside a folder"):
        TuningDB(tmp_path / "passwd" / "x.sqlite")
    with pytest.raises(TuningDBError, match=r"passwd is a file, not a folder"):
        TuningDB(tmp_path / "passwd" / "deeper" / "x.sqlite")
    with pytest.raises(TuningDBError, match="is a folder or a special file"):
        TuningDB(tmp_path)
    assert (tmp_path / "passwd").read_text() == "root:x:0:0"
    assert [p.name for p in tmp_path.iterdir()] == ["passwd"]  # nothing renamed aside


def test_the_cli_with_a_cache_dir_under_a_file_exits_2(tmp_path, monkeypatch, capsys):
    from pyc_lab.kernels.tuning import database as tuning_db

    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("PYC_LAB_CACHE_DIR", str(tmp_path / "file"))
    monkeypatch.setattr(tuning_db, "default_path", tuning_db.user_default_path)
    for command in (["db", "export", str(tmp_path / "t.json")],
                    ["cache", "export", str(tmp_path / "k.tar.gz")]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.startswith("pyc-lab: error: ") and err.count("\n") == 1, err
        assert "file" in err


def test_exporting_into_a_missing_folder_is_one_clear_error(tmp_path, monkeypatch, capsys):
    from pyc_lab.kernels.tuning import database as tuning_db

    path = _filled(tmp_path / "tuning.sqlite")
    with TuningDB(path) as db:
        for suffix in (".json", ".csv"):
            with pytest.raises(TuningDBError, match=r"folder \S* does not exist; create it "):
                db.export(tmp_path / "missing" / f"x{suffix}")
        target = tmp_path / "x.json"
        target.write_text("an earlier export")
        assert db.export(target) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuning.sqlite", "x.json"]
    monkeypatch.setattr(tuning_db, "default_path", lambda: path)
    assert main(["db", "export", str(tmp_path / "missing" / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyc-lab: error: cannot export the tuning database to ")


# -- readers beside writers -------------------------------------------------------------------

N_EACH = 60


def _writer(path: str, tag: str, barrier) -> None:
    warnings.simplefilter("error", TuningDBWarning)
    barrier.wait(timeout=120)
    with TuningDB(path) as d:
        for i in range(N_EACH):
            size = 256 * (1 + i % 4)
            d.record(H200, gemm(size), Measurement({"tile": [i], "writer": tag}, "ok",
                                                   time_ms=1.0 + i))


def _reader(path: str, read_only: bool, barrier, result) -> None:
    """Read until every row is there: counts never go down, no warning, and (read-only)
    each opening sees a consistent database and refuses a write."""
    warnings.simplefilter("error", TuningDBWarning)
    barrier.wait(timeout=120)
    seen, reads, refused = 0, 0, 0
    deadline = time.monotonic() + 120
    kept = None if read_only else TuningDB(path)
    while seen < 2 * N_EACH and time.monotonic() < deadline:
        db = TuningDB(path, read_only=True) if read_only else kept
        count = len(db)
        assert count >= seen, (count, seen)
        seen = count
        for r in db.measurements():
            assert r.measurement.ok and r.measurement.config["writer"] in "ab"
        db.lookup(H200, gemm(300))
        reads += 1
        if read_only:
            try:
                db.record(H200, gemm(64), ok(1, 1.0))
            except TuningDBError:
                refused += 1
            db.close()
    if kept is not None:
        kept.close()
    result.put((read_only, seen, reads, refused))


def test_writers_and_readers_in_other_processes_at_once(tmp_path: Path):
    path = str(tmp_path / "shared.sqlite")
    TuningDB(path).close()  # an empty database: creating it in a race is another test's
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    result = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, tag, barrier)) for tag in "ab"]
    procs += [ctx.Process(target=_reader, args=(path, ro, barrier, result))
              for ro in (False, True)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    outcomes = sorted(result.get(timeout=10) for _ in range(2))
    for read_only, seen, reads, refused in outcomes:
        assert seen == 2 * N_EACH and reads >= 1
        assert refused == (reads if read_only else 0)
    with TuningDB(path) as d:
        assert d.quarantined == [] and len(d) == 2 * N_EACH
        assert sum(r.is_winner for r in d.measurements()) == 4


def _read_pipe(path: Path) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def read() -> None:
        with path.open("rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, got


def test_exports_follow_links_and_write_pipes_in_place(tmp_path: Path):
    path = _filled(tmp_path / "tuning.sqlite")
    real = tmp_path / "exports" / "2026.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    pipe = tmp_path / "pipe.csv"
    os.mkfifo(pipe)
    with TuningDB(path) as db:
        assert db.export(link) == 3
        assert link.is_symlink() and json.loads(real.read_text())["rows"]
        reader, got = _read_pipe(pipe)
        assert db.export(pipe) == 3  # written into the pipe, not replaced by a file
        reader.join(timeout=30)
        assert stat.S_ISFIFO(os.lstat(pipe).st_mode)
        assert got and got[0].startswith(b"gpu_name,compute_capability")
        with pytest.raises(TuningDBError, match="is not a regular file"):
            db.import_(pipe)  # refused at once, never blocks waiting for a writer


def test_lookup_near_the_largest_extent(tmp_path: Path):
    from pyc_lab.kernels.tuning.keys import MAX_EXTENT

    with TuningDB(tmp_path / "t.sqlite") as db:
        huge = ProblemKey("gemm", "f16", "f16", "f32", "tn", MAX_EXTENT, 2**62, 8)
        db.record(H200, huge, ok(8, 1.0))
        assert db.lookup(H200, huge).match == "exact"
        near = ProblemKey("gemm", "f16", "f16", "f32", "tn", 2**62, 2**62, 8)
        assert db.lookup(H200, near).problem_matched == huge
