"""pl.matmul on unaligned problems through the padded GEMM, on a GPU, against float64.

Every problem here has an extent or leading dimension that is not a multiple of 16
bytes. With the first call's race forced to keep the padded GEMM (``MIN_MS`` 0, a
``MARGIN`` no measurement can miss), the aligned copies, the library GEMM(s) on them and
the copy out must give ``a @ b`` for float16, bfloat16, float32 and float64, every
operand layout, a linear layer's odd vocabulary (the weights read in place, a tail of
rows), M = 1 and N below one vector, column views and strided outputs, into NaN-poisoned
outputs, on CuPy arrays and on torch tensors on a side stream; NaN and infinities in the
operands land where NumPy puts them; a plan replayed from a CUDA graph runs the direct
call. Unforced, the race's measurements are recorded and the result is right whichever
path won (which one is a speed question, for ``benchmarks/exp_padded_gemm.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels import matmul as mm
from pyc_lab.kernels import padded
from pyc_lab.kernels.raced import RacedGemm
from tests.kernels.test_matmul_gpu import check as check_16_32
from tests.kernels.test_matmul_gpu import poisoned, rand, to64

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

DTYPES = ("float16", "bfloat16", "float32", "float64")
SHAPES = [(127, 255, 129), (7, 4099, 64), (33, 3, 40), (1, 1001, 64), (64, 24, 13)]


@pytest.fixture(autouse=True)
def _fresh_choices():
    mm.forget()
    yield
    mm.forget()


@pytest.fixture
def force_padded(monkeypatch):
    """The first call's race keeps the padded GEMM whatever it measures."""
    monkeypatch.setattr(padded, "MIN_MS", 0.0)
    monkeypatch.setattr(padded, "MARGIN", -1e9)


def check(got: object, want: np.ndarray, dtype: str, k: int) -> None:
    """The shared bound for float16/bfloat16/float32; float64's own."""
    if dtype != "float64":
        check_16_32(got, want, dtype, k)
        return
    got64 = to64(got)
    assert np.isfinite(got64).all(), "NaN or Inf in the result (the poison survived?)"
    assert float(np.abs(got64 - want).max()) <= 1e-12 * max(float(np.abs(want).max()), 1.0)


