"""The small GEMM on the CPU: which matmuls it takes, its generated kernels run by the
emulator (every entry, four dtypes, odd extents, NaN/inf/-0.0, poisoned outputs) against
a float64 reference, and the matmul step's first-call race with the kernel emulated."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from pyc_lab.compiler import Graph
from pyc_lab.compiler.backend import small_gemm as small_step
from pyc_lab.compiler.backend.lowering import lower
from pyc_lab.compiler.codegen.small_gemm import (
    MAX_ROWS,
    MAX_THREAD_TERMS,
    check_small_gemm,
    entries_for,
    generate_small_gemm,
    launch_shape,
)
from pyc_lab.compiler.ops import ACTIVATIONS, run_graph
from tests.compiler.backend.test_steps import _PtrArray
from tests.compiler.emulate import emulate_threads, needs_gxx

F16, F32, F64 = np.float16, np.float32, np.float64
BF16 = pytest.importorskip("ml_dtypes").bfloat16
#: (rtol, atol) against the float64 reference, by operand dtype.
TOL = {"float16": (1e-2, 1e-2), "bfloat16": (3e-2, 3e-2), "float32": (1e-5, 1e-5),
       "float64": (1e-12, 1e-12)}


def _graph(m, n, k, dtype, *, bias=None, act=None, transpose_b=True, out_dtype=None):
    """``act(x @ w.T + bias)`` (``w`` N x K) or ``act(x @ w + bias)`` (``w`` K x N)."""
    g = Graph(name="small")
    x = g.add("input", (), {"index": 0}, shape=(m, k), dtype=dtype)
    w = g.add("input", (), {"index": 1}, shape=(n, k) if transpose_b else (k, n), dtype=dtype)
    ins = [x.id, w.id]
    if bias is not None:
        ins.append(g.add("input", (), {"index": 2}, shape=bias[0], dtype=bias[1]).id)
    attrs = {"transpose_b": transpose_b, **({"activation": act} if act else {})}
    out_dtype = out_dtype or (np.result_type(dtype, bias[1]) if bias else dtype)
    mm = g.add("matmul", ins, attrs, shape=(m, n), dtype=out_dtype)
    g.outputs = [mm.id]
    return g, mm


def _values(rng, shape, dtype, special=False):
    """Random values in [-2, -0.1] u [0.1, 2] (never zero); with ``special`` a NaN, an
    infinity of each sign and a -0.0 at random places."""
    v = rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    if special:
        flat = v.reshape(-1)
        spots = rng.choice(flat.size, size=min(4, flat.size), replace=False)
        for spot, s in zip(spots, (np.nan, np.inf, -np.inf, -0.0), strict=False):
            flat[spot] = s
    return v.astype(dtype)


def _reference(x, w, bias, act, out_dtype, product_dtype):
    """NumPy's answer in float64: the product rounded to its dtype first, as the library
    GEMM's output is, then the epilogue (through the op registry's NumPy references)."""
    with np.errstate(all="ignore"):
        p = (x.astype(F64) @ w.astype(F64)).astype(product_dtype).astype(F64)
    return _epilogue(p, bias, act).astype(out_dtype)


def _epilogue(p, bias, act):
    """``act(p + bias)`` in float64 by the op registry's NumPy references."""
    with np.errstate(all="ignore"):
        if bias is not None:
            p = p + bias.astype(F64)
        if act:
            g = Graph(name="act")
            i = g.add("input", (), {"index": 0}, shape=p.shape, dtype=F64)
            o = g.add(act, [i.id])
            g.outputs = [o.id]
            p = run_graph(g, [p], np)[0]
    return p


