"""Property test: the default pipeline never changes what a random traced function computes.

Hypothesis composes random programs from elementwise, reduction, matmul and shape steps
(including hand-written softmax, layer norm, variance, MLP layers and the identities the
simplifier knows), traces them on random float32/float64 inputs — sometimes with NaN,
Inf and -0.0 in them — and checks that the optimised graph verifies, gives the same
results as the unoptimised graph and as NumPy itself, and can be memory-planned.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyc_lab.compiler import trace
from pyc_lab.compiler.memory import plan_memory
from pyc_lab.compiler.ops import run_graph
from pyc_lab.compiler.passes import PassManager

TOL = {np.dtype(np.float32): (1e-5, 1e-5), np.dtype(np.float64): (1e-12, 1e-12)}


def _softmax(a, axis):
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _layer_norm(a, g, b):
    m = a.mean(axis=-1, keepdims=True)
    return (a - m) / np.sqrt(a.var(axis=-1, keepdims=True) + 1e-5) * g + b


def _layer_norm_sq(a, g):
    c = a - a.mean(axis=-1, keepdims=True)
    return c / np.sqrt(np.mean(c ** 2, axis=-1, keepdims=True) + 1e-3) * g


# every step maps (M, N) values (and the (N, N) weight w, (N,) vector b) to an (M, N) value
UNARY: dict[str, Callable] = {
    "tanh": lambda a, w, b: np.tanh(a),
    "exp": lambda a, w, b: np.exp(-np.abs(a)),
    "neg": lambda a, w, b: -a,
    "negneg": lambda a, w, b: np.negative(-a),
    "mul1": lambda a, w, b: a * 1.0,
    "one_mul": lambda a, w, b: 1.0 * a,
    "add0": lambda a, w, b: a + 0.0,
    "sub0": lambda a, w, b: a - 0.0,
    "div1": lambda a, w, b: a / 1.0,
    "mul0": lambda a, w, b: a * 0.0 + a,
    "pow1": lambda a, w, b: a ** 1.0,
    "pow2": lambda a, w, b: a ** 2.0,
    "sqrt": lambda a, w, b: np.abs(a) ** 0.5,
    "rsqrt": lambda a, w, b: 1.0 / np.sqrt(np.abs(a) + 1.0),
    "relu": lambda a, w, b: np.maximum(a, 0.0),
    "relu_left": lambda a, w, b: np.maximum(0.0, a),
    "sigmoid": lambda a, w, b: 1.0 / (1.0 + np.exp(-a)),
    "scale": lambda a, w, b: 2.5 * a - 0.5,
    "astype": lambda a, w, b: a.astype(a.dtype),
    "roundtrip": lambda a, w, b: a.astype(np.float64).astype(a.dtype),
    "log": lambda a, w, b: np.log(np.abs(a) + 1.0),
    "clip": lambda a, w, b: np.clip(a, -1.0, 1.0),
    "where": lambda a, w, b: np.where(a > 0.0, a, 0.5 * a),
    "softmax_last": lambda a, w, b: _softmax(a, -1),
    "softmax_first": lambda a, w, b: _softmax(a, 0),
    "layer_norm": lambda a, w, b: _layer_norm(a, b, b * 0.5),
    "layer_norm_sq": lambda a, w, b: _layer_norm_sq(a, b),
    "center": lambda a, w, b: a - a.mean(axis=-1, keepdims=True),
    "range_norm": lambda a, w, b: a / (a.max(-1, keepdims=True) - a.min(-1, keepdims=True)
                                       + 1.0),
    "variance": lambda a, w, b: a - ((a - a.mean(0, keepdims=True)) ** 2).mean(0),
    "sum_rows": lambda a, w, b: a + a.sum(axis=0),
    "total": lambda a, w, b: a * np.sum(a) * 0.01,
    "matmul": lambda a, w, b: a @ w,
    "matmul_bias": lambda a, w, b: a @ w + b,
    "bias_left": lambda a, w, b: b + a @ w,
    "mlp_tanh": lambda a, w, b: np.tanh(a @ w + b),
    "mlp_relu": lambda a, w, b: np.maximum(a @ w.T + b, 0.0),
    "mm_twice": lambda a, w, b: (a @ w) * 0.5 + (a @ w),
    "transposed": lambda a, w, b: (w @ a.T).T,
    "tt": lambda a, w, b: a.T.T,
    "reshape": lambda a, w, b: a.reshape(-1).reshape(a.shape),
    "flip": lambda a, w, b: a[:, ::-1],
    "concat": lambda a, w, b: np.concatenate([a[:, 1:], a[:, :1]], axis=1),
    "squeeze": lambda a, w, b: np.squeeze(np.expand_dims(a, 0), 0),
}

BINARY: dict[str, Callable] = {
    "add": lambda a, c: a + c,
    "sub": lambda a, c: a - c,
    "mul": lambda a, c: a * c,
    "div": lambda a, c: a / (np.abs(c) + 1.0),
    "max": np.maximum,
    "min": np.minimum,
    "select": lambda a, c: np.where(a > c, a, c),
    "dup": lambda a, c: a * c + a * c,
    "norm": lambda a, c: np.sqrt(a * a + c * c),
}

STEP = st.one_of(
    st.tuples(st.just("u"), st.sampled_from(sorted(UNARY)), st.integers(0, 99)),
    st.tuples(st.just("b"), st.sampled_from(sorted(BINARY)), st.integers(0, 99),
              st.integers(0, 99)),
)


def _program(steps: list[tuple], outputs: list[int]) -> Callable:
    def fn(x, y, w, b):
        pool = [x, y]
        for step in steps:
            if step[0] == "u":
                pool.append(UNARY[step[1]](pool[step[2] % len(pool)], w, b))
            else:
                a, c = pool[step[2] % len(pool)], pool[step[3] % len(pool)]
                pool.append(BINARY[step[1]](a, c))
        return tuple(pool[k % len(pool)] for k in [-1, *outputs])

    return fn


def _inputs(rng: np.random.Generator, m: int, n: int, dtype, specials: bool) -> list:
    x, y = (rng.standard_normal((m, n)).astype(dtype) for _ in range(2))
    w = (rng.standard_normal((n, n)) / n).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    if specials:
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=min(4, flat.size), replace=False)
        flat[idx] = np.array([np.nan, np.inf, -np.inf, -0.0], dtype)[: idx.size]
    return [x, y, w, b]


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    rtol, atol = TOL[want.dtype]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(STEP, min_size=1, max_size=8),
    outputs=st.lists(st.integers(0, 99), max_size=2),
    dtype=st.sampled_from([np.float32, np.float64]),
    m=st.integers(1, 4),
    n=st.integers(2, 5),
    specials=st.booleans(),
    mode=st.sampled_from(["balanced", "memory_first"]),
)
def test_pipeline_preserves_random_programs(steps, outputs, dtype, m, n, specials, mode):
    fn = _program(steps, outputs)
    rng = np.random.default_rng()
    graph, _ = trace(fn, _inputs(rng, m, n, dtype, False))
    result = PassManager(mode=mode).run(graph)
    optimised = result.graph
    optimised.verify()
    assert len(optimised) <= len(graph) + 1
    for _ in range(2):  # fresh inputs, not the tracing ones
        args = _inputs(rng, m, n, dtype, specials)
        with np.errstate(all="ignore"):
            want = run_graph(graph, args, np)
            got = run_graph(optimised, args, np)
            direct = fn(*args)
        for k, (g, w, d) in enumerate(zip(got, want, direct, strict=True)):
            _close(g, w, f"output {k}: optimised vs unoptimised graph\n{optimised.text()}")
            _close(g, np.asarray(d), f"output {k}: optimised graph vs NumPy")
    plan = plan_memory(optimised, mode)
    assert plan.peak_bytes <= plan.planned_bytes
    assert plan.peak_bytes <= plan.naive_bytes
