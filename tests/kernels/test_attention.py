"""pl.attention on NumPy arrays (the blocked online softmax) against a float64 reference.

Fresh random inputs every run; large-magnitude scores for the online softmax's
stability; grouped-query heads, causal masking with unequal lengths, additive, boolean
and broadcast masks, a fully masked row, length 1 and lengths one past a block, both
layouts, the log-sum-exp, float16 and bfloat16, and every refusal.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError
from pyc_lab.kernels.attention import attention_route
from pyc_lab.kernels.attention_blocked import BLOCK_K, BLOCK_Q, blocked_attention


def scores(q, k, scale, causal, mask):
    """The scaled, masked float64 scores q k^T (``-inf`` where masked)."""
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = s + (np.where(mask, 0.0, -np.inf) if mask.dtype == np.bool_ else mask)
    if causal:
        i = np.arange(s.shape[-2])[:, None]
        j = np.arange(s.shape[-1])[None]
        s = np.where(j > i, -np.inf, s)
    return s


def reference(q, k, v, *, scale=None, causal=False, mask=None):
    """float64 softmax(q k^T s + mask) v on (B, H, S, D), GQA by repeating heads."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = scores(q, k, scale, causal, mask)
    m = s.max(-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - m)
        total = e.sum(-1, keepdims=True)
        out = (e / total) @ v
        lse = (m + np.log(total))[..., 0]
    return out, lse


