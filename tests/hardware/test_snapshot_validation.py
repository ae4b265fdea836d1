"""Snapshots are checked field by field when loaded: a wrong type is a SnapshotError that
names the field and the type expected (never a crash later in ``pyc-lab hw`` or
``%pyc_hw``); unreadable files are SnapshotErrors too; fields from a newer pyc_lab are
ignored with a log record."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import pyc_lab as pl
from pyc_lab.cli import main
from pyc_lab.errors import PycLabError, SnapshotError
from pyc_lab.hardware import HardwareProfile, detect_hardware
from pyc_lab.hardware import profile as profile_module


@pytest.fixture
def data() -> dict:
    """The shipped H200 snapshot as parsed JSON (one GPU, one NUMA node)."""
    return json.loads(detect_hardware(snapshot="h200").to_json())


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("damage", "field", "expected"), [
    (lambda d: d["gpus"][0].update(memory_total_bytes="141 GB"),
     "gpus[0].memory_total_bytes", "must be an integer or null, got '141 GB' (a string)"),
    (lambda d: d["gpus"][0].update(sm_count=132.5), "gpus[0].sm_count",
     "must be an integer or null, got 132.5 (a number)"),
    (lambda d: d["host"].update(sockets=True), "host.sockets",
     "must be an integer or null, got True (true/false)"),
    (lambda d: d["gpus"][0].update(name=5), "gpus[0].name", "must be a string or null"),
    (lambda d: d["gpus"][0].update(index="0"), "gpus[0].index", "must be an integer, got '0'"),
    (lambda d: d["gpus"][0]["sources"].update(name=1), "gpus[0].sources",
     "must be an object of strings"),
    (lambda d: d["host"]["fallbacks"].update(cores="sysfs"), "host.fallbacks",
     "must be an object of lists of strings"),
    (lambda d: d.update(cuda_status=None), "cuda_status", "must be a string, got None (null)"),
    (lambda d: d.update(links=[{"a": 0, "b": 1, "p2p": "yes"}]), "links[0].p2p",
     "must be true or false or null"),
    (lambda d: d["host"].update(numa_nodes={"0": {}}), "host.numa_nodes",
     "must be a list of objects"),
    (lambda d: d.update(gpus=["GPU0"]), "gpus[0]", "must be an object, got 'GPU0'"),
    (lambda d: d["host"].update(process_affinity=7), "host.process_affinity",
     "must be a CPU list string such as '0-3,8' or null, got 7"),
    (lambda d: d["host"]["numa_nodes"][0].update(cpus=None), "host.numa_nodes[0].cpus",
     "must be a CPU list string"),
    (lambda d: d["gpus"][0].update(cpu_affinity="0-99999999999"), "gpus[0].cpu_affinity",
     "names CPU ids beyond 65535"),
    (lambda d: d["gpus"][0].pop("index"), "gpus[0].index", "is missing (an integer expected)"),
])
def test_a_wrongly_typed_field_is_named_with_the_type_expected(tmp_path, data, damage, field,
                                                               expected):
    damage(data)
    path = _write(tmp_path, data)
    for load in (lambda: HardwareProfile.from_json(path),
                 lambda: detect_hardware(snapshot=str(path)),
                 lambda: HardwareProfile.from_dict(data)):
        with pytest.raises(SnapshotError) as info:
            load()
        message = str(info.value)
        assert f"{field} {expected}" in message, message
        assert "hardware profile is malformed" in message and "\n" not in message
    with pytest.raises(SnapshotError) as info:
        HardwareProfile.from_json(path)
    assert f"malformed ({path})" in str(info.value)


def test_pyc_lab_hw_and_pyc_hw_refuse_a_bad_snapshot_in_one_line(tmp_path, data, capsys):
    data["gpus"][0]["memory_total_bytes"] = "141 GB"
    path = _write(tmp_path, data)
    assert main(["hw", "--snapshot", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyc-lab: error: hardware profile is malformed")
    assert "gpus[0].memory_total_bytes" in err and err.count("\n") == 1
    assert "Traceback" not in err

    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "pyc_lab")
    try:
        with capture_output() as cap:
            result = shell.run_cell(f"%pyc_hw --snapshot {path}")
        assert not result.success
        assert "gpus[0].memory_total_bytes must be an integer" in cap.stderr + cap.stdout
        assert "Traceback" not in cap.stderr + cap.stdout
    finally:
        shell.run_line_magic("unload_ext", "pyc_lab")


def test_fields_of_a_newer_version_are_ignored_with_a_log_record(data, caplog):
    original = HardwareProfile.from_dict(json.loads(json.dumps(data)))
    data["liquid_cooling"] = {"loops": 2}
    data["gpus"][0]["hbm_stacks"] = 6
    data["host"]["numa_nodes"][0]["distance"] = [10]
    with caplog.at_level(logging.INFO, logger="pyc_lab.hardware.profile"):
        loaded = HardwareProfile.from_dict(data)
    assert loaded == original
    notes = " ".join(r.getMessage() for r in caplog.records)
    assert "['liquid_cooling']" in notes and "['hbm_stacks'] of gpus[0]" in notes
    assert "['distance'] of host.numa_nodes[0]" in notes


def test_a_non_utf8_file_is_a_snapshot_error(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes('{"host": {"cpu_model": "Xeon® Gold"}, "gpus": []}'.encode("latin-1"))
    with pytest.raises(SnapshotError, match=r"is not UTF-8 text \(byte 0xae at offset 28\)"):
        detect_hardware(snapshot=path)
    assert main(["hw", "--snapshot", str(path)]) == 2


def test_deeply_nested_or_huge_files_are_snapshot_errors(tmp_path, monkeypatch):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SnapshotError, match="nested too deeply"):
        HardwareProfile.from_json(deep)
    with pytest.raises(SnapshotError, match="nested too deeply"):
        HardwareProfile.from_json("[" * 100_000 + "]" * 100_000)
    monkeypatch.setattr(profile_module, "MAX_SNAPSHOT_BYTES", 1000)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"host": {}, "gpus": [], "description": "x" * 2000}))
    with pytest.raises(SnapshotError, match="more than the 1000 a profile can take"):
        HardwareProfile.from_json(big)


def test_a_snapshot_that_is_not_a_file_name_or_a_plain_shipped_name(tmp_path):
    with pytest.raises(SnapshotError, match="not int 5"):
        detect_hardware(snapshot=5)  # type: ignore[arg-type]
    # "../snapshots/h200" is no shipped name: only plain names are looked up there
    with pytest.raises(SnapshotError, match=r"no hardware snapshot '\.\./snapshots/h200'"):
        detect_hardware(snapshot="../snapshots/h200")


def test_saving_into_a_missing_folder_is_one_clear_error(tmp_path, capsys):
    target = tmp_path / "missing" / "dir" / "x.json"
    with pytest.raises(PycLabError, match=r"folder \S*missing/dir does not exist; create it"):
        detect_hardware(snapshot="h200").to_json(target)
    assert main(["hw", "--snapshot", "h200", "--save", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyc-lab: error: cannot save the hardware profile") and \
        err.count("\n") == 1
    assert not target.parent.exists()


def test_saving_replaces_a_snapshot_whole(tmp_path):
    target = tmp_path / "x.json"
    pl.detect_hardware(snapshot="dgx-h100").to_json(target)
    pl.detect_hardware(snapshot="h200").to_json(target)
    assert len(HardwareProfile.from_json(target).gpus) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no partial file left


def test_saving_through_a_link_replaces_the_file_it_names(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "me.json"
    link.symlink_to(real)
    detect_hardware(snapshot="h200").to_json(link)
    assert link.is_symlink() and len(HardwareProfile.from_json(real).gpus) == 1
