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
