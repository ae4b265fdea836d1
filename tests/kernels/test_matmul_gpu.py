"""pl.matmul and pl.matmul_plan on a GPU, every path against a float64 NumPy reference.

Fresh random inputs uniform in [-1, 1] (never zeros), outputs poisoned with NaN before
the call, odd extents, float16 / bfloat16 / float32, batched and transposed operands,
torch tensors on a non-default stream, plans (also replayed from a CUDA graph), and the
never-slower rule with a losing tuned entry. The error bound is relative to the largest
reference value: a few roundings of the output dtype plus float32 accumulation over K.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels import cublaslt
from pyc_lab.kernels import matmul as mm
from pyc_lab.kernels.arrays import bf16_dtype
from pyc_lab.kernels.raced import RacedGemm

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23}
DTYPES = ("float16", "bfloat16", "float32")
M, N, K = 127, 255, 129  # odd extents: no 16-byte-aligned rows anywhere


def host_dtype(name: str) -> np.dtype:
    return bf16_dtype() if name == "bfloat16" else np.dtype(name)


def rand(shape: tuple[int, ...], dtype: str) -> tuple[object, np.ndarray]:
    """A CuPy array uniform in [-1, 1] and its exact values as float64 on the host."""
    host = np.random.default_rng().uniform(-1, 1, shape).astype(host_dtype(dtype))
    if dtype == "bfloat16":  # upload the bits, so that only CuPy's dtype is relied on
        dev = cp.asarray(host.view(np.uint16)).view(cp.dtype("bfloat16"))
    else:
        dev = cp.asarray(host)
    return dev, host.astype(np.float64)


def poisoned(shape: tuple[int, ...], dtype: str) -> object:
    """An output full of NaN."""
    if dtype == "bfloat16":
        out = cp.empty(shape, dtype=cp.dtype("bfloat16"))
        out.view(cp.uint16).fill(0x7FC0)
        return out
    return cp.full(shape, cp.nan, dtype=dtype)


def to64(y: object) -> np.ndarray:
    """A CuPy (or torch) result as float64 on the host."""
    if type(y).__module__.startswith("torch"):
        return y.double().cpu().numpy()
    if y.dtype.name == "bfloat16":
        return cp.asnumpy(y.view(cp.uint16)).view(bf16_dtype()).astype(np.float64)
    return cp.asnumpy(y).astype(np.float64)


def check(got: object, want: np.ndarray, dtype: str, k: int, roundings: float = 4.0) -> None:
    got64 = to64(got)
    assert got64.shape == want.shape
    assert np.isfinite(got64).all(), "NaN or Inf in the result (the poison survived?)"
    scale = max(float(np.abs(want).max()), 1e-3)
    err = float(np.abs(got64 - want).max()) / scale
    tol = roundings * EPS[dtype] + k * 2.0 ** -22
    assert err <= tol, f"max error {err:.3g} > {tol:.3g} ({dtype}, K={k})"


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.fixture(autouse=True)
def _fresh_choices():
    mm.forget()
    yield
    mm.forget()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["tn", "tt", "nt"])
def test_every_dtype_and_layout_at_odd_extents(dtype, layout):
    a, a64 = rand((M, K) if layout[0] == "t" else (K, M), dtype)
    b, b64 = rand((K, N) if layout[1] == "t" else (N, K), dtype)
    if layout[0] == "n":
        a, a64 = a.T, a64.T
    if layout[1] == "n":
        b, b64 = b.T, b64.T
    want = a64 @ b64
    out = poisoned((M, N), dtype)
    assert pl.matmul(a, b, out=out) is out
    check(out, want, dtype, K)
    y = pl.matmul(a, b)
    assert y.dtype == out.dtype and y.shape == (M, N)
    check(y, want, dtype, K)
    choice = mm.last_choice
    if dtype == "bfloat16" and cublaslt.status()[0]:
        assert choice["impl"] == "cublaslt", dict(choice)
    else:
        assert choice["impl"] == "cublas", dict(choice)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_and_broadcast(dtype):
    a, a64 = rand((3, M, K), dtype)
    b, b64 = rand((3, K, N), dtype)
    out = poisoned((3, M, N), dtype)
    assert pl.matmul(a, b, out=out) is out
    check(out, a64 @ b64, dtype, K)
    w, w64 = rand((N, K), dtype)  # (B, M, K) @ w.T: folded into one 2-D GEMM
    out2 = poisoned((3, M, N), dtype)
    assert pl.matmul(a, w.T, out=out2) is out2
    check(out2, a64 @ w64.T, dtype, K)
    check(pl.matmul(a, w.T), a64 @ w64.T, dtype, K)
    at = a.transpose(0, 2, 1).copy().transpose(0, 2, 1)  # batched, column-major matrices
    check(pl.matmul(at, b), a64 @ b64, dtype, K)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_bias_and_gelu(dtype):
    x, x64 = rand((M, K), dtype)
    w, w64 = rand((N, K), dtype)
    bias, bias64 = rand((N,), dtype)
    out = poisoned((M, N), dtype)
    pl.matmul(x, w.T, bias=bias, activation="gelu", out=out)
    check(out, gelu(x64 @ w64.T + bias64), dtype, K, roundings=32)
    y = pl.matmul(x, w.T, bias=bias, activation="relu")
    check(y, np.maximum(x64 @ w64.T + bias64, 0), dtype, K, roundings=32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_alpha_beta(dtype):
    a, a64 = rand((M, K), dtype)
    b, b64 = rand((K, N), dtype)
    c, c64 = rand((M, N), dtype)
    pl.matmul(a, b, out=c, alpha=0.5, beta=2.0)
    check(c, 0.5 * (a64 @ b64) + 2.0 * c64, dtype, K, roundings=8)


def test_mixed_dtypes_promote():
    a, a64 = rand((M, K), "bfloat16")
    b, b64 = rand((K, N), "float16")
    y = pl.matmul(a, b)
    assert y.dtype == cp.float32
    check(y, a64 @ b64, "float32", K, roundings=64)  # float32 product of exact inputs


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_plan_runs_what_it_chose(dtype):
    a, _ = rand((M, K), dtype)
    w, w64 = rand((N, K), dtype)
    out = poisoned((M, N), dtype)
    plan = pl.matmul_plan(a, w.T, out=out)
    assert plan.choice["impl"] in ("cublas", "cublaslt", "cutlass")
    assert plan.choice["reason"] in plan.explain()
    for _ in range(3):  # fresh operands of the same shape and strides each time
        a2, a2_64 = rand((M, K), dtype)
        out[...] = poisoned((M, N), dtype)
        assert plan(a2, w.T) is out
        check(out, a2_64 @ w64.T, dtype, K)
    with pytest.raises(pl.PycLabError, match="make a plan for them"):
        plan(rand((M + 1, K), dtype)[0], w.T)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_plan_replays_from_a_cuda_graph(dtype):
    a, _ = rand((M, K), dtype)
    w, w64 = rand((N, K), dtype)
    out = poisoned((M, N), dtype)
    plan = pl.matmul_plan(a, w.T, out=out, capturable=True)
    assert plan.choice["impl"] in ("cutlass", "cublaslt", "cublas"), plan.choice
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        plan(a, w.T)  # binds pointers, sets up workspaces: outside the capture
        stream.synchronize()
        stream.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
        try:
            plan(a, w.T)
        finally:
            graph = stream.end_capture()
        for _ in range(2):
            fresh, fresh64 = rand((M, K), dtype)
            a[...] = fresh  # new values at the captured address
            out[...] = poisoned((M, N), dtype)
            graph.launch(stream)
            stream.synchronize()
            check(out, fresh64 @ w64.T, dtype, K)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("side_stream", [True, False])
def test_a_plan_on_the_same_arrays_replays_a_graph_of_its_own(dtype, side_stream):
    """Repeated addresses are captured at the second call and launched from then on; a
    launch reads the operands' current values; new addresses run directly first."""
    m, n, k = 256, 384, 512  # aligned: the direct library call, no padded challenger
    a, _ = rand((m, k), dtype)
    w, w64 = rand((n, k), dtype)
    out = poisoned((m, n), dtype)
    plan = pl.matmul_plan(a, w.T, out=out)
    assert plan.replays is not None, plan.explain()
    stream = cp.cuda.Stream(non_blocking=True) if side_stream else cp.cuda.Stream.null
    with stream:
        for i in range(4):
            fresh, fresh64 = rand((m, k), dtype)
            a[...] = fresh  # new values at the same address
            out[...] = poisoned((m, n), dtype)
            assert plan(a, w.T) is out
            stream.synchronize()
            check(out, fresh64 @ w64.T, dtype, k)
            assert plan.replays.captures == (0 if i == 0 else 1), plan.explain()
        out2 = poisoned((m, n), dtype)
        plan(a, w.T, out=out2)
        stream.synchronize()
        assert plan.replays.captures == 1
        check(out2, to64(a) @ w64.T, dtype, k)
    assert "replays a CUDA graph (1 captured" in plan.explain()
    assert pl.matmul_plan(a, w.T, out=out, graphs=False).replays is None


