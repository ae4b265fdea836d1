"""Hand-written attention is found and lowered to one attention node (explain() says
so); look-alikes are not; one whose scores are read elsewhere runs as written; results
stay NumPy's within float rounding."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler.passes import PassManager, attention_find


def attention(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) * np.float32(0.125)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def masked(q, k, v, m):
    s = q @ k.swapaxes(-1, -2) / np.float32(8.0) + m
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def unscaled(q, k, v):
    s = q @ k.swapaxes(-1, -2)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def no_transpose(q, k, v):  # q @ k, not q @ k^T
    s = q @ k * np.float32(0.125)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def softmax_over_queries(q, k, v):  # the softmax over axis -2: not attention
    s = q @ k.swapaxes(-1, -2)
    e = np.exp(s - s.max(-2, keepdims=True))
    return (e / e.sum(-2, keepdims=True)) @ v


def _args(rng, n=4):
    return [(rng.standard_normal((2, 3, 16, 16)) + 0.1).astype(np.float32)
            for _ in range(3)] + ([np.triu(np.full((16, 16), -1e4, np.float32), 1)]
                                  if n == 4 else [])


@pytest.mark.parametrize(("fn", "n", "what"), [(attention, 3, "scaled"),
                                               (masked, 4, "scaled, mask %3"),
                                               (unscaled, 3, "")])
def test_hand_written_attention_becomes_one_node(fn, n, what):
    rng = np.random.default_rng(8)
    args = _args(rng, n)
    f = pl.compile(fn)
    got = f(*args)
    want = fn(*[a.astype(np.float64) for a in args])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    ex = f.explain(*args)
    notes = [x for x in ex.notes if x.startswith("find_attention")]
    assert len(notes) == 1, notes
    assert f"softmax(q @ k^T{' ' + what if what else ''}) @ v" in notes[0]
    assert "the [2, 3, 16, 16] scores (6.0 KiB) are never materialised" in notes[0]
    graph = f._cache[next(iter(f._cache))][0].graph
    assert [n.op for n in graph if n.op not in ("input", "constant")] == ["attention"]


def test_float16_attention_is_numpys_within_float16_rounding():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 4, 129, 64)).astype(np.float16) for _ in range(3))

    def fn(q, k, v):
        s = q @ np.swapaxes(k, -1, -2) * np.float16(0.125)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return (p / p.sum(axis=-1, keepdims=True)) @ v

    got = pl.compile(fn)(q, k, v)
    assert got.dtype == np.float16
    want = fn(*(x.astype(np.float64) for x in (q, k, v)))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)


def test_scores_read_elsewhere_keep_the_program_as_written():
    def both(q, k, v):
        s = q @ np.swapaxes(k, -1, -2) * np.float32(0.125)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p = p / p.sum(axis=-1, keepdims=True)
        return p @ v, p

    args = _args(np.random.default_rng(4), 3)
    f = pl.compile(both)
    out, p = f(*args)
    want_out, want_p = both(*[a.astype(np.float64) for a in args])
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p, want_p, rtol=1e-5, atol=1e-6)
    (note,) = [x for x in f.explain(*args).notes if x.startswith("find_attention")]
    assert "scores materialised" in note and "is read elsewhere too" in note


def test_an_integer_mask_is_added_not_taken_as_a_mask():
    def int_mask(q, k, v, m):
        s = q @ np.swapaxes(k, -1, -2) + m
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v

    args = [*_args(np.random.default_rng(5), 3), np.ones((16, 16), np.int32)]
    f = pl.compile(int_mask)
    np.testing.assert_allclose(f(*args), int_mask(*[a.astype(np.float64) for a in args]),
                               rtol=1e-5, atol=1e-6)
    (note,) = [x for x in f.explain(*args).notes if x.startswith("find_attention")]
    assert "added as numbers, not a mask" in note


@pytest.mark.parametrize("fn", [no_transpose, softmax_over_queries])
def test_look_alikes_are_not_attention(fn):
    args = _args(np.random.default_rng(9), 3)
    f = pl.compile(fn)
    f(*args)
    assert not any(x.startswith("find_attention") for x in f.explain(*args).notes)


def test_find_returns_the_operands():
    from pyc_lab.compiler import trace

    args = _args(np.random.default_rng(10), 4)
    graph, _ = trace(masked, args)
    g = PassManager(["canonicalize", "constant_folding", "simplify", "cse", "dce",
                     "transpose_folding", "reduction_fusion"]).run(graph).graph
    (att,) = attention_find.find(g)
    assert [att.q, att.k, att.v, att.mask] == list(g.inputs) and att.scale
    assert g.nodes[att.output].op == "matmul" and g.nodes[att.softmax].op == "softmax"


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def causal_where(q, k, v):  # the usual NumPy causal mask: -inf above the diagonal
    s = q @ k.swapaxes(-1, -2) * np.float32(0.125)
    return _softmax(np.where(np.tril(np.ones((16, 16), bool)), s, -np.inf)) @ v


def causal_where_then_scale(q, k, v):  # filled first, scaled after (-inf * c stays -inf)
    s = np.where(np.tri(16, dtype=bool), q @ k.swapaxes(-1, -2), -np.inf)
    return _softmax(s / np.float32(8.0)) @ v


def causal_not_triu(q, k, v):
    keep = ~np.triu(np.ones((16, 16), bool), 1)
    return _softmax(np.where(keep, q @ k.swapaxes(-1, -2) * np.float32(0.125), -np.inf)) @ v


def boolean_mask(q, k, v, m):
    return _softmax(np.where(m, q @ k.swapaxes(-1, -2) * np.float32(0.125), -np.inf)) @ v


def upper_triangle(q, k, v):  # a constant mask that is not causal: passed on as a mask
    s = q @ k.swapaxes(-1, -2) * np.float32(0.125)
    return _softmax(np.where(np.triu(np.ones((16, 16), bool)), s, -np.inf)) @ v


@pytest.mark.parametrize(("fn", "what"), [
    (causal_where, "scaled, causal"), (causal_where_then_scale, "scaled, causal"),
    (causal_not_triu, "scaled, causal"), (boolean_mask, "scaled, boolean mask %3"),
    (upper_triangle, "scaled, boolean mask")])
def test_scores_filled_with_minus_inf_by_a_boolean_mask_are_attention(fn, what):
    """``np.where(mask, s, -inf)`` (before or after the scale) is attention with a
    boolean mask, or causal attention when the mask is the constant lower triangle; a
    row the mask leaves empty is NaN, as NumPy's."""
    rng = np.random.default_rng(11)
    args = _args(rng, 3)
    if fn is boolean_mask:
        m = rng.random((2, 3, 16, 16)) < 0.6
        m[0, 1, 5, :] = False  # one row with no key: NaN
        args.append(m)
    f = pl.compile(fn)
    with np.errstate(all="ignore"):
        got = f(*args)
        want = fn(*[a.astype(np.float64) if a.dtype != np.bool_ else a for a in args])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.isnan(got).any() == (fn is boolean_mask)
    (note,) = [x for x in f.explain(*args).notes if x.startswith("find_attention")]
    assert f"softmax(q @ k^T {what}" in note and "one attention node" in note, note
    graph = f._cache[next(iter(f._cache))][0].graph
    (node,) = [n for n in graph if n.op not in ("input", "constant")]
    assert node.op == "attention"
    assert node.attrs["causal"] == ("causal" in what)
    assert len(node.inputs) == (3 if "causal" in what else 4)