def rand(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize(("b", "hq", "hk", "sq", "sk", "d", "dv"), [
    (2, 4, 4, 37, 53, 64, 64),            # odd lengths
    (1, 8, 2, BLOCK_Q + 1, BLOCK_K + 1, 32, 16),   # GQA, one past a block
    (2, 6, 3, 1, 300, 128, 128),          # one query (decode)
    (1, 2, 1, 300, 1, 16, 8),             # one key
])
@pytest.mark.parametrize("causal", [False, True])
def test_float32_against_float64(b, hq, hk, sq, sk, d, dv, causal):
    rng = np.random.default_rng()
    q, k, v = rand(rng, (b, hq, sq, d)), rand(rng, (b, hk, sk, d)), rand(rng, (b, hk, sk, dv))
    out, lse = pl.attention(q, k, v, causal=causal, return_lse=True)
    want, want_lse = reference(q, k, v, causal=causal)
    assert out.shape == (b, hq, sq, dv) and out.dtype == np.float32
    assert lse.shape == (b, hq, sq) and lse.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


def test_large_scores_stay_stable_across_blocks():
    # scores of several hundred: exp overflows without the running maximum; the maximum
    # of a row sits in a later key block than its first, so the rescaling is exercised
    rng = np.random.default_rng()
    q, k, v = rand(rng, (1, 2, 70, 64), scale=4), rand(rng, (1, 2, 1100, 64), scale=4), \
        rand(rng, (1, 2, 1100, 64))
    k[:, :, 900] = q[:, :, :1].mean(axis=2) * 3  # a late key every query likes a lot
    out = pl.attention(q, k, v, scale=1.0)
    want, _ = reference(q, k, v, scale=1.0)
    assert np.isfinite(out).all()
    # A float32 score q.k of D terms is off by at most gamma_D * sum|q_i k_i| (D roundings
    # of relative size 2**-24), which exp turns into a relative error of each weight;
    # weights off by a relative delta move an output by at most 2 delta max|v|. A
    # missed rescaling of earlier blocks is off by O(1) or overflows.
    d = q.shape[-1]
    gamma = d * 2.0**-24 / (1 - d * 2.0**-24)
    delta = gamma * (np.abs(q.astype(np.float64)) @ np.swapaxes(np.abs(k), -1, -2)).max(-1)
    bound = 2 * delta[..., None] * np.abs(v).max() + 1e-6
    assert (np.abs(out - want) <= bound).all(), float((np.abs(out - want) / bound).max())
    # that bound is for the worst rounding; most rows, led by the late key, are exact to
    # float32 (a median error of about 1e-10 over 40 seeds)
    assert np.median(np.abs(out - want)) < 1e-6


@pytest.mark.parametrize("mask_shape", [(37, 53), (2, 1, 37, 53), (1, 4, 1, 53), (53,)])
def test_additive_masks_broadcast(mask_shape):
    rng = np.random.default_rng()
    q, k, v = rand(rng, (2, 4, 37, 32)), rand(rng, (2, 4, 53, 32)), rand(rng, (2, 4, 53, 32))
    mask = rand(rng, mask_shape, scale=2)
    mask[..., 5] = -np.inf
    out = pl.attention(q, k, v, mask=mask)
    want, _ = reference(q, k, v, mask=mask)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_boolean_mask_and_a_fully_masked_row_give_nan_like_numpy():
    rng = np.random.default_rng()
    q, k, v = rand(rng, (1, 2, 20, 16)), rand(rng, (1, 2, 30, 16)), rand(rng, (1, 2, 30, 16))
    keep = rng.random((20, 30)) < 0.7
    keep[4] = False  # nothing to attend to
    out, lse = pl.attention(q, k, v, mask=keep, return_lse=True)
    want, want_lse = reference(q, k, v, mask=keep)
    assert np.isnan(out[:, :, 4]).all() and np.isneginf(lse[:, :, 4]).all()
    ok = np.arange(20) != 4
    np.testing.assert_allclose(out[:, :, ok], want[:, :, ok], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lse[:, :, ok], want_lse[:, :, ok], rtol=1e-5, atol=1e-5)


def test_nan_in_an_input_stays_in_its_rows():
    rng = np.random.default_rng()
    q, k, v = rand(rng, (1, 1, 8, 16)), rand(rng, (1, 1, 8, 16)), rand(rng, (1, 1, 8, 16))
    q[0, 0, 3, 0] = np.nan
    out = pl.attention(q, k, v)
    assert np.isnan(out[0, 0, 3]).all() and np.isfinite(np.delete(out[0, 0], 3, 0)).all()


def test_bshd_layout_is_the_transposed_problem():
    rng = np.random.default_rng()
    q, k, v = rand(rng, (2, 33, 4, 32)), rand(rng, (2, 40, 2, 32)), rand(rng, (2, 40, 2, 32))
    out = pl.attention(q, k, v, layout="bshd", causal=True)
    want = pl.attention(*(np.ascontiguousarray(x.swapaxes(1, 2)) for x in (q, k, v)),
                        causal=True)
    assert out.shape == (2, 33, 4, 32)
    np.testing.assert_array_equal(out, want.swapaxes(1, 2))


def test_float16_and_bfloat16_within_their_rounding():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng()
    for dtype, tol in ((np.float16, 2e-3), (np.dtype(ml_dtypes.bfloat16), 1.6e-2)):
        q, k, v = (rand(rng, (1, 4, 65, 64)).astype(dtype) for _ in range(3))
        out = pl.attention(q, k, v, causal=True)
        assert out.dtype == dtype
        want, _ = reference(q, k, v, causal=True)
        np.testing.assert_allclose(out.astype(np.float64), want, rtol=tol, atol=tol)


def test_memory_is_bounded_by_the_blocks():
    # a 4096 x 4096 score matrix would be 64 MiB in float32; the blocked path holds one
    # BLOCK_Q x BLOCK_K block per head at a time
    import tracemalloc

    rng = np.random.default_rng()
    q, k, v = (rand(rng, (1, 1, 4096, 16)) for _ in range(3))
    tracemalloc.start()
    pl.attention(q, k, v)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 * 2**20, peak


def test_blocks_of_any_size_give_the_same_answer():
    rng = np.random.default_rng()
    q, k, v = rand(rng, (1, 2, 50, 8)), rand(rng, (1, 2, 77, 8)), rand(rng, (1, 2, 77, 8))
    a = blocked_attention(np, q, k, v, scale=0.3, causal=True, block_q=7, block_k=5)
    b = blocked_attention(np, q, k, v, scale=0.3, causal=True, block_q=64, block_k=128)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_routes():
    q = np.zeros((1, 1, 2, 2), np.float32)
    assert attention_route(q) == "blocked"
    assert attention_route(q, return_lse=True) == "blocked"


@pytest.mark.parametrize(("args", "kwargs", "match"), [
    (((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)), {"layout": "sbhd"}, "layout"),
    (((2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)), {}, "expected 4 axes"),
    (((1, 3, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)), {}, "not a multiple"),
    (((1, 2, 4, 8), (1, 2, 4, 16), (1, 2, 4, 8)), {}, "do not fit"),
    (((1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 4, 8)), {}, "do not fit"),
])
def test_bad_shapes_are_refused(args, kwargs, match):
    rng = np.random.default_rng()
    arrays = [rand(rng, s) for s in args]
    with pytest.raises(PycLabError, match=match):
        pl.attention(*arrays, **kwargs)


@pytest.mark.parametrize("scale", ["x", True, 1j, float("nan"), float("inf"), [0.5, 0.5]])
def test_a_scale_that_is_not_a_finite_real_number_is_refused(scale):
    rng = np.random.default_rng()
    q, k, v = (rand(rng, (1, 2, 4, 8)) for _ in range(3))
    with pytest.raises(PycLabError, match="scale must be a finite real number"):
        pl.attention(q, k, v, scale=scale)
    want, _ = reference(q, k, v, scale=0.25)
    for ok in (0.25, np.float32(0.25), np.array(0.25), 1 / 4):  # numbers of any kind
        np.testing.assert_allclose(pl.attention(q, k, v, scale=ok), want, rtol=1e-5,
                                   atol=1e-6)


def test_bad_dtypes_and_masks_are_refused():
    rng = np.random.default_rng()
    q, k, v = (rand(rng, (1, 2, 4, 8)) for _ in range(3))
    with pytest.raises(PycLabError, match="different dtypes"):
        pl.attention(q, k.astype(np.float16), v)
    with pytest.raises(PycLabError, match="attention takes"):
        pl.attention(q.astype(np.int32), k.astype(np.int32), v.astype(np.int32))
    with pytest.raises(PycLabError, match="does not broadcast"):
        pl.attention(q, k, v, mask=np.zeros((3, 4), np.float32))
    with pytest.raises(PycLabError, match="not an array"):
        pl.attention(q, k, [[1.0]])
    with pytest.raises(PycLabError, match="same kind of array"):
        pl.attention(q, k, v, mask=[[0.0] * 4] * 4)


def test_a_bound_call_is_for_cupy_arrays_only():
    from pyc_lab.kernels.attention_bound import bound_attention

    q = rand(np.random.default_rng(), (1, 2, 8, 16))
    assert bound_attention(q, q, q) is None  # NumPy: pl.attention each time