@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_matmul_into_the_same_out_replays(dtype):
    m, n, k = 128, 256, 384
    a, _ = rand((m, k), dtype)
    w, w64 = rand((n, k), dtype)
    out = poisoned((m, n), dtype)
    for _ in range(4):
        fresh, fresh64 = rand((m, k), dtype)
        a[...] = fresh
        out[...] = poisoned((m, n), dtype)
        assert pl.matmul(a, w.T, out=out) is out
        check(out, fresh64 @ w64.T, dtype, k)
    direct = mm.last_choice.launch.direct
    assert direct is not None and direct.replays.captures == 1, dict(mm.last_choice)


@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_a_loops_new_results_replay_where_the_pool_reuses_their_address(dtype):
    """``y = pl.matmul(a, b)`` in a loop: the pool hands the freed result's memory back,
    so the addresses repeat and the call replays; results that are kept get new
    addresses and are never written by a later call."""
    m, n, k = 128, 256, 384
    a, _ = rand((m, k), dtype)
    w, w64 = rand((n, k), dtype)
    for _ in range(6):
        fresh, fresh64 = rand((m, k), dtype)
        a[...] = fresh
        poisoned((m, n), dtype)  # freed at once: the block the result gets is NaN-filled
        y = pl.matmul(a, w.T)
        check(y, fresh64 @ w64.T, dtype, k)
        del y
    direct = mm.last_choice.launch.direct
    assert direct is not None and direct.replays.captures >= 1, dict(mm.last_choice)
    kept = []
    for _ in range(4):
        fresh, fresh64 = rand((m, k), dtype)
        a[...] = fresh
        kept.append((pl.matmul(a, w.T), fresh64 @ w64.T))
    for y, want in kept:
        check(y, want, dtype, k)


