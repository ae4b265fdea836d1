"""The small reference models shipped inside the onnx package, with their own data.

``onnx/backend/test/data/pytorch-converted`` and ``pytorch-operator`` hold models
exported from PyTorch layers (convolutions of every kind, pools, batch norms, linear
layers, activations ...) with inputs and the outputs PyTorch computed. Every model
whose ops pyc_lab maps must reproduce those outputs; the others must be refused with
an ``UnsupportedOpError`` naming the op (and, with onnxruntime, run as graph breaks).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

from pyc_lab.inference.errors import UnsupportedOpError  # noqa: E402
from pyc_lab.inference.model import load  # noqa: E402

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
CASES = sorted(p for kind in ("pytorch-converted", "pytorch-operator")
               for p in (DATA / kind).glob("test_*") if (p / "model.onnx").is_file())


def _tensors(folder: Path, prefix: str) -> list[np.ndarray]:
    return [numpy_helper.to_array(onnx.load_tensor(str(f)))
            for f in sorted(folder.glob(f"{prefix}_*.pb"))]


@pytest.mark.skipif(not CASES, reason="this onnx package ships no backend test data")
@pytest.mark.parametrize("case", CASES, ids=[p.name for p in CASES])
def test_reference_model(case):
    m = onnx.load(str(case / "model.onnx"))
    data = case / "test_data_set_0"
    inputs, want = _tensors(data, "input"), _tensors(data, "output")
    try:
        model = load(m, onnxruntime_fallback=False)
        got = model(*inputs)
    except UnsupportedOpError as exc:
        # refused: the op (or its attribute) is named
        assert any(n.op_type in str(exc) for n in m.graph.node)
        pytest.importorskip("onnxruntime")
        if "mode" in str(exc) or "ceil_mode" in str(exc):
            return  # an attribute refused at trace time has no graph-break path
        model = load(m)
        assert model.imported.breaks
        got = model(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


LIGHT = sorted((DATA / "light").glob("light_*.onnx"))


@pytest.mark.skipif(not LIGHT, reason="this onnx package ships no light models")
@pytest.mark.parametrize("path", LIGHT, ids=[p.stem for p in LIGHT])
def test_every_shipped_light_model_maps_every_op(path):
    # AlexNet, Inception v1 and ZFNet need LRN; the rest are convolutions, pools, norms
    m = onnx.load(str(path), load_external_data=False)
    model = load(m, onnxruntime_fallback=False)
    assert model.imported.breaks == []
