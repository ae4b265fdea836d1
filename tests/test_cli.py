"""The pyc-lab command."""

from __future__ import annotations

import json
import subprocess
import sys

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