def test_a_torch_plan_replays_on_torchs_stream():
    torch = pytest.importorskip("torch")
    m, n, k = 256, 384, 512
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = torch.rand((m, k), device="cuda", dtype=torch.float16) * 2 - 1
        w = torch.rand((n, k), device="cuda", dtype=torch.float16) * 2 - 1
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        plan = pl.matmul_plan(a, w.T, out=out)
        for _ in range(4):
            a.copy_(torch.rand((m, k), device="cuda", dtype=torch.float16) * 2 - 1)
            out.fill_(float("nan"))
            plan(a, w.T)  # ordered after the fill on the side stream
            side.synchronize()
            check(out, a.double().cpu().numpy() @ w.double().cpu().numpy().T, "float16", k)
    assert plan.replays is not None and plan.replays.captures == 1, plan.explain()


def test_a_cupy_matmul_plan_says_how_to_capture_it():
    """Operands that are not BLAS matrices (no unit stride) run through cupy.matmul,
    which refuses a capture: the plan says what to do instead."""
    a, _ = rand((M, 2 * K), "float16")
    a = a[:, ::2]  # every other column: no unit stride
    w, _ = rand((N, K), "float16")
    out = poisoned((M, N), "float16")
    plan = pl.matmul_plan(a, w.T, out=out)
    assert plan.choice["impl"] == "cublas" and plan._direct is None, plan.choice
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        plan(a, w.T)
        stream.synchronize()
        stream.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
        try:
            with pytest.raises(pl.PycLabError, match="capturable=True"):
                plan(a, w.T)
        finally:
            stream.end_capture()


