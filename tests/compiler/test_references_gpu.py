"""Every op's reference also runs with CuPy (the cupy backend's fallback for NO_CODEGEN)."""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.compiler import REGISTRY
from pyc_lab.compiler.ops import evaluate

pytestmark = pytest.mark.gpu

CASES = {
    "matmul": ([(6, 8), (8, 5), (5,)], {"activation": "gelu"}),
    "softmax": ([(4, 9)], {"axis": 0}),
    "layer_norm": ([(4, 9), (9,), (9,)], {"eps": 1e-5}),
    "sum": ([(4, 9)], {"axis": (0,), "keepdims": False}),
    "mean": ([(4, 9)], {"axis": None, "keepdims": True}),
    "max": ([(4, 9)], {"axis": (1,), "keepdims": False}),
    "min": ([(4, 9)], {"axis": (0, 1), "keepdims": False}),
    "var": ([(4, 9)], {"axis": (1,), "keepdims": True}),
    "std": ([(4, 9)], {"axis": (1,), "keepdims": False, "ddof": 1}),
    "prod": ([(4, 9)], {"axis": (0,), "keepdims": False}),
    "argmax": ([(4, 9)], {"axis": (1,), "keepdims": False}),
    "argmin": ([(4, 9)], {"axis": None, "keepdims": True}),
    "any": ([(4, 9)], {"axis": (0,), "keepdims": False}),
    "all": ([(4, 9)], {"axis": None, "keepdims": False}),
    "where": ([(4, 9), (4, 9), (9,)], {}),
    "astype": ([(4, 9)], {"dtype": np.dtype(np.float16)}),
}
#: Ops NumPy defines for integers (and bools) only.
INTEGER_OPS = frozenset({"invert", "left_shift", "right_shift", "bitwise_and", "bitwise_or",
                         "bitwise_xor"})


# fused_rows runs the body it carries: its reference is tested in test_ops.
@pytest.mark.parametrize("op", sorted(n for n, d in REGISTRY.items()
                                      if d.kind in ("elementwise", "reduction", "matmul",
                                                    "norm") and n != "fused_rows"))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_reference_with_cupy_matches_numpy(op, dtype):
    import cupy as cp

    rng = np.random.default_rng()
    shapes, attrs = CASES[op] if op in CASES else ([(4, 9)] * REGISTRY[op].arity, {})
    args = [rng.uniform(0.5, 2.0, s).astype(dtype) for s in shapes]
    if op in INTEGER_OPS:
        args = [rng.integers(1, 5, s).astype(np.int32) for s in shapes]
    if op == "where":
        args[0] = args[0] > 1.2
    want = np.asarray(evaluate(op, np, args, attrs))
    got = cp.asnumpy(evaluate(op, cp, [cp.asarray(a) for a in args], attrs))
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 2e-2 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                               atol=tol)
