"""Hand-written attention is found and named in explain(); look-alikes are not; the
program's results do not change (the pass rewrites nothing)."""

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
def test_hand_written_attention_is_named_and_runs_as_written(fn, n, what):
    rng = np.random.default_rng(8)
    args = _args(rng, n)
    f = pl.compile(fn)
    got = f(*args)
    want = fn(*[a.astype(np.float64) for a in args])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    notes = [x for x in f.explain(*args).notes if x.startswith("find_attention")]
    assert len(notes) == 1, notes
    assert f"softmax(q @ k^T{' ' + what if what else ''}) @ v" in notes[0]
    assert "[2, 3, 16, 16] scores materialised (6.0 KiB)" in notes[0]
    assert "no fused attention kernel yet" in notes[0]


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