def test_the_never_slower_rule_with_a_losing_entry(tmp_path, monkeypatch):
    from pyc_lab.kernels.cutlass import GemmConfig
    from pyc_lab.kernels.tuning import database as tuning_db
    from pyc_lab.kernels.tuning.keys import Measurement, ProblemKey, device_key

    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "t.sqlite")
    device = device_key()[0]
    cfg = GemmConfig((128, 128, 64), (1, 2, 1), "TmaWarpSpecializedCooperative",
                     "TmaWarpSpecializedCooperative", "Default")
    m, n, k = 256, 384, 512
    with tuning_db.TuningDB() as db:
        db.record_many(device, ProblemKey("gemm", "f16", "f16", "f16", "tn", m, n, k),
                       [Measurement(cfg.to_dict(), "ok", 0.412),
                        Measurement({"baseline": "cublas"}, "baseline", 0.398)], run_id="r")
    mm.forget()
    x, x64 = rand((m, k), "float16")
    w, w64 = rand((n, k), "float16")
    out = poisoned((m, n), "float16")
    pl.matmul(x, w.T, out=out)
    assert mm.last_choice["impl"] == "cublas", dict(mm.last_choice)
    assert mm.last_choice["reason"].startswith(
        "tuned kernel 0.412 ms lost to cuBLAS 0.398 ms in its tuning run; cuBLAS")
    check(out, x64 @ w64.T, "float16", k)


# -- torch tensors --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_tensors_on_a_side_stream(dtype):
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        # produced on the side stream just before the call: pl.matmul must order after it
        a = (torch.rand((M, K), device="cuda", dtype=torch.float32) * 2 - 1).to(tdt)
        w = (torch.rand((N, K), device="cuda", dtype=torch.float32) * 2 - 1).to(tdt)
        y = pl.matmul(a, w.T)
        bias = (torch.rand((N,), device="cuda") * 2 - 1).to(tdt)
        y2 = pl.matmul(a, w.T, bias=bias, activation="relu")
        out = torch.full((M, N), float("nan"), device="cuda", dtype=tdt)
        plan = pl.matmul_plan(a, w.T, out=out)
        got3 = plan(a, w.T)
    side.synchronize()
    assert isinstance(y, torch.Tensor) and y.dtype == tdt and y.is_cuda
    assert got3 is out
    a64, w64 = a.double().cpu().numpy(), w.double().cpu().numpy()
    b64 = bias.double().cpu().numpy()
    check(y, a64 @ w64.T, dtype, K)
    check(y2, np.maximum(a64 @ w64.T + b64, 0), dtype, K, roundings=16)
    check(out, a64 @ w64.T, dtype, K)
    batched = torch.rand((2, M, K), device="cuda").to(tdt) * 2 - 1
    check(pl.matmul(batched, w.T), batched.double().cpu().numpy() @ w64.T, dtype, K)
    torch.cuda.synchronize()


def test_torch_data_pointer_is_shared_not_copied():
    torch = pytest.importorskip("torch")
    a = torch.rand((64, 32), device="cuda", dtype=torch.float16)
    w = torch.rand((48, 32), device="cuda", dtype=torch.float16)
    out = torch.empty((64, 48), device="cuda", dtype=torch.float16)
    ptr = out.data_ptr()
    assert pl.matmul(a, w.T, out=out) is out and out.data_ptr() == ptr
    torch.cuda.synchronize()
    check(out, a.double().cpu().numpy() @ w.double().cpu().numpy().T, "float16", 32)


# -- the direct library call (pointers and a stream, no per-call derivation) ---------------

DIRECT_CASES = {
    "row-major": lambda d: (rand((M, K), d), rand((K, N), d)),
    "linear-layer": lambda d: (rand((M, K), d), _t(rand((N, K), d))),
    "both-transposed": lambda d: (_t(rand((K, M), d)), _t(rand((N, K), d))),
    "gemv": lambda d: (rand((1, K), d), _t(rand((N, K), d))),
    "one-column": lambda d: (rand((M, K), d), rand((K, 1), d)),
    "padded-rows": lambda d: (_cols(rand((M, K + 8), d), K), rand((K, N), d)),
    "batched": lambda d: (rand((3, M, K), d), rand((3, K, N), d)),
    "broadcast-b": lambda d: (_t3(rand((3, K, M), d)), _t(rand((N, K), d))),
    # rows that continue across batches: one 2-D GEMM of 3 * M rows (blas_layout)
    "stack-over-one-b": lambda d: (rand((3, M, K), d), _t(rand((N, K), d))),
    "padded-stack": lambda d: (_last(rand((3, M, K + 8), d), K), rand((K, N), d)),
}