@pytest.mark.parametrize("fill, scale", [(-1e9, 0.125), (-np.inf, -0.125), (0.0, 0.125)])
def test_fills_that_are_not_minus_inf_after_a_positive_scale_stay_as_written(fill, scale):
    """A finite fill gives a row with no key uniform weights, not NumPy's NaN; a
    negative scale after the fill turns -inf into +inf: neither is attention's masking."""
    def fn(q, k, v):
        s = np.where(np.tri(16, dtype=bool), q @ k.swapaxes(-1, -2), np.float32(fill))
        return _softmax(s * np.float32(scale)) @ v

    args = _args(np.random.default_rng(12), 3)
    f = pl.compile(fn)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(f(*args), fn(*[a.astype(np.float64) for a in args]),
                                   rtol=1e-5, atol=1e-6, equal_nan=True)
    graph = f._cache[next(iter(f._cache))][0].graph
    assert "attention" not in [n.op for n in graph]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("form", ["causal", "boolean"])
def test_on_the_gpu_masked_hand_written_attention_is_numpys(dtype, form):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((2, 8, 256, 64)).astype(dtype) for _ in range(3))
    m = rng.random((256, 256)) < 0.5
    m[:, 0] = True  # every row keeps a key (a row with none is NaN: checked on the CPU)

    def causal(q, k, v):
        s = q @ k.swapaxes(-1, -2) * dtype(0.125)
        return _softmax(np.where(np.tril(np.ones((256, 256), bool)), s, -np.inf)) @ v

    def boolean(q, k, v, m):
        return _softmax(np.where(m, q @ k.swapaxes(-1, -2) * dtype(0.125), -np.inf)) @ v

    fn, args = (causal, (q, k, v)) if form == "causal" else (boolean, (q, k, v, m))
    f = pl.compile(fn, backend="cupy")
    got = cp.asnumpy(f(*(cp.asarray(a) for a in args)))
    want = fn(*(a.astype(np.float64) if a.dtype != np.bool_ else a for a in args))
    assert got.dtype == np.dtype(dtype)
    tol = 2e-2 if dtype == np.float16 else 1e-4
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    graph = f._cache[next(iter(f._cache))][0].graph
    assert [n.op for n in graph if n.op not in ("input", "constant")] == ["attention"]