def expects_plan(a: object, b: object) -> bool:
    """Whether the problem has anything to pad (else the direct call runs alone)."""
    el = lambda x: tuple(s // x.itemsize for s in x.strides)  # noqa: E731
    return padded.pad_plan(a.shape, el(a), b.shape, el(b), (b.shape[1], 1),
                           a.itemsize) is not None


def operands(m: int, n: int, k: int, dtype: str, layout: str) -> tuple:
    """``a`` (M x K) and ``b`` (K x N) in ``layout`` ('tn': a row-major, b = w.T ...),
    with their float64 values."""
    a, a64 = rand((m, k) if layout[0] == "t" else (k, m), dtype)
    b, b64 = rand((n, k) if layout[1] == "n" else (k, n), dtype)
    if layout[0] == "n":
        a, a64 = a.T, a64.T
    if layout[1] == "n":
        b, b64 = b.T, b64.T
    return a, a64, b, b64


def _ran_padded() -> bool:
    return str(mm.last_choice.get("padded", "")).startswith("ran")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["tn", "tt", "nt", "nn"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_padded_gemm_computes_the_product(force_padded, dtype, layout, shape):
    m, n, k = shape
    a, a64, b, b64 = operands(m, n, k, dtype, layout)
    want = a64 @ b64
    got = pl.matmul(a, b)
    assert _ran_padded() == expects_plan(a, b), mm.last_choice
    check(got, want, dtype, k)
    out = poisoned((m, n), dtype)
    assert pl.matmul(a, b, out=out) is out
    check(out, want, dtype, k)
    again = pl.matmul(a, b)  # the memoised launch, the decision kept
    check(again, want, dtype, k)


@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_views_and_a_strided_out(force_padded, dtype):
    """A column view of a (its rows start 2 bytes apart from alignment), b = w.T, and an
    out whose rows are a slice of wider rows: every copy and the line-wise copy out."""
    m, n, k = 45, 70, 64
    big, big64 = rand((m, k + 1), dtype)
    a, a64 = big[:, 1:], big64[:, 1:]
    w, w64 = rand((n, k), dtype)
    wide = poisoned((m, n + 3), dtype)
    out = wide[:, 1:n + 1]
    pl.matmul(a, w.T, out=out)
    assert _ran_padded(), mm.last_choice
    check(out, a64 @ w64.T, dtype, k)
    rest = to64(wide[:, :1]), to64(wide[:, n + 1:])
    assert all(np.isnan(r).all() for r in rest), "wrote outside out"


def test_an_odd_vocabulary_reads_the_weights_in_place(force_padded):
    m, n, k = 64, 32001, 256
    a, a64 = rand((m, k), "bfloat16")
    w, w64 = rand((n, k), "bfloat16")
    got = pl.matmul(a, w.T)
    assert _ran_padded()
    plan = mm.last_choice.launch.direct.gemm.challenger.plan
    assert [c.source for c in plan.copies] == ["b"] and len(plan.parts) == 2
    check(got, a64 @ w64.T, "bfloat16", k)


@pytest.mark.parametrize("dtype", ("float16", "float32"))
def test_nan_and_infinities_land_where_numpy_puts_them(force_padded, dtype):
    m, n, k = 33, 50, 77
    host = np.random.default_rng(3)
    a64 = host.uniform(-1, 1, (m, k))
    w64 = host.uniform(-1, 1, (n, k))
    a64[0, 0] = np.inf
    a64[5, 3] = -np.inf
    w64[2, 1] = np.nan
    w64[7, 0] = -0.0
    a = cp.asarray(a64.astype(dtype))
    w = cp.asarray(w64.astype(dtype))
    got = to64(pl.matmul(a, w.T))
    assert _ran_padded()
    want = a64.astype(dtype).astype(np.float64) @ w64.astype(dtype).astype(np.float64).T
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    scale = float(np.abs(want[fin]).max())
    assert float(np.abs(got[fin] - want[fin]).max()) / scale < 4 * 2.0 ** -10 + k * 2.0 ** -22


def test_torch_tensors_on_a_side_stream(force_padded):
    torch = pytest.importorskip("torch")
    m, n, k = 127, 4099, 129
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = torch.rand(m, k, device="cuda", dtype=torch.float16) * 2 - 1
        w = torch.rand(n, k, device="cuda", dtype=torch.float16) * 2 - 1
        got = pl.matmul(a, w.T)
        assert _ran_padded()
        again = pl.matmul(a, w.T)
    side.synchronize()
    want = a.double() @ w.double().T
    for y in (got, again):
        assert type(y) is torch.Tensor and y.shape == (m, n)
        err = float((y.double() - want).abs().max()) / float(want.abs().max())
        assert err < 4 * 2.0 ** -10 + k * 2.0 ** -22


def test_a_captured_plan_runs_the_direct_call(force_padded):
    m, n, k = 127, 255, 129
    a, a64, b, b64 = operands(m, n, k, "float16", "tn")
    out = poisoned((m, n), "float16")
    plan = pl.matmul_plan(a, b, out=out, capturable=True)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        plan(a, b)  # the uncaptured first call on the stream decides (forced: padded)
    stream.synchronize()
    check(out, a64 @ b64, "float16", k)
    chooser = plan._launch.direct.gemm
    assert chooser.use_challenger is True
    out.fill(cp.nan)
    with stream:
        stream.begin_capture()
        plan(a, b)
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    check(out, a64 @ b64, "float16", k)


def test_unforced_the_race_is_recorded_and_either_path_is_right():
    m, n, k = 1000, 4100, 1023
    a, a64, b, b64 = operands(m, n, k, "float16", "tn")
    got = pl.matmul(a, b)
    chooser = mm.last_choice.launch.direct.gemm
    assert set(chooser.measured) == {"default_ms", "challenger_ms"}
    assert all(t > 0 for t in chooser.measured.values())
    assert "ms" in mm.last_choice["padded"]
    check(got, a64 @ b64, "float16", k)
    check(pl.matmul(a, b), a64 @ b64, "float16", k)


def test_an_aligned_problem_has_no_padded_form():
    a, _a64, b, _b64 = operands(128, 256, 64, "float16", "tn")
    pl.matmul(a, b)
    assert "padded" not in mm.last_choice
    assert not isinstance(mm.last_choice.launch.direct.gemm, RacedGemm)

