"""pl.matmul and pl.matmul_plan on the CPU: NumPy arrays of every dtype (bfloat16 through
ml_dtypes), batched and transposed operands, plans, and torch tensors where torch is
installed. References are float64 NumPy on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError
from pyc_lab.kernels.arrays import bf16_dtype, result_dtype

EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23,
       "float64": 2.0 ** -52}


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


def dtype_of(name: str) -> np.dtype:
    return bf16_dtype() if name == "bfloat16" else np.dtype(name)


def close(got, want, dtype: str, k: int) -> None:
    """|got - want| within a few roundings of the output plus K roundings of the sum."""
    got = np.asarray(got).astype(np.float64)
    scale = max(float(np.abs(want).max()), 1.0)
    tol = EPS[dtype] * (4 + 2 * np.sqrt(k)) * scale
    assert np.isfinite(got).all()
    assert float(np.abs(got - want).max()) <= tol, (float(np.abs(got - want).max()), tol)


def test_bfloat16_promotes_as_torch_does():
    assert result_dtype("bfloat16", "bfloat16") == "bfloat16"
    assert result_dtype("bfloat16", "float16") == "float32"
    assert result_dtype("float32", "bfloat16") == "float32"
    assert result_dtype("bfloat16", "float64") == "float64"
    assert result_dtype("float16", "float32") == "float32"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_numpy_every_dtype_odd_extents(rng, dtype):
    dt = dtype_of(dtype)
    m, n, k = 13, 11, 29
    a = rng.uniform(-1, 1, (m, k)).astype(dt)
    w = rng.uniform(-1, 1, (n, k)).astype(dt)
    bias = rng.uniform(-1, 1, n).astype(dt)
    want = a.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64)
    got = pl.matmul(a, w.T, bias=bias)
    assert np.dtype(got.dtype) == dt and got.shape == (m, n)
    close(got, want, dtype, k)
    out = np.full((m, n), np.nan, dtype=dt)
    assert pl.matmul(a, w.T, bias=bias, out=out) is out
    close(out, want, dtype, k)
    assert pl.kernels.matmul.last_choice["impl"] == "numpy"


def test_numpy_bfloat16_mixed_with_float16_gives_float32(rng):
    a = rng.uniform(-1, 1, (5, 7)).astype(bf16_dtype())
    b = rng.uniform(-1, 1, (7, 3)).astype(np.float16)
    got = pl.matmul(a, b)
    assert got.dtype == np.float32
    close(got, a.astype(np.float64) @ b.astype(np.float64), "bfloat16", 7)


def test_numpy_batched_and_broadcast(rng):
    a = rng.uniform(-1, 1, (3, 5, 7)).astype(np.float32)
    b = rng.uniform(-1, 1, (3, 7, 4)).astype(np.float32)
    w = rng.uniform(-1, 1, (4, 7)).astype(np.float32)
    close(pl.matmul(a, b), a.astype(np.float64) @ b.astype(np.float64), "float32", 7)
    close(pl.matmul(a, w.T), a.astype(np.float64) @ w.astype(np.float64).T, "float32", 7)


def test_a_plan_runs_with_numpy_and_checks_what_it_was_made_for(rng):
    a = rng.uniform(-1, 1, (6, 5))
    b = rng.uniform(-1, 1, (5, 4))
    bias = rng.uniform(-1, 1, 4)
    out = np.full((6, 4), np.nan)
    plan = pl.matmul_plan(a, b, bias=bias, activation="relu", out=out)
    assert isinstance(plan, pl.MatmulPlan)
    assert plan.choice == {"impl": "numpy", "reason": "NumPy arrays run on the CPU"}
    assert "runs: numpy" in plan.explain() and "NumPy arrays run on the CPU" in plan.explain()
    assert repr(plan) == "MatmulPlan(numpy, 6x4 float64, impl='numpy')"
    for _ in range(2):
        a2 = rng.uniform(-1, 1, (6, 5))
        assert plan(a2, b) is out
        np.testing.assert_allclose(out, np.maximum(a2 @ b + bias, 0), rtol=1e-12)
    other = np.empty((6, 4))
    assert plan(a, b, out=other) is other
    with pytest.raises(PycLabError, match=r"this matmul plan was made for a \(6, 5\) float64"):
        plan(rng.uniform(-1, 1, (7, 5)), b)
    with pytest.raises(PycLabError, match="make a plan for them"):
        plan(np.asfortranarray(a), b)  # same shape, other strides
    with pytest.raises(PycLabError, match="make a plan for them"):
        plan(a.astype(np.float32), b)
    with pytest.raises(PycLabError, match="inner dimensions differ"):
        pl.matmul_plan(a, a)
    with pytest.raises(PycLabError, match="activation must be"):
        pl.matmul_plan(a, b, activation="tanh")


def test_a_plan_without_out_returns_new_arrays(rng):
    a, b = rng.uniform(-1, 1, (3, 2)), rng.uniform(-1, 1, (2, 5))
    plan = pl.matmul_plan(a, b, alpha=2.0)
    y1, y2 = plan(a, b), plan(a, b)
    assert y1 is not y2
    np.testing.assert_allclose(y1, 2.0 * (a @ b))


def test_bfloat16_without_ml_dtypes_is_a_clear_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ml_dtypes(name, *args, **kwargs):
        if name == "ml_dtypes":
            raise ImportError("no ml_dtypes")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ml_dtypes)
    with pytest.raises(PycLabError, match="bfloat16 NumPy arrays need ml_dtypes"):
        bf16_dtype()


def test_bad_inputs_keep_their_clear_errors(rng):
    a = rng.uniform(-1, 1, (4, 6))
    with pytest.raises(PycLabError, match="takes arrays with at least one dimension"):
        pl.matmul(a, 3.0)
    with pytest.raises(PycLabError, match="out must be a NumPy array of shape"):
        pl.matmul(a, a.T, out=np.empty((3, 3)))
    # a repeated good call skips the checks, a bad one after it still gets them
    b = rng.uniform(-1, 1, (6, 2))
    pl.matmul(a, b)
    pl.matmul(a, b)
    with pytest.raises(PycLabError, match="must be a real number"):
        pl.matmul(a, b, alpha="2")
    with pytest.raises(PycLabError, match="bias of shape"):
        pl.matmul(a, b, bias=np.ones(3))


# -- torch tensors (where torch is installed; CPU tensors go through NumPy) ---------------

def test_cpu_torch_tensors_come_back_as_torch(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed here")
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        a = torch.from_numpy(rng.uniform(-1, 1, (9, 5))).to(dt)
        w = torch.from_numpy(rng.uniform(-1, 1, (7, 5))).to(dt)
        got = pl.matmul(a, w.T)
        assert isinstance(got, torch.Tensor) and got.dtype == dt and got.shape == (9, 7)
        want = a.double().numpy() @ w.double().numpy().T
        name = str(dt).replace("torch.", "")
        close(got.double().numpy(), want, name, 5)
        plan = pl.matmul_plan(a, w.T)
        assert plan.kind == "torch" and isinstance(plan(a, w.T), torch.Tensor)
    x = torch.ones((2, 2), requires_grad=True)
    with pytest.raises(PycLabError, match="does not record gradients"):
        pl.matmul(x, x)
    with pytest.raises(PycLabError, match="both as torch tensors"):
        pl.matmul(torch.ones((2, 2)), np.ones((2, 2)))
