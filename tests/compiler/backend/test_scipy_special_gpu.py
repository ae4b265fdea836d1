"""``scipy.special.softmax``, ``log_softmax`` and ``logsumexp`` in functions compiled for
CuPy arrays: generated kernels only (no graph break), against SciPy in float64 on fresh
random data with infinities. The CPU side: ``tests/compiler/test_scipy_special.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from tests.compiler.test_scipy_special import FORMS, _data

cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", sorted(FORMS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scipy_forms_on_the_gpu_match_scipy(name, dtype):
    fn = FORMS[name]
    x = _data(dtype, (257, 1000))
    f = pl.compile(fn, backend="cupy")
    dx = cp.asarray(x)
    assert f.explain(dx).graph_breaks == []
    got = cp.asnumpy(cp.asarray(f(dx)))
    with np.errstate(all="ignore"):
        want = np.asarray(fn(x.astype(np.float64)))
    tol = 2e-5 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
