"""The pyc-lab command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import pyc_lab as pl
from pyc_lab.cli import main


def test_hw_prints_the_topology(capsys):
    assert main(["hw"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("HardwareProfile (live)")
    assert "NUMA 0" in out


def test_hw_snapshot_prints_the_link_matrix(capsys):
    assert main(["hw", "--snapshot", "dgx-h100"]) == 0
    out = capsys.readouterr().out
    assert "CPU Affinity" in out and out.count("NV18") == 56


def test_hw_save_writes_a_loadable_snapshot(tmp_path, capsys):
    path = tmp_path / "me.json"
    assert main(["hw", "--save", str(path)]) == 0
    again = pl.detect_hardware(snapshot=path)
    assert again.host.threads == pl.detect_hardware().host.threads


def test_hw_json_is_the_profile(capsys):
    assert main(["hw", "--json", "--snapshot", "h200"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpus"][0]["name"] == "NVIDIA H200"


def test_hw_bandwidth_measures_and_writes_csv(tmp_path, capsys):
    csv = tmp_path / "bw.csv"
    assert main(["hw", "--bandwidth", "--sizes", "4096,65536", "--bandwidth-csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "Copy bandwidth" in out
    assert csv.read_text().startswith("kind,device,peer,size_bytes")


def test_errors_are_one_line_with_exit_code_2(capsys):
    assert main(["hw", "--snapshot", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyc-lab: error: no hardware snapshot 'nowhere'")
    assert "Traceback" not in err


def test_console_script_module_runs():
    run = subprocess.run([sys.executable, "-m", "pyc_lab.cli", "hw", "-s", "h200"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "GPU0: NVIDIA H200" in run.stdout


# -- pyc-lab tune gemm ----------------------------------------------------------------------


def test_tune_replay_says_it_replays_and_prints_the_comparison(capsys):
    assert main(["tune", "gemm", "4096", "4096", "4096", "--dtype", "f16", "--replay",
                 "--strategy", "exhaustive"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("Replaying the tuning of GEMM 4096x4096x4096 f16 tn recorded "
                               "on NVIDIA H200, ")
    assert "no kernel is built or run here (h200-gemm.json (shipped with pyc_lab)" in lines[0]
    assert lines[1] == "strategy exhaustive, budget 180 s, at most 16 candidates"
    progress = [line for line in lines if line.startswith("  [")]
    assert progress and all(line.endswith("(recorded)") for line in progress)
    res = pl.replay_autotune(4096, 4096, 4096, dtype="f16", strategy="exhaustive")
    assert len(progress) == len(res.table)
    assert f"recorded {res.best.time_ms:.4f} ms" in out
    assert "tuned CUTLASS" in out and "recorded on NVIDIA H200" in lines[-1]


def test_tune_replay_of_an_export_as_json(tmp_path, capsys):
    from tests.fakes.tuning_recording import CUBLAS_MS, write_recording

    rec = write_recording(tmp_path / "run.json")
    assert main(["tune", "gemm", "2048", "2048", "2048", "--dtype", "f16", "--replay",
                 str(rec.path), "--max-candidates", "0", "--budget", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "replay"
    assert data["replay"]["source"] == str(rec.path)
    assert data["replay"]["label"] == "recorded on NVIDIA H200, 2026-11-30"
    assert data["best"]["ms"] == rec.fastest_ms
    assert data["baselines"]["cublas"] == CUBLAS_MS
    assert len(data["candidates"]) == 24
    assert {c["status"] for c in data["candidates"]} == {"ok", "compile_error",
                                                         "wrong_result", "nan"}


def test_tune_without_a_gpu_and_without_replay_exits_2(capsys):
    from pyc_lab.hardware.device import no_gpu_reason

    reason = no_gpu_reason()
    if reason is None:
        pytest.skip("a GPU is present: tune would tune live")
    assert main(["tune", "gemm", "512", "512", "512"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyc-lab: error: live tuning builds and times kernels on a GPU and "
                          f"needs a CUDA device: {reason}. Add --replay")
    assert "pyc-lab tune gemm 512 512 512 --dtype f16 --replay" in err
    assert "Traceback" not in err


def test_tune_replay_of_an_unrecorded_problem_exits_2(capsys):
    assert main(["tune", "gemm", "100", "100", "100", "--replay"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyc-lab: error: no recorded tuning of GEMM 100x100x100 f16 tn")
    assert "; recorded: " in err and "4096x4096x4096 f16 tn" in err
    assert main(["tune", "gemm", "8", "8", "8", "--budget", "-1", "--replay"]) == 2
    assert "--budget -1" in capsys.readouterr().err


def test_cache_and_db_move_a_tuned_set_between_machines(tmp_path, monkeypatch, capsys):
    import platformdirs

    from pyc_lab.kernels.cache import KernelCache
    from pyc_lab.kernels.tuning import database as tuning_db

    here, there = tmp_path / "here", tmp_path / "there"
    monkeypatch.setattr(platformdirs, "user_cache_path", lambda app: here / app)
    src = tmp_path / "kernel.cu"
    src.write_text("// a kernel\n")
    KernelCache().put("ab" * 32, {"kernel.cu": src}, meta={"note": "x"})
    device = tuning_db.DeviceKey("NVIDIA H200", "9.0", "580.00", "13.0")
    problem = tuning_db.ProblemKey("gemm", "f16", "f16", "f16", "tn", 64, 64, 64)
    with tuning_db.TuningDB() as db:
        db.record(device, problem, tuning_db.Measurement({"tile": [1]}, "ok", 0.5))
    assert main(["cache", "export", str(tmp_path / "k.tar.gz")]) == 0
    assert main(["db", "export", str(tmp_path / "t.json")]) == 0
    assert "1 kernel-cache entries exported" in capsys.readouterr().out
    # the other machine: an empty cache and database
    monkeypatch.setattr(platformdirs, "user_cache_path", lambda app: there / app)
    monkeypatch.setattr(tuning_db, "default_path", lambda: there / "t.sqlite")
    assert main(["cache", "import", str(tmp_path / "k.tar.gz")]) == 0
    assert main(["db", "import", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "1 kernel-cache entries imported" in out and "1 tuning-database rows" in out
    assert KernelCache().get("ab" * 32).meta["note"] == "x"
    with tuning_db.TuningDB() as db:
        assert db.best(device, problem).time_ms == 0.5
    assert main(["cache", "import", str(tmp_path / "t.json")]) == 2  # not an export
    assert "not a kernel-cache export" in capsys.readouterr().err


# -- every error of hw, cache and db is one line and exit code 2 ----------------------------


def test_an_error_message_of_several_lines_is_printed_on_one(monkeypatch, capsys):
    import pyc_lab.hardware

    def fails(*args, **kwargs):
        raise pl.PycLabError("first line\n  second line\n")

    monkeypatch.setattr(pyc_lab.hardware, "detect_hardware", fails)
    assert main(["hw"]) == 2
    assert capsys.readouterr().err == "pyc-lab: error: first line; second line\n"


def test_bandwidth_csv_into_a_missing_folder_fails_before_measuring(tmp_path, monkeypatch,
                                                                   capsys):
    import pyc_lab.profiling

    def never(*args, **kwargs):
        raise AssertionError("measured although the CSV cannot be written")

    monkeypatch.setattr(pyc_lab.profiling, "probe_bandwidth", never)
    target = tmp_path / "missing" / "bw.csv"
    assert main(["hw", "--bandwidth", "--bandwidth-csv", str(target)]) == 2
    err = capsys.readouterr().err
    assert err == (f"pyc-lab: error: --bandwidth-csv {target}: folder {target.parent} does "
                   "not exist; create it first\n")


def test_copy_sizes_too_large_for_memory_are_one_line(monkeypatch, capsys):
    import pyc_lab.profiling

    def too_big(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(pyc_lab.profiling, "probe_bandwidth", too_big)
    assert main(["hw", "--bandwidth", "--sizes", "4096,99999999999999"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyc-lab: error: --sizes 99999999999999: not enough memory")


@pytest.mark.parametrize("command", [["cache", "import"], ["db", "import"]])
def test_importing_a_missing_file_is_one_line(tmp_path, monkeypatch, capsys, command):
    from pyc_lab.kernels.tuning import database as tuning_db

    monkeypatch.setenv("PYC_LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "t.sqlite")
    suffix = ".tar.gz" if command[0] == "cache" else ".json"
    assert main([*command, str(tmp_path / f"nowhere{suffix}")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyc-lab: error: ") and err.count("\n") == 1
    assert "nowhere" in err and "Traceback" not in err


@pytest.mark.parametrize("command", [["cache", "export"], ["db", "export"]])
def test_exporting_into_a_missing_folder_is_one_line(tmp_path, monkeypatch, capsys, command):
    from pyc_lab.kernels.tuning import database as tuning_db

    monkeypatch.setenv("PYC_LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "t.sqlite")
    suffix = ".tar.gz" if command[0] == "cache" else ".json"
    target = tmp_path / "missing" / f"x{suffix}"
    assert main([*command, str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyc-lab: error: cannot export") and err.count("\n") == 1
    assert f"folder {target.parent} does not exist; create it first" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["hw", "--bandwidth", "--sizes", "4096,abc"],
     "argument --sizes: 'abc' is not a number of bytes; give whole numbers separated by "
     "commas, e.g. --sizes 4096,1048576"),
    (["hw", "--bandwidth", "--sizes", "4096,0"],
     "argument --sizes: 0 is not a positive number of bytes"),
    (["tune", "gemm", "-5", "64", "64", "--replay"],
     "argument M: -5 is not a positive dimension; give a whole number >= 1"),
    (["tune", "gemm", "a", "64", "64"], "argument M: 'a' is not a whole number"),
])
def test_bad_values_are_named_by_their_argument(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "<lambda>" not in err and "Traceback" not in err


@pytest.mark.parametrize(("argv", "message"), [
    (["tune", "gemm", "64", "64", "64", "--replay", "/nope.json"],
     "--replay /nope.json: no such file; give a tuning-database export (a .json or .csv file "
     "written by `pyc-lab db export FILE`), or --replay alone for the H200 recording shipped "
     "with pyc_lab"),
    (["tune", "gemm", "64", "64", "64", "--replay", "{tmp}"], "a folder, not a file"),
    (["tune", "gemm", "64", "64", "64", "--replay", "{tmp}/notes.txt"],
     "a recording is a tuning-database export, a .json or .csv file"),
    (["db", "import", "/nope.json"],
     "db import /nope.json: no such file; give a file written by `pyc-lab db export FILE`"),
    (["cache", "import", "/nope.tar.gz"], "cache import /nope.tar.gz: no such file"),
    (["hw", "--sizes", "4096"], "--sizes applies to the bandwidth measurement; add --bandwidth"),
    (["hw", "--bandwidth-csv", "bw.csv"], "--bandwidth-csv applies to the bandwidth"),
    (["hw", "--save", "/missing/dir/x.json"],
     "cannot save the hardware profile to /missing/dir/x.json: folder /missing/dir does not "
     "exist; create it first"),
])
def test_file_and_flag_errors_are_one_line_and_name_the_file(tmp_path, capsys, argv, message):
    (tmp_path / "notes.txt").write_text("not a recording")
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing printed before the error
    err = captured.err
    assert err.startswith("pyc-lab: error: ") and err.count("\n") == 1
    assert message.format(tmp=tmp_path) in err
    assert "source=None" not in err and "Traceback" not in err


def test_bandwidth_with_a_snapshot_is_refused_before_printing(capsys):
    assert main(["hw", "--bandwidth", "--snapshot", "h200"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--bandwidth measures this machine; drop --snapshot" in captured.err


def test_tune_help_states_the_options_defaults(capsys):
    from pyc_lab.kernels.tuning.options import GemmTuneOptions

    defaults = GemmTuneOptions()
    with pytest.raises(SystemExit):
        main(["tune", "gemm", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"default {defaults.dtype}" in text
    assert f"(default: {defaults.layout})" in text
    assert f"(default: {defaults.strategy})" in text
    assert f"default {defaults.budget_s:g})" in text
    assert f"default {defaults.max_candidates})" in text
