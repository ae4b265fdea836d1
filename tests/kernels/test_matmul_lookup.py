"""pl.matmul without a GPU: the NumPy path, and the tuned-kernel lookup (memoised until
the tuning database changes; an entry it cannot use falls back, with the reason)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError
from pyc_lab.kernels import cutlass as cg


def test_matmul_on_numpy_and_bad_input():
    rng = np.random.default_rng()
    a, b = rng.uniform(-1, 1, (5, 7)), rng.uniform(-1, 1, (7, 3))
    bias = rng.uniform(-1, 1, 3)
    got = pl.matmul(a, b, bias=bias, activation="relu")
    np.testing.assert_allclose(got, np.maximum(a @ b + bias, 0))
    assert pl.kernels.matmul.last_choice["impl"] == "numpy"
    out = rng.uniform(-1, 1, (5, 3))
    want = 2.0 * (a @ b) + 0.5 * out
    np.testing.assert_allclose(pl.matmul(a, b, out=out, alpha=2.0, beta=0.5), want)
    with pytest.raises(PycLabError, match="inner dimensions differ"):
        pl.matmul(a, a)
    y = a @ b + bias
    np.testing.assert_allclose(pl.matmul(a, b, bias=bias, activation="silu"),
                               y / (1 + np.exp(-y)))
    with pytest.raises(PycLabError, match="activation must be"):
        pl.matmul(a, b, activation="tanh")


RECORD_ELSEWHERE = """
import sys
from pyc_lab.kernels.tuning.database import TuningDB
from pyc_lab.kernels.tuning.keys import DeviceKey, Measurement, ProblemKey
with TuningDB(sys.argv[1]) as db:
    db.record(DeviceKey("NVIDIA H200", "9.0", "580.00", "13.0"),
              ProblemKey("gemm", "f16", "f16", "f16", "tn", 2048, 2048, 2048),
              Measurement({"tile": [128, 128, 64], "cluster": [1, 2, 1],
                           "kernel_schedule": "TmaWarpSpecializedCooperative",
                           "epilogue_schedule": "TmaWarpSpecializedCooperative",
                           "tile_scheduler": "Default"}, "ok", 0.02))
"""


def test_matmul_lookup_is_memoised_until_the_database_changes(tmp_path, monkeypatch):
    from pyc_lab.kernels import matmul as mm
    from pyc_lab.kernels.tuning import database as tuning_db

    device = tuning_db.DeviceKey("NVIDIA H200", "9.0", "580.00", "13.0")
    path = tmp_path / "t.sqlite"
    monkeypatch.setattr(tuning_db, "default_path", lambda: path)
    monkeypatch.setattr(mm, "device_key", lambda index=0: (device, 90, 132))
    loads = []

    def fake_load(found, dtype, layout, epilogue, why, shape):
        loads.append(shape)
        return f"kernel {found.measurement.config['tile']}", why

    monkeypatch.setattr(mm, "_load", fake_load)
    monkeypatch.setattr(mm, "RECHECK_S", 3600.0)
    mm.forget()
    assert mm.tuned_kernel(256, 256, 256, "f16", "tn")[0] is None
    assert mm.tuned_kernel(2048, 2048, 2048, "f16", "tn")[0] is None
    cfg = cg.GemmConfig((128, 128, 64), (1, 2, 1), "TmaWarpSpecializedCooperative",
                        "TmaWarpSpecializedCooperative", "Default")
    with tuning_db.TuningDB() as db:  # a tuning in this process is seen at once
        db.record(device, tuning_db.ProblemKey("gemm", "f16", "f16", "f16", "tn",
                                               256, 256, 256),
                  tuning_db.Measurement(cfg.to_dict(), "ok", 0.01))
    kernel, why = mm.tuned_kernel(256, 256, 256, "f16", "tn")
    assert kernel == "kernel [128, 128, 64]" and why.startswith("exact match")
    for _ in range(3):  # memoised: no new lookup or load
        assert mm.tuned_kernel(256, 256, 256, "f16", "tn")[0] == kernel
    assert loads == [(256, 256, 256)]
    assert mm.tuned_kernel(2048, 2048, 2048, "f16", "tn")[0] is None  # looked up again: none
    # another process (a notebook beside this one) records 2048^3: seen once the file
    # is looked at again, after RECHECK_S
    subprocess.run([sys.executable, "-c", RECORD_ELSEWHERE, str(path)], check=True,
                   capture_output=True)
    assert mm.tuned_kernel(2048, 2048, 2048, "f16", "tn")[0] is None  # not looked at yet
    monkeypatch.setattr(mm, "RECHECK_S", 0.0)
    assert mm.tuned_kernel(2048, 2048, 2048, "f16", "tn")[0] == "kernel [128, 128, 64]"
    monkeypatch.setattr(mm, "RECHECK_S", 3600.0)
    mm.forget()
    mm.tuned_kernel(256, 256, 256, "f16", "tn")
    assert loads == [(256, 256, 256), (2048, 2048, 2048), (256, 256, 256)]


def test_an_unusable_tuned_entry_falls_back_with_the_reason(tmp_path, monkeypatch):
    from pyc_lab.kernels import matmul as mm
    from pyc_lab.kernels.tuning import database as tuning_db

    device = tuning_db.DeviceKey("NVIDIA H200", "9.0", "580.00", "13.0")
    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "t.sqlite")
    monkeypatch.setattr(mm, "device_key", lambda index=0: (device, 90, 132))
    with tuning_db.TuningDB() as db:  # an entry this pyc_lab cannot build
        db.record(device, tuning_db.ProblemKey("gemm", "f16", "f16", "f16", "tn",
                                               256, 256, 256),
                  tuning_db.Measurement({"tile": [1, 2, 3]}, "ok", 0.01))
    mm.forget()
    kernel, why = mm.tuned_kernel(256, 256, 256, "f16", "tn")
    assert kernel is None and "unusable" in why and "not a CUTLASS GEMM config" in why

    def broken_load(*args):
        raise OSError("kernel.so: invalid ELF header")

    monkeypatch.setattr(mm, "_load", broken_load)
    mm.forget()
    kernel, why = mm.tuned_kernel(256, 256, 256, "f16", "tn")
    assert kernel is None and "OSError: kernel.so: invalid ELF header" in why

