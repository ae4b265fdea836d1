"""Property test: the CUDA kernels generated for random NumPy programs compute what NumPy
computes, run on the CPU emulator (``tests/compiler/emulate.py``).

``test_fuzz_numpy.py`` checks the passes on the numpy backend, which evaluates a fused
body op by op; the generated CUDA is not in that loop. Here hypothesis writes random
float programs (float32, float16, bfloat16, float64, an operand of another float dtype,
a boolean mask, casts) — elementwise chains over broadcast operands, slices of the
inputs, reductions over the last, first, middle, trailing or all axes (kept or
broadcast back), argmax and argmin, programs that also return their statistics or
intermediates, concatenations of computed pieces — which are traced and optimised as
``pl.compile`` does for the CuPy backend; every kernel the backend would generate
(elementwise, row, row-program, column) is then launched on the emulator as the
backend's launchers launch it, from aligned inputs into NaN-poisoned outputs, and every
output it writes is compared with NumPy's value of that node (the node evaluated in its
own dtype from the reference values of its inputs). Inputs are fresh random values with
NaN, infinities and -0.0 mixed in.

Divisions and square roots only ever take values the generator knows to be positive
and away from zero, so a comparison is not at the mercy of cancellation; the tolerance
is relative to the output's largest magnitude (kernels reduce in another order and call
CUDA's libm, which NumPy does not). ``ci`` runs a fixed handful of programs;
``HYPOTHESIS_PROFILE=nightly`` many random ones.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyc_lab.compiler.codegen import generate, supports
from pyc_lab.compiler.codegen.column_reduction import split_count
from pyc_lab.compiler.ops import evaluate
from pyc_lab.compiler.passes import PassManager
from pyc_lab.compiler.policy import choose
from pyc_lab.compiler.tracer import trace
from tests.compiler.emulate import emulate, emulate_threads, needs_gxx

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)
_NIGHTLY = os.environ.get("HYPOTHESIS_PROFILE") == "nightly"
#: Largest difference allowed, relative to the output's largest finite magnitude (at
#: least 1): kernels accumulate in float32 (float64 for float64) in their own order,
#: and float16 rounds after every op on both sides, so a difference of one rounding can
#: travel down a chain.
_TOL = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 2e-5, "float64": 1e-11}
_DIMS = st.sampled_from([1, 2, 3, 5, 7, 16, 33, 64, 130, 257, 1030, 2050])


# -- the programs ------------------------------------------------------------------------
Value = tuple[str, bool, tuple[int, ...]]  # expression, known positive, shape


class _Builder:
    """Writes a program's steps; each value is known positive or not, and has a shape."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw

    def unary(self, v: Value) -> Value:
        expr, positive, shape = v
        op = self.draw(st.sampled_from(["exp", "tanh", "abs", "neg", "sq", "sqrt", "sin",
                                        "scale", "recip", "max0", "select", "table"]))
        if op == "select":  # NumPy's np.select: a chain of selects
            return (f"np.select([{expr} < -0.5, {expr} > 0.5], [{expr} * 2, 0.25], "
                    f"default={expr})"), False, shape
        if op == "table":  # lookups in constant tables: comparisons and gathers
            kind = self.draw(st.sampled_from(["interp", "digitize", "isin", "sinc"]))
            return {"interp": f"np.interp({expr}, [-1.0, 0.0, 0.5, 2.0], [3.0, -1.0, 0.0, 1.0])",
                    "digitize": f"(np.digitize({expr}, [-1.0, 0.0, 1.0]) * 0.5)",
                    "isin": f"np.where(np.isin(np.floor({expr} * 2), [0.0, 1.0]), {expr}, 0.5)",
                    "sinc": f"np.sinc({expr})"}[kind], False, shape
        if op == "exp":  # bounded: no overflow on either side
            return f"np.exp(np.tanh({expr}))", True, shape
        if op == "abs":
            return f"(np.abs({expr}) + 0.5)", True, shape
        if op == "sqrt" and positive:
            return f"np.sqrt({expr})", True, shape
        if op == "recip" and positive:
            return f"(1.0 / {expr})", True, shape
        if op == "scale":
            return f"({expr} * 0.75 + 0.25)", positive, shape
        return {"neg": f"(-{expr})", "sq": f"np.tanh({expr}) ** 2", "sin": f"np.sin({expr})",
                "max0": f"np.maximum({expr}, 0)"}.get(op, f"np.tanh({expr})"), False, shape

    def binary(self, a: Value, b: Value) -> Value:
        op = self.draw(st.sampled_from(["add", "sub", "mul", "div", "max", "where"]))
        shape = tuple(np.broadcast_shapes(a[2], b[2]))
        both = a[1] and b[1]
        if op == "add":
            return f"({a[0]} + {b[0]})", both, shape
        if op == "mul" or (op == "div" and not b[1]):
            return f"({a[0]} * {b[0]})", both, shape
        if op == "div":
            return f"({a[0]} / {b[0]})", a[1], shape
        if op == "max":
            return f"np.maximum({a[0]}, {b[0]})", a[1] or b[1], shape
        if op == "where":
            return f"np.where({a[0]} > 0, {a[0]}, {b[0]})", False, shape
        return f"({a[0]} - {b[0]})", False, shape

    def reduce(self, v: Value, masked: bool = False) -> tuple[Value, bool]:
        """A reduction of ``v`` (a value of the program's full rank) and whether it keeps
        its dims (then it broadcasts back; else it is returned as a statistic). Where
        ``masked``, the mask ``m`` broadcasts to ``v`` and may be its ``where=``."""
        expr, positive, shape = v
        nd = len(shape)
        choices = [(nd - 1,), (0,), tuple(range(nd))]
        if nd >= 3:
            choices += [(1,), (nd - 2, nd - 1), (0, *range(2, nd))]
        axes = self.draw(st.sampled_from(choices))
        ops = ["sum", "mean", "max", "min", "var", "argmax", "argmin", "count"]
        if masked:
            ops += ["sum_where", "mean_where", "max_where"]
        op = self.draw(st.sampled_from(ops))
        keep = self.draw(st.booleans())
        kept = tuple(1 if a in axes else d for a, d in enumerate(shape)) if keep else \
            tuple(d for a, d in enumerate(shape) if a not in axes)
        if op == "count":  # a count of booleans: a fraction in float64, or an int64 count
            if self.draw(st.booleans()):
                return (f"({expr} > 0).mean(axis={axes}, keepdims={keep})", True, kept), keep
            return (f"({expr} > 0).sum(axis={axes}, keepdims={keep})", False, kept), keep
        if op.endswith("_where"):  # NumPy's masked reductions
            name = op[:-len("_where")]
            extra = ", initial=-np.inf" if name == "max" else ""
            out = f"np.{name}({expr}, axis={axes}, keepdims={keep}, where=m{extra})"
            if name == "sum":
                out = f"({out} / {float(np.prod([shape[a] for a in axes]))})"
            return (out, False, kept), keep
        if op in ("argmax", "argmin"):  # one axis; an index, returned as a statistic
            axis = axes[0]
            kept = tuple(d for a, d in enumerate(shape) if a != axis)
            return (f"{expr}.{op}(axis={axis})", False, kept), False
        ddof = f", ddof={self.draw(st.integers(0, 1))}" if op == "var" else ""
        out = f"{expr}.{op}(axis={axes}, keepdims={keep}{ddof})"
        if op == "var":
            out, positive = f"({out} + 0.5)", True
        elif op == "sum":  # magnitudes near one
            out = f"({out} / {float(np.prod([shape[a] for a in axes]))})"
        return (out, positive, kept), keep