def _run(src, entry, x, w_view, bias, out):
    """Launch ``entry`` through the emulator as the step launches it."""
    item = x.itemsize
    plans = entries_for(src, (x.strides[0] // item, x.strides[1] // item),
                        (w_view.strides[0] // item, w_view.strides[1] // item),
                        x.__array_interface__["data"][0], w_view.__array_interface__["data"][0])
    (plan,) = [p for p in plans if p[0] == entry]
    grid, block = launch_shape(src, entry)
    args = [x, w_view, *([bias] if bias is not None else []), out,
            *(ctypes.c_longlong(v) for v in plan[1:])]
    emulate_threads(src, entry, args, grid, block[0])


CASES = [  # (m, n, k, dtype, bias dtype or None, activation)
    (1, 37, 40, F32, F32, "relu"),
    (3, 5, 7, F32, None, None),
    (8, 33, 64, F32, F32, "gelu"),
    (13, 9, 24, F64, F64, "sigmoid"),
    (1, 16, 1, F32, F32, "tanh"),
    (5, 40, 48, F16, F16, "silu"),
    (6, 24, 16, F16, F32, "relu"),
    (4, 17, 32, BF16, BF16, "relu"),
    (MAX_ROWS, 12, 16, F32, F32, None),
    (MAX_ROWS + 1, 40, 70, F32, F32, "relu"),  # the tiled entry only, partial tiles
    (100, 6, 5, F64, None, None),
]


@needs_gxx
@pytest.mark.parametrize("transpose_b", [True, False], ids=["w.T", "w"])
@pytest.mark.parametrize(("m", "n", "k", "dtype", "bias_dtype", "act"), CASES)
def test_every_entry_matches_numpy(m, n, k, dtype, bias_dtype, act, transpose_b):
    rng = np.random.default_rng()
    bias_spec = ((n,), bias_dtype) if bias_dtype is not None else None
    g, node = _graph(m, n, k, dtype, bias=bias_spec, act=act, transpose_b=transpose_b)
    assert check_small_gemm(node, g) == ""
    src = generate_small_gemm(node, g)
    x = _values(rng, (m, k), dtype, special=True)
    w = _values(rng, (n, k) if transpose_b else (k, n), dtype)
    w_view = w.T if transpose_b else w
    bias = _values(rng, (n,), bias_dtype) if bias_dtype is not None else None
    want = _reference(x, w_view, bias, act, node.dtype, dtype)
    item = x.itemsize
    entries = [p[0] for p in entries_for(src, (k, 1), (w_view.strides[0] // item,
                                                       w_view.strides[1] // item), 0, 0)]
    assert entries[-2:] == [f"{src.name}_t", f"{src.name}_e"]
    assert (len(entries) > 2) == (m <= MAX_ROWS)  # a column form for few rows
    for entry in entries:
        if entry.endswith("_k") and src.launch["vec"]:
            x_in = np.empty(m * k + 1, dtype)[1:].reshape(m, k)  # misaligned: no vectors
            x_in[...] = x
        else:
            x_in = x
        out = np.full((m, n), np.nan, node.dtype)  # poisoned
        _run(src, entry, x_in, w_view, bias, out)
        rtol, atol = TOL[np.dtype(dtype).name]
        np.testing.assert_allclose(out.astype(F64), want.astype(F64), rtol=rtol, atol=atol,
                                   equal_nan=True, err_msg=entry)
        assert np.array_equal(np.isnan(out), np.isnan(want)), entry


def test_refusals_say_why():
    g, node = _graph(MAX_ROWS + 1, 8, 8, F32)
    assert check_small_gemm(node, g) == ""  # many rows: the tiled entry alone
    assert [e[-2:] for e in generate_small_gemm(node, g).entries] == ["_t", "_e"]
    g, node = _graph(MAX_ROWS + 1, 8, MAX_THREAD_TERMS + 1, F32)  # a long sum: no _e
    assert [e[-2:] for e in generate_small_gemm(node, g).entries] == ["_t"]
    g, node = _graph(64, 2048, 4096, F32)
    assert "flops" in check_small_gemm(node, g)
    g, node = _graph(4, 8, 8, F32, bias=((4, 8), F32))
    assert "bias of shape" in check_small_gemm(node, g)
    g, node = _graph(4, 8, 8, np.int32)
    assert "operands" in check_small_gemm(node, g)
    g = Graph(name="broadcast")
    x = g.add("input", (), {"index": 0}, shape=(2, 4, 8), dtype=F32)
    w = g.add("input", (), {"index": 1}, shape=(1, 8, 8), dtype=F32)
    mm = g.add("matmul", [x.id, w.id], {}, shape=(2, 4, 8), dtype=F32)
    assert "broadcast" in check_small_gemm(mm, g)
    with pytest.raises(ValueError, match="broadcast"):
        generate_small_gemm(mm, g)
    v = g.add("input", (), {"index": 2}, shape=(8,), dtype=F32)
    mv = g.add("matmul", [x.id, v.id], {}, shape=(2, 4), dtype=F32)
    assert "vector" in check_small_gemm(mv, g)
    assert {"relu", "gelu", "silu", "sigmoid", "tanh"} <= set(ACTIVATIONS)


def test_entries_follow_the_operands_layout_and_alignment():
    g, node = _graph(4, 8, 16, F32)
    src = generate_small_gemm(node, g)
    name = src.name

    def entries(*args):
        return [p[0][len(name):] for p in entries_for(src, *args)]

    assert entries((16, 1), (1, 16), 0, 64) == ["_kv", "_k", "_t", "_e"]
    assert entries((16, 1), (1, 16), 4, 64) == ["_k", "_t", "_e"]  # misaligned
    assert entries((18, 1), (1, 16), 0, 64) == ["_k", "_t", "_e"]  # a row stride
    assert entries_for(src, (16, 1), (8, 1), 0, 64) == [(f"{name}_n", 16, 8, 1, 0, 0),
                                                        (f"{name}_t", 16, 8, 1, 0, 0),
                                                        (f"{name}_e", 16, 8, 1, 0, 0)]
    assert entries_for(src, (1, 4), (1, 16), 0, 64) == []  # a transposed a
    assert entries_for(src, (16, 1), (2, 32), 0, 64) == []  # no unit stride in b
    assert launch_shape(src, f"{name}_k") == ((1, 1, 1), (256,))
    assert launch_shape(src, f"{name}_n") == ((1, 1, 1), (256,))
    g, node = _graph(100, 70, 16, F32)
    src = generate_small_gemm(node, g)
    assert launch_shape(src, f"{src.name}_t") == ((3, 4, 1), (256,))
    assert launch_shape(src, f"{src.name}_e") == ((28, 1, 1), (256,))  # 7000 outputs


# -- the step's first-call race, with NumPy standing in for CuPy -----------------------------
def _ptr(a):
    """``a`` (a view stays a view) with CuPy's ``.data.ptr``."""
    return np.asarray(a).view(_PtrArray)


class _Emulated:
    """The generated kernel ``entry`` run by the emulator, called as a RawKernel is."""

    def __init__(self, src, entry) -> None:
        self.src, self.entry, self.launches = src, entry, 0

    def __call__(self, grid, block, args) -> None:
        self.launches += 1
        conv = [np.asarray(a) if isinstance(a, np.ndarray) else ctypes.c_longlong(int(a))
                for a in args]  # a view passes its first element's address, as in CuPy
        emulate_threads(self.src, self.entry, conv, grid, block[0])


class _Epilogue:
    """The library path's generated epilogue, as NumPy: relu(product + bias)."""

    def __init__(self) -> None:
        self.launches = 0

    def __call__(self, grid, block, args) -> None:
        self.launches += 1
        product, bias, out = (np.asarray(a) for a in args)
        out[...] = np.maximum(product + bias, 0)


class _Exe:
    def __init__(self, graph) -> None:
        self.graph = graph
        self._sm_count = 1
        self._fallbacks: dict[int, str] = {}
        self._cp = SimpleNamespace(
            matmul=lambda a, b: _ptr(np.matmul(a, b)),
            empty=lambda shape, dtype: _ptr(np.full(shape, np.nan, dtype)),
            ascontiguousarray=lambda a: _ptr(np.ascontiguousarray(a)),
            cuda=SimpleNamespace(get_current_stream=lambda: SimpleNamespace(ptr=7)))

    def _buffer_view(self, buf, node):  # pragma: no cover - no plan here
        raise AssertionError("no planned buffers in this test")


@pytest.fixture
def small_step_case(monkeypatch):
    """A relu(x @ w.T + b) step with 5 rows, its small kernel emulated, the race's
    timings given by the test."""
    from pyc_lab.kernels import blas_direct

    g, node = _graph(5, 24, 32, F32, bias=((24,), F32), act="relu")
    (step,) = lower(g, {node.id: "cublas"}).steps
    assert step.small is not None and "small GEMM" in step.describe["implementation"]
    src = step.small.src
    step.small.kernels = {e: _Emulated(src, e) for e in src.entries}
    step.kernels = {e: _Epilogue() for e in step.epilogue.entries}
    step.bias_node = g.node(node.inputs[2])
    step.product_dtype = np.dtype(F32)
    timings: dict[str, list[float]] = {}
    monkeypatch.setattr(blas_direct, "_capturing", lambda stream: False)

    def race(runs, stream, rounds):
        for run in runs:  # each candidate runs (the emulated kernels into scratch)
            run()
        library, *small = timings["ms"]
        return [library] + small * (len(runs) - 1) if len(small) == 1 else timings["ms"]

    monkeypatch.setattr(blas_direct, "race", race)
    rng = np.random.default_rng()
    values = {g.inputs[0]: _ptr(_values(rng, (5, 32), F32)),
              g.inputs[1]: _ptr(_values(rng, (24, 32), F32)),
              g.inputs[2]: _ptr(_values(rng, (24,), F32))}
    want = np.maximum(values[g.inputs[0]].astype(F64) @ values[g.inputs[1]].astype(F64).T
                      + values[g.inputs[2]], 0)
    return step, _Exe(g), values, node, timings, want


@needs_gxx
def test_step_runs_the_small_kernel_where_it_won(small_step_case):
    step, exe, values, node, timings, want = small_step_case
    timings["ms"] = [0.010, 0.006, 0.004, 0.005, 0.007]  # library, _kv, _k, _t, _e
    step.run(exe, values)
    assert step.small.use is True and step.last_entry == f"{step.small.src.name}_k"
    assert set(step.small.measured) == {"library_ms", *step.small.src.entries} - {
        f"{step.small.src.name}_n"}
    np.testing.assert_allclose(values[node.id], want, rtol=1e-5, atol=1e-5)
    assert "small GEMM ran" in step.describe["notes"]
    assert not step.graph_workspace  # a capture records the kernel, no cuBLAS workspace
    call = step.graph_call(exe, values, None)
    values[node.inputs[0]][...] *= -1.0  # replays read the static arrays' new values
    call()
    want2 = np.maximum(np.asarray(values[node.inputs[0]]).astype(F64)
                       @ np.asarray(values[node.inputs[1]]).astype(F64).T
                       + values[node.inputs[2]], 0)
    np.testing.assert_allclose(values[node.id], want2, rtol=1e-5, atol=1e-5)


@needs_gxx
def test_step_keeps_the_library_path_where_the_kernel_lost(small_step_case):
    step, exe, values, node, timings, want = small_step_case
    timings["ms"] = [0.010, 0.0099]  # 1 % faster: not enough
    step.run(exe, values)
    assert step.small.use is False
    assert step.last_entry in step.epilogue.entries  # the epilogue after the library GEMM
    np.testing.assert_allclose(values[node.id], want, rtol=1e-5, atol=1e-5)
    assert "small GEMM not used" in step.describe["notes"]
    assert step.graph_workspace
    launches = sum(k.launches for k in step.small.kernels.values())
    step.run(exe, values)  # decided once: no second race, no kernel launch
    assert sum(k.launches for k in step.small.kernels.values()) == launches


@needs_gxx
def test_forms_that_cannot_run_are_never_chosen(small_step_case):
    step, exe, values, node, timings, want = small_step_case
    timings["ms"] = [float("inf")] * 5  # the library and the four forms
    step.run(exe, values)  # every candidate failed in the race: the library path runs
    assert step.small.use is False and step.small.choice is None
    np.testing.assert_allclose(values[node.id], want, rtol=1e-5, atol=1e-5)


def test_disabled_small_gemm_is_not_offered(monkeypatch):
    monkeypatch.setattr(small_step, "ENABLED", False)
    g, node = _graph(5, 24, 32, F32, bias=((24,), F32), act="relu")
    (step,) = lower(g, {node.id: "cublas"}).steps
    assert step.small is None


def test_a_kernel_that_cannot_build_leaves_the_library_path(monkeypatch, caplog):
    g, node = _graph(5, 24, 32, F32)
    (step,) = lower(g, {node.id: "cublas"}).steps

    def refuse(src, entry):
        raise RuntimeError("no NVRTC here")

    monkeypatch.setattr(small_step, "compile_kernel", refuse)
    step.small.prepare()
    assert step.small.use is False and "not built" in step.small.note
    assert step._small_call(_Exe(g), {}, None, None) is None


# -- stacks and batches ------------------------------------------------------------------------
def _batched_graph(a_shape, b_shape, dtype, *, transpose_b, bias_n=None, act=None):
    g = Graph(name="batched")
    x = g.add("input", (), {"index": 0}, shape=a_shape, dtype=dtype)
    w = g.add("input", (), {"index": 1}, shape=b_shape, dtype=dtype)
    ins = [x.id, w.id]
    if bias_n is not None:
        ins.append(g.add("input", (), {"index": 2}, shape=(1, bias_n), dtype=dtype).id)
    n = b_shape[-2] if transpose_b else b_shape[-1]
    mm = g.add("matmul", ins, {"transpose_b": transpose_b, **({"activation": act} if act else {})},
               shape=(*a_shape[:-1], n), dtype=dtype)
    g.outputs = [mm.id]
    return g, mm


BATCHED = [  # (a shape, b shape, transpose_b, bias, activation, expected launch batch)
    ((3, 5, 24), (40, 24), True, True, "relu", 1),  # a stack times one weight: 15 rows
    ((2, 3, 70, 16), (16, 9), False, False, None, 1),
    ((4, 9, 9), (4, 9, 64), False, True, "relu", 4),  # a GCN's adjacency products
    ((3, 7, 33), (3, 20, 33), True, False, "gelu", 3),
    ((2, 2, 40, 8), (2, 2, 8, 12), False, True, None, 4),
]


@needs_gxx
@pytest.mark.parametrize(("a_shape", "b_shape", "transpose_b", "with_bias", "act", "batch"),
                         BATCHED)
def test_stacks_and_batches_match_numpy(a_shape, b_shape, transpose_b, with_bias, act, batch):
    rng = np.random.default_rng()
    n = b_shape[-2] if transpose_b else b_shape[-1]
    g, node = _batched_graph(a_shape, b_shape, F32, transpose_b=transpose_b,
                             bias_n=n if with_bias else None, act=act)
    assert check_small_gemm(node, g) == ""
    src = generate_small_gemm(node, g)
    assert src.launch["batch"] == batch
    x = _ptr(_values(rng, a_shape, F32, special=True))
    w = _ptr(_values(rng, b_shape, F32))
    w_view = w.swapaxes(-1, -2) if transpose_b else w
    bias = _ptr(_values(rng, (1, n), F32)) if with_bias else None
    with np.errstate(all="ignore"):
        want = np.matmul(x.astype(F64), w_view.astype(F64)).astype(F32).astype(F64)
    want = _epilogue(want, bias, act).astype(F32)
    small = small_step.SmallGemm(src)
    plans = small.plans(x, w_view)
    assert plans and [p[0] for p in plans[-2:]] == [f"{src.name}_t", f"{src.name}_e"]
    for plan in plans:
        out = np.full(node.shape, np.nan, F32)
        grid, block = launch_shape(src, plan[0])
        assert grid[2] == batch
        args = [np.asarray(x), np.asarray(w_view), *([np.asarray(bias)] if with_bias else []),
                out, *(ctypes.c_longlong(v) for v in plan[1:])]
        emulate_threads(src, plan[0], args, grid, block[0])
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, equal_nan=True,
                                   err_msg=plan[0])
        assert np.array_equal(np.isnan(out), np.isnan(want)), plan[0]


def test_views_that_need_a_copy_are_not_planned():
    g, node = _batched_graph((3, 5, 24), (40, 24), F32, transpose_b=True)
    small = small_step.SmallGemm(generate_small_gemm(node, g))
    x = _ptr(np.zeros((5, 3, 24), F32)).swapaxes(0, 1)  # rows not one stride apart
    w = _ptr(np.zeros((40, 24), F32)).T
    assert small.plans(x, w) == []
    assert small.plans(_ptr(np.zeros((3, 5, 24), F32)), w)  # the contiguous stack is fine
