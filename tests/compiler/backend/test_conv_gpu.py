"""``pl.conv`` inside ``pl.compile`` on the CuPy backend: the ``conv`` node runs as
pl.conv's library call (cuDNN or the GEMM form, through torch) between the generated
kernels around it, against the float64 loops of tests/kernels/test_conv.py, with and
without CUDA-graph replay of the rest."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from tests.kernels.test_conv import reference

cp = pytest.importorskip("cupy")
pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cuda_graph", ["auto", False])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_a_compiled_conv_block_on_the_gpu(dtype, cuda_graph):
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 3, 29, 31)).astype(dtype)
    w = (rng.standard_normal((8, 3, 7, 7)) / 12).astype(dtype)
    b = rng.standard_normal(8).astype(dtype)

    def block(x, w, b):
        return np.maximum(pl.conv2d(x, w, b, stride=2, padding=3), 0) * dtype(2)

    f = pl.compile(block, backend="cupy", cuda_graph=cuda_graph)
    args = [cp.asarray(a) for a in (x, w, b)]
    want = np.maximum(reference(x, w, b, 2, 3), 0) * 2
    for _ in range(3):  # the first call traces and races; later ones replay
        got = cp.asnumpy(f(*args))
        assert got.dtype == dtype and got.shape == want.shape
        tol = 2e-2 if dtype == np.float16 else 1e-3
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    ex = f.explain(*args)
    assert "conv" in set(ex.decisions["choice"])