Spec = tuple[tuple[int, ...], np.dtype]  # an argument's shape and dtype


@st.composite
def programs(draw: Any) -> tuple[str, list[Spec]]:
    """Python source of ``def f(x, y, m)`` and its arguments' shapes and dtypes: ``y``
    broadcasts to ``x`` and may have another float dtype, ``m`` is a boolean mask of
    ``y``'s shape."""
    shape = tuple(draw(_DIMS) for _ in range(draw(st.integers(1, 4))))
    while int(np.prod(shape)) > 40000:
        shape = shape[1:]
    ndim = len(shape)
    # y broadcasts to x: some of x's dims 1, maybe one dim fewer
    y_shape = tuple(d if draw(st.booleans()) else 1 for d in shape)
    y_shape = y_shape[draw(st.integers(0, min(1, ndim - 1))):]
    dtype = draw(st.sampled_from([F32, F16, F64, BF16]))
    # (NumPy has no common dtype for bfloat16 and float16: a bfloat16 program keeps away)
    others = [F32, F64] if dtype == BF16 else [F32, F16, F64]
    y_dtype = dtype if draw(st.booleans()) else draw(st.sampled_from(others))
    b = _Builder(draw)
    lines: list[str] = []
    values: list[Value] = [("x", False, shape), ("y", False, y_shape)]
    if shape[-1] > 2 and draw(st.booleans()):  # slices of an input, read in place
        k = shape[-1] // 2
        lines.append(f"xs = np.concatenate([x[..., {k}:], x[..., :{k}]], axis=-1)")
        values.append(("xs", False, shape))
    stats: list[str] = []
    for k in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "mask",
                                     "cast"]))
        if kind == "unary":
            v = b.unary(draw(st.sampled_from(values)))
        elif kind == "mask":  # a boolean argument selecting, or a comparison's mask
            a, c = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            shape_ac = tuple(np.broadcast_shapes(a[2], c[2], y_shape))
            v = (f"np.where(m, {a[0]}, {c[0]})", a[1] and c[1], shape_ac) \
                if draw(st.booleans()) else \
                (f"(({a[0]} > 0) * {c[0]})", False, tuple(np.broadcast_shapes(a[2], c[2])))
        elif kind == "cast":
            a = draw(st.sampled_from(values))
            to = draw(st.sampled_from(["np.float32", "x.dtype"] if dtype == BF16
                                      else ["np.float32", "np.float16", "x.dtype"]))
            v = (f"{a[0]}.astype({to})", a[1], a[2])
        elif kind == "binary":
            v = b.binary(draw(st.sampled_from(values)), draw(st.sampled_from(values)))
        else:
            src = draw(st.sampled_from([v for v in values if len(v[2]) == ndim]))
            v, keep = b.reduce(src, tuple(np.broadcast_shapes(y_shape, src[2])) == src[2])
            if not keep:
                lines.append(f"s{k} = {v[0]}")
                stats.append(f"s{k}")
                continue
            if draw(st.booleans()):  # broadcast back onto what it reduced: a norm
                lines.append(f"r{k} = {v[0]}")
                v = b.binary(src, (f"r{k}", v[1], v[2]))
        lines.append(f"v{k} = {v[0]}")
        values.append((f"v{k}", v[1], v[2]))
    last, _, last_shape = values[-1]
    same = [v for v in values[:-1] if v[2] == last_shape and v[0] not in ("x", "y")]
    if same and len(last_shape) and draw(st.booleans()):  # pieces of a concatenation
        other = draw(st.sampled_from(same))[0]
        axis = draw(st.sampled_from([0, -1]))
        last = f"np.concatenate([{last}, {other} * 2], axis={axis})"
    outs = [last, *stats[:draw(st.integers(0, 2))]]
    inner = [v[0] for v in values[2:-1] if v[0] != "xs"]
    if inner and draw(st.booleans()):  # an intermediate returned too: a kernel's extra output
        outs.append(draw(st.sampled_from(inner)))
    body = "\n    ".join(lines)
    source = f"def f(x, y, m):\n    {body}\n    return {', '.join(outs)}\n"
    return source, [(shape, dtype), (y_shape, y_dtype), (y_shape, np.dtype(bool))]


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype,
          special: bool) -> np.ndarray:
    if dtype == np.dtype(bool):
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(-3, 4, shape).astype(dtype)
    x = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    if special and x.size > 2:
        flat = x.reshape(-1)
        picks = rng.choice(flat.size, size=max(1, flat.size // 50), replace=False)
        flat[picks] = rng.choice([np.nan, np.inf, -np.inf, -0.0], size=picks.size)
    return x.astype(dtype)


# -- launching as the backend does ---------------------------------------------------------
def _aligned(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    buf = np.empty(a.size + 16, dtype=a.dtype)
    start = (-buf.__array_interface__["data"][0] // a.itemsize) % max(1, 16 // a.itemsize)
    view = buf[start:start + a.size].reshape(a.shape)
    view[...] = a
    return view


def _poisoned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return _aligned(np.full(shape, np.nan if dtype.kind == "f" or dtype == BF16 else -7,
                            dtype))


def _launch(src: Any, entry: str, ins: list[np.ndarray], outs: list[np.ndarray]) -> None:
    """``entry`` of ``src`` as the CuPy backend's launcher for its kind runs it."""
    launch = src.launch
    if src.kind == "rows":
        grid = -(-launch["rows"] // launch["rows_per_block"])
        emulate_threads(src, entry, [*ins, *outs], (grid, 1), launch["block"])
    elif src.kind == "columns":
        vectorised = entry == launch.get("vec_kernel")
        cfg = launch["vec_config"] if vectorised else launch["config"]
        parts = split_count(launch, 2, vectorised)  # a GPU of 2 SMs: small arrays split
        n = launch["outer"] * launch["inner"]
        partial = np.full(max(parts, 1) * n, np.nan, np.dtype(launch["acc_dtype"]))
        chunk = -(-launch["r"] // parts)
        (out,) = outs
        emulate_threads(src, entry, [ins[0], out, partial if parts > 1 else out,
                                     ctypes.c_longlong(chunk)],
                        (launch["outer"] * cfg["tiles"], parts), launch["block"])
        if parts > 1:
            emulate_threads(src, launch["combine_kernel"],
                            [partial, out, ctypes.c_int(parts)], (2, 1), launch["block"])
    else:
        emulate(src, entry, [*ins, *outs])


def _compare(got: np.ndarray, want: np.ndarray, what: str, floor: float = 0.0) -> None:
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if got.dtype.kind in "iub":
        assert np.array_equal(got, want), f"{what}: integers differ"
        return
    g, w = got.astype(F64), want.astype(F64)
    assert np.array_equal(np.isnan(g), np.isnan(w)), f"{what}: NaN where NumPy has none " \
        "or the reverse"
    inf = np.isinf(w)
    assert np.array_equal(np.isinf(g), inf) and np.array_equal(g[inf], w[inf]), \
        f"{what}: infinities differ"
    finite = np.isfinite(w)
    if finite.any():
        scale = max(1.0, float(np.abs(w[finite]).max()))
        err = float(np.abs(g[finite] - w[finite]).max())
        tol = max(_TOL[got.dtype.name], floor)
        assert err <= tol * scale, f"{what}: off by {err} (scale {scale})"


def _check_program(source: str, specs: list[Spec], special: bool, seed: int) -> int:
    """Run every generated kernel of the program; the number of kernels checked."""
    scope: dict[str, Any] = {"np": np}
    exec(source, scope)
    fn = scope["f"]
    rng = np.random.default_rng(seed)
    args = [_data(rng, shape, dtype, special) for shape, dtype in specs]
    # a value rounded to a coarser float on the way may differ by that float's rounding
    floor = max((_TOL[d.name] for _, d in specs if d.name in _TOL), default=0.0)
    try:
        with np.errstate(all="ignore"):
            fn(*args)
    except (OverflowError, TypeError, ValueError) as exc:
        # a program NumPy itself refuses (e.g. an integer count's max with initial=-inf,
        # bfloat16 with int64): tracing refuses it with the same kind of error, and
        # there is no kernel to check
        kind = next(k for k in (OverflowError, TypeError, ValueError) if isinstance(exc, k))
        with pytest.raises(kind):
            trace(fn, tuple(args))
        return 0
    graph, _ = trace(fn, tuple(args))
    # (a float32 or float16 value inside, x.astype(np.float32), rounds there too)
    floor = max([floor, *(_TOL[n.dtype.name] for n in graph if n.dtype.name in _TOL)])
    graph = PassManager(mode="balanced").run(graph).graph
    impl = {d.node: d.choice for d in choose(graph, "cupy", "balanced", supports)}
    values = dict(zip(graph.inputs, args, strict=True))
    with np.errstate(all="ignore"):
        for n in graph:
            if n.op != "input":
                values[n.id] = np.asarray(
                    evaluate(n.op, np, [values[i] for i in n.inputs], n.attrs),
                    dtype=n.dtype)
    checked = 0
    for node in graph:
        if impl.get(node.id) not in ("fused_kernel", "reduction_kernel") \
                or node.op in ("matmul", "fused_extra") or not supports(node, graph)[0]:
            continue
        src = generate(node, graph)
        ins = [_aligned(np.ascontiguousarray(values[i])) for i in node.inputs]
        body = node.attrs.get("body")
        out_types = [(tuple(node.shape), node.dtype)] if body is None or \
            len(body.outputs) == 1 else [(tuple(body.node(o).shape), body.node(o).dtype)
                                         for o in body.outputs]
        extras = {u.attrs["output"]: u.id for u in graph
                  if u.op == "fused_extra" and u.inputs[0] == node.id}
        for entry in src.entries:
            if entry == src.launch.get("combine_kernel"):
                continue  # launched by _launch after its column kernel
            outs = [_poisoned(s, d) for s, d in out_types]
            with np.errstate(all="ignore"):
                _launch(src, entry, ins, outs)
            what = f"{entry} ({node.op}) of\n{source}"
            _compare(outs[0], values[node.id], what, floor)
            for k, out in enumerate(outs[1:], start=1):
                if k in extras:
                    _compare(out, values[extras[k]], f"output {k} of {what}", floor)
        checked += 1
    return checked


@needs_gxx
@settings(max_examples=300 if _NIGHTLY else 12, derandomize=not _NIGHTLY, deadline=None)
@given(programs(), st.booleans(), st.integers(0, 2**32 - 1))
def test_generated_kernels_of_random_programs_compute_numpys_values(program, special, seed):
    source, specs = program
    _check_program(source, specs, special, seed)


_NORM = ("def f(x, y, m):\n"
         "    v0 = (x - x.mean(axis=(-1,), keepdims=True)) * y\n"
         "    v1 = v0.sum(axis=(0,), keepdims=False)\n"
         "    return np.concatenate([np.tanh(v0), v0 * 2], axis=-1), v1\n")
_NORM_SPECS = [((33, 130), F32), ((1, 130), F32), ((1, 130), np.dtype(bool))]


@needs_gxx
def test_the_fuzz_check_is_not_vacuous(monkeypatch):
    """A program of the generator's kind launches a row, a column and an elementwise
    kernel and passes; the same program with the row kernel's mean taken over one
    column too few fails; and outputs off by more than the tolerance, or NaN where
    NumPy has a number, fail the comparison."""
    import dataclasses

    assert _check_program(_NORM, _NORM_SPECS, True, 5) == 3
    real = generate

    def broken(node, graph):
        src = real(node, graph)
        wrong = src.source.replace("static_cast<float>(130)", "static_cast<float>(129)")
        return dataclasses.replace(src, source=wrong)

    monkeypatch.setitem(globals(), "generate", broken)  # what _check_program calls
    with pytest.raises(AssertionError, match="off by"):
        _check_program(_NORM, _NORM_SPECS, False, 5)
    got = np.ones(4, F32)
    with pytest.raises(AssertionError, match="off by"):
        _compare(got + 3 * _TOL["float32"], got, "a wrong kernel")
    with pytest.raises(AssertionError, match="NaN"):
        _compare(np.array([np.nan], F32), np.array([1.0], F32), "a kernel writing NaN")


@needs_gxx
@pytest.mark.parametrize("dtype", [F32, F16, np.dtype(np.int32), np.dtype(bool)])
@pytest.mark.parametrize("expr", ["np.any(x > 0.5, axis=1)", "np.all(x, axis=0)",
                                  "x.any(axis=(1, 2), keepdims=True)", "np.isnan(x).any()",
                                  "(x != 0).all(axis=-1)"])
def test_any_and_all_run_as_generated_boolean_reductions(dtype, expr):
    """``any``/``all`` become the maximum/minimum of booleans (simplify); their kernels
    compute NumPy's answer (NaN counts as true) on the emulator."""
    source = f"def f(x, y, m):\n    return {expr}\n"
    shape = (9, 130, 3) if "(1, 2)" in expr else (33, 130)
    specs = [(shape, dtype), ((1,), F32), ((1,), np.dtype(bool))]
    assert _check_program(source, specs, True, 11) >= 1


def test_a_program_numpy_refuses_is_refused_by_tracing_too():
    """The generator may draw a masked max with ``initial=-np.inf`` of an integer count,
    which NumPy refuses (OverflowError): the check expects tracing to refuse it the same
    way, and a tracer that accepted it would fail the check."""
    source = ("def f(x, y, m):\n"
              "    v0 = (x > 0).sum(axis=(1,), keepdims=True)\n"
              "    return np.max(v0, axis=(1,), keepdims=False, where=m, initial=-np.inf)\n")
    specs = [((5, 7), F32), ((5, 1), F32), ((5, 1), np.dtype(bool))]
    assert _check_program(source, specs, False, 3) == 0


def test_bfloat16_with_int64_is_refused_with_numpys_kind_of_error():
    """NumPy has no common dtype for bfloat16 and int64 (its DTypePromotionError, a
    TypeError); tracing refuses the program with a TypeError too."""
    source = ("def f(x, y, m):\n"
              "    v1 = (x > 0).sum(axis=(0,), keepdims=True)\n"
              "    return np.where(m, x, v1)\n")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    assert _check_program(source, [((1,), bf16), ((1,), bf16), ((1,), np.dtype(bool))],
                          False, 0) == 0


@needs_gxx
def test_a_value_rounded_to_float32_inside_a_float64_program_is_compared_at_float32():
    """``exp(tanh(x.astype(np.float32)))`` added to float64 ``x``: the float32 step's
    libm may differ by an ulp of float32 from NumPy's, which the float64 result shows."""
    source = ("def f(x, y, m):\n"
              "    v1 = x.astype(np.float32)\n"
              "    return x + np.exp(np.tanh(v1))\n")
    f64 = np.dtype(np.float64)
    assert _check_program(source, [((3,), f64), ((1,), f64), ((1,), np.dtype(bool))],
                          False, 0) == 1
