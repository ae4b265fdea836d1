"""pl.matmul refuses what it cannot compute correctly with one clear error (a bias of the
wrong length or dtype, dtypes it does not compute in, mismatched devices, a wrong ``out``)
and follows NumPy's promotion for the dtypes it does compute in.

The CuPy path is checked without a GPU: its inputs are refused before any device call,
so stand-ins that look like CuPy arrays (shape, dtype, a ``cupy`` module) are enough.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


class FakeCupyArray:
    """Shape and dtype of a CuPy array, and a ``cupy`` module: nothing else."""

    __module__ = "cupy._core.core"

    def __init__(self, shape: tuple[int, ...], dtype: str = "float16") -> None:
        self.shape, self.dtype, self.ndim = shape, np.dtype(dtype), len(shape)

    def reshape(self, *shape: int) -> FakeCupyArray:  # pragma: no cover - never reached
        raise AssertionError("a refused input must not reach the device")


@pytest.mark.parametrize(("bias_shape", "columns"), [((4,), 3), ((5, 1), 3), ((3, 3), 3),
                                                     ((), 3), ((1, 2), 3)])
def test_a_bias_of_the_wrong_shape_is_refused(rng, bias_shape, columns):
    a, b = rng.uniform(-1, 1, (5, 7)), rng.uniform(-1, 1, (7, columns))
    bias = rng.uniform(-1, 1, bias_shape)
    with pytest.raises(PycLabError) as info:
        pl.matmul(a, b, bias=bias)
    assert str(info.value) == (f"matmul: bias of shape {bias.shape} for an output of {columns} "
                               f"columns; give one value per column, shape ({columns},)")
    with pytest.raises(PycLabError, match="bias of shape"):
        pl.matmul(FakeCupyArray((5, 7)), FakeCupyArray((7, columns)),
                  bias=FakeCupyArray(bias_shape))


def test_a_row_bias_of_any_layout_adds_per_column(rng):
    a, b = rng.uniform(-1, 1, (5, 7)), rng.uniform(-1, 1, (7, 3))
    bias = rng.uniform(-1, 1, 3)
    want = a @ b + bias
    np.testing.assert_allclose(pl.matmul(a, b, bias=bias.reshape(1, 3)), want)
    np.testing.assert_allclose(pl.matmul(a, b, bias=list(bias)), want)
    np.testing.assert_allclose(pl.matmul(a, b, bias=bias.astype(np.int64)),
                               a @ b + bias.astype(np.int64))


@pytest.mark.parametrize("dtype", ["complex128", "object", "<U3", "datetime64[s]"])
def test_a_bias_of_a_dtype_that_cannot_be_added_is_refused(rng, dtype):
    a, b = rng.uniform(-1, 1, (5, 7)), rng.uniform(-1, 1, (7, 3))
    bias = np.zeros(3, dtype=dtype) if dtype != "<U3" else np.array(["a", "b", "c"])
    with pytest.raises(PycLabError, match=r"bias has dtype .* cannot be added to a float64 "
                                          r"product"):
        pl.matmul(a, b, bias=bias)
    with pytest.raises(PycLabError, match="bias has dtype"):
        pl.matmul(FakeCupyArray((5, 7)), FakeCupyArray((7, 3)), bias=FakeCupyArray((3,), dtype))


@pytest.mark.parametrize(("da", "db"), [("complex128", "complex128"), ("object", "object"),
                                        ("float16", "int32"), ("int64", "int64"),
                                        ("bool", "bool"), ("float32", "complex64")])
def test_dtypes_it_does_not_compute_in_are_refused(rng, da, db):
    a = rng.uniform(-1, 1, (4, 6)).astype(da)
    b = rng.uniform(-1, 1, (6, 2)).astype(db)
    bad = "a" if da not in pl.kernels.matmul.DTYPES else "b"
    with pytest.raises(PycLabError, match=rf"matmul: {bad} has dtype .*; pl.matmul computes "
                                          r"in float16, bfloat16, float32, float64"):
        pl.matmul(a, b)
    with pytest.raises(PycLabError, match=rf"{bad} has dtype"):
        pl.matmul(FakeCupyArray((4, 6), da), FakeCupyArray((6, 2), db))


@pytest.mark.parametrize(("da", "db"), [("float16", "float32"), ("float32", "float64"),
                                        ("float16", "float64")])
def test_mixed_float_dtypes_promote_as_numpy_does(rng, da, db):
    a = rng.uniform(-1, 1, (4, 6)).astype(da)
    b = rng.uniform(-1, 1, (6, 2)).astype(db)
    bias = rng.uniform(-1, 1, 2).astype(np.float64)
    got = pl.matmul(a, b, bias=bias, activation="relu")
    assert got.dtype == np.result_type(a, b) == np.matmul(a, b).dtype
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)
    np.testing.assert_allclose(got, want, rtol=2e-2 if "float16" in (da, db) else 1e-5,
                               atol=2e-2 if "float16" in (da, db) else 1e-6)


def test_operands_on_different_devices_are_refused(rng):
    a = rng.uniform(-1, 1, (4, 6))
    with pytest.raises(PycLabError, match="a is a NumPy array and b a CuPy one"):
        pl.matmul(a, FakeCupyArray((6, 2), "float64"))
    with pytest.raises(PycLabError, match="bias is a CuPy array but a and b are NumPy"):
        pl.matmul(a, rng.uniform(-1, 1, (6, 2)), bias=FakeCupyArray((2,), "float64"))
    with pytest.raises(PycLabError, match="takes arrays with at least one dimension; a is list"):
        pl.matmul([[1.0]], np.ones((1, 1)))


def test_a_wrong_out_or_scale_is_refused(rng):
    a, b = rng.uniform(-1, 1, (5, 7)), rng.uniform(-1, 1, (7, 3))
    for out, match in ((np.zeros((3, 5)), r"out must be a NumPy array of shape \(5, 3\)"),
                       (np.zeros((5, 3), dtype=np.int64), "out has dtype int64"),
                       (np.zeros((5, 3), dtype=complex), "out has dtype complex128"),
                       (np.broadcast_to(np.float64(0), (5, 3)), "out is read-only")):
        with pytest.raises(PycLabError, match=match):
            pl.matmul(a, b, out=out)
    out = np.zeros((5, 3), dtype=np.float32)  # same kind: cast as np.matmul(out=) would
    np.testing.assert_allclose(pl.matmul(a, b, out=out), a @ b, rtol=1e-5, atol=1e-6)
    for scale in ("2", None, 1j, True):
        with pytest.raises(PycLabError, match="must be a real number"):
            pl.matmul(a, b, alpha=scale)
        with pytest.raises(PycLabError, match="must be a real number"):
            pl.matmul(a, b, beta=scale)
    with pytest.raises(PycLabError, match="a bias needs b with at least two dimensions"):
        pl.matmul(a, b[:, 0], bias=np.zeros(1))


def test_batched_operands_keep_working(rng):
    a, b = rng.uniform(-1, 1, (2, 5, 7)), rng.uniform(-1, 1, (7, 3))
    bias = rng.uniform(-1, 1, 3)
    np.testing.assert_allclose(pl.matmul(a, b, bias=bias), a @ b + bias)
    with pytest.raises(PycLabError, match=r"batch dimensions .* do not broadcast"):
        pl.matmul(rng.uniform(-1, 1, (2, 5, 7)), rng.uniform(-1, 1, (3, 7, 3)))