def _last(pair, k):
    x, x64 = pair
    return x[..., :k], x64[..., :k]


def _t(pair):
    x, x64 = pair
    return x.swapaxes(-1, -2), x64.swapaxes(-1, -2)


def _t3(pair):  # a batched transposed view: not foldable, so a real strided batch
    return _t(pair)


def _cols(pair, k):
    x, x64 = pair
    return x[:, :k], x64[:, :k]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(DIRECT_CASES))
def test_the_direct_call_computes_every_blas_layout(dtype, case):
    if not cublaslt.status()[0]:
        pytest.skip("no nvmath-python: no direct library calls")
    (a, a64), (b, b64) = DIRECT_CASES[case](dtype)
    want = a64 @ b64
    for _ in range(2):  # the first call makes the launch, the second takes the memo
        out = poisoned(want.shape, dtype)
        assert pl.matmul(a, b, out=out) is out
        check(out, want, dtype, a.shape[-1])
        y = pl.matmul(a, b)
        check(y, want, dtype, a.shape[-1])
    launch = mm.last_choice.launch
    if launch.choice["impl"] in ("cublas", "cublaslt"):
        assert launch.direct is not None, launch.choice


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_the_direct_call_scales_and_accumulates(dtype):
    if not cublaslt.status()[0]:
        pytest.skip("no nvmath-python")
    a, a64 = rand((M, K), dtype)
    w, w64 = rand((N, K), dtype)
    c, c64 = rand((M, N), dtype)
    got = pl.matmul(a, w.T, out=c, alpha=0.5, beta=-2.0)
    assert got is c
    check(c, 0.5 * (a64 @ w64.T) - 2.0 * c64, dtype, K, roundings=8)


def test_an_out_overlapping_an_operand_is_not_written_while_read():
    """out aliases b's memory: the direct call would read what it writes; the array
    library's copy runs instead, and the answer is NumPy's."""
    if not cublaslt.status()[0]:
        pytest.skip("no nvmath-python")
    n = 64
    a, a64 = rand((n, n), "float32")
    b, b64 = rand((n, n), "float32")
    want = a64 @ b64
    pl.matmul(a, b, out=cp.empty((n, n), dtype=cp.float32))  # memoise the signature
    assert pl.matmul(a, b, out=b) is b
    check(b, want, "float32", n)


def test_torch_calls_take_the_direct_call_on_their_stream():
    torch = pytest.importorskip("torch")
    if not cublaslt.status()[0]:
        pytest.skip("no nvmath-python")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = torch.rand((M, K), device="cuda", dtype=torch.float16) * 2 - 1
        w = torch.rand((N, K), device="cuda", dtype=torch.float16) * 2 - 1
        ys = [pl.matmul(a, w.T) for _ in range(3)]  # the 2nd and 3rd hit the torch memo
        launch = mm.last_choice.launch
        plan = pl.matmul_plan(a, w.T)
        a.mul_(-1.0)  # queued on the side stream after the calls above, before the plan's
        yp = plan(a, w.T)
    side.synchronize()
    assert launch.direct is not None and plan._direct is not None
    a64, w64 = a.double().cpu().numpy(), w.double().cpu().numpy()
    for y in ys:
        check(y, -a64 @ w64.T, "float16", K)
    check(yp, a64 @ w64.T, "float16", K)


