"""The configuration space: from cutlass_cppgen where it is installed, else from the table
pyc_lab ships (so that notebooks and replays need no CUDA toolkit)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from pyc_lab.errors import DeviceUnavailableError, PycLabError
from pyc_lab.kernels import cutlass as cg
from pyc_lab.kernels.cutlass import config
from pyc_lab.paths import data_path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "make_cutlass_configurations.py"


def test_the_shipped_table_is_what_the_script_writes_from_cutlass_cppgen():
    pytest.importorskip("cutlass_library", reason="nvidia-cutlass is not installed")
    try:
        built = runpy.run_path(str(SCRIPT))["build"]()
    except DeviceUnavailableError as exc:
        pytest.skip(f"cutlass_cppgen cannot enumerate here: {exc}")
    shipped = json.loads(data_path("cutlass", "configurations.json").read_text())
    assert shipped == built, "run scripts/make_cutlass_configurations.py"


def test_without_cutlass_cppgen_the_shipped_table_answers(monkeypatch):
    def missing(*args, **kwargs):
        raise DeviceUnavailableError("CUTLASS kernels need nvidia-cutlass (no module)")

    monkeypatch.setattr(config, "live_configurations", missing)
    configs = cg.configurations("f16", "tn", 90)
    assert len(configs) > 40 and configs == sorted(configs, key=lambda c: c.id)
    kept, dropped = cg.prune(configs, 4096, 4096, 4096)
    assert kept and dropped
    assert cg.rank(kept, 4096, 4096, 4096, 132)[0].cta_tile[0] >= 128
    (simt,) = cg.configurations("f32", "tn", 90)
    assert simt.kernel_schedule
    with pytest.raises(PycLabError, match="sm_90 only"):
        cg.configurations("f16", "tn", 80)