def test_a_large_cublaslt_gemm_measures_its_candidates_and_is_right():
    if not cublaslt.status()[0]:
        pytest.skip("no nvmath-python")
    from pyc_lab.kernels import blas_direct

    m, n, k = 2048, 4096, 4096 + 8  # 2*m*n*k above MEASURE_FLOP
    assert 2.0 * m * n * k >= blas_direct.MEASURE_FLOP
    a, a64 = rand((m, k), "bfloat16")
    w, w64 = rand((n, k), "bfloat16")
    out = poisoned((m, n), "bfloat16")
    assert pl.matmul(a, w.T, out=out) is out
    launch = mm.last_choice.launch
    check(out, a64 @ w64.T, "bfloat16", k)
    if launch.direct is None:
        pytest.skip(f"routed elsewhere here: {launch.choice}")
    raced = launch.direct.gemm
    assert isinstance(raced, RacedGemm) and raced.name == "library", launch.choice
    assert set(raced.measured) == {"default_ms", "challenger_ms"}
    assert launch.choice["impl"] == raced.impl and "ms against" in launch.choice["library"]
    gemm = raced.default  # cuBLASLt, bfloat16's library, raced against cuBLAS
    assert gemm.impl == "cublaslt" and gemm.measured, "the candidates were not timed"
    (timed,) = gemm.measured.values()
    assert len(timed["ms"]) > 1
    ms, chosen, again = timed["ms"], timed["chosen"], timed["confirmation_ms"]
    best = min(range(len(ms)), key=ms.__getitem__)
    assert ms[best] < float("inf")
    margin = 1 - blas_direct.MEASURE_MARGIN
    # the heuristic's first, unless the fastest beat it by the margin twice: in the race
    # of all candidates and in a race of its own
    if chosen:
        assert chosen == best and ms[best] <= ms[0] * margin and again[1] <= again[0] * margin
    else:
        assert ms[best] > ms[0] * margin or (len(again) == 2 and again[1] > again[0] * margin)
    check(pl.matmul(a, w.T), a64 @ w64.T, "bfloat16", k)  # whichever library won


def test_a_large_float16_gemm_races_cublas_against_cublaslt():
    """float16's library is cuBLAS; for a large problem the first call also times
    cuBLASLt's measured algorithm and keeps it where it is the margin faster. Either
    way the product is right, and the choice says what ran and what was measured."""
    if not cublaslt.status()[0]:
        pytest.skip("no nvmath-python")
    m, n, k = 2048, 4096, 8192
    a, a64 = rand((m, k), "float16")
    w, w64 = rand((n, k), "float16")
    out = poisoned((m, n), "float16")
    pl.matmul(a, w.T, out=out)
    check(out, a64 @ w64.T, "float16", k)
    raced = mm.last_choice.launch.direct.gemm
    assert isinstance(raced, RacedGemm) and raced.default.impl == "cublas"
    assert raced.challenger.impl == "cublaslt" and raced.use_challenger is not None
    assert mm.last_choice["impl"] == raced.impl
    assert mm.last_choice["library"].startswith("ran" if raced.use_challenger else "not used")
    out.fill(cp.nan)
    pl.matmul(a, w.T, out=out)
    check(out, a64 @ w64.T, "float16", k)


@pytest.mark.parametrize("case", sorted(DIRECT_CASES))
def test_both_cublaslt_descriptions_compute_every_layout(case):
    """Each description LtGemm can choose (b^T a^T with row orders; a @ b as given),
    forced in turn, computes the product for every layout (large problems race both)."""
    if not cublaslt.status()[0]:
        pytest.skip("no nvmath-python")
    from pyc_lab.kernels import blas_direct
    from pyc_lab.kernels.blas_layout import describe
    from pyc_lab.kernels.matmul_plan import _elements

    (a, a64), (b, b64) = DIRECT_CASES[case]("bfloat16")
    want = a64 @ b64
    out = poisoned(want.shape, "bfloat16")
    g = describe(a.shape, _elements(a), b.shape, _elements(b), _elements(out))
    lt = blas_direct.LtGemm(g, "bfloat16")
    assert len(lt._forms) == 2
    handle = blas_direct._lt_handle(cp.cuda.runtime.getDevice())
    ptrs = (a.data.ptr, b.data.ptr, out.data.ptr)
    key = tuple(blas_direct.alignment(p) for p in ptrs)
    stream = cp.cuda.get_current_stream().ptr
    ran = 0
    for form in lt._forms:
        found = lt._candidates(form, key, handle, 1)
        if not len(found):
            continue
        lt._algos[key] = (form, found.copy())
        lt._need = max(lt._need, int(found["workspace_size"][0]))
        out.view(cp.uint16).fill(0x7FC0)
        lt(*ptrs, stream)
        check(out, want, "bfloat16", a.shape[-1])
        ran += 1
    assert ran >= 1
