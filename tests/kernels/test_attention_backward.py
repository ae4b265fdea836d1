"""The backward pass of pl.attention on the host: ``pl.attention_backward`` on NumPy
arrays against a dense float64 derivation (itself checked by finite differences), and
torch's autograd through ``pl.attention`` on CPU tensors (``gradcheck`` in float64).

Fresh random inputs every run; grouped-query heads, causal masking with unequal lengths,
additive and boolean masks, a fully masked row, lengths one past a block, both layouts,
16-bit dtypes, the blocks' memory bound, and every refusal.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError
from pyc_lab.kernels.attention_blocked import BLOCK_K, BLOCK_Q, blocked_attention_backward
from tests.kernels.test_attention import scores


def dense_grads(q, k, v, do, *, scale=None, causal=False, mask=None):
    """float64 (dq, dk, dv) of sum(out * do) from the whole score matrix (no blocks, no
    log-sum-exp): the softmax Jacobian written out. GQA by repeating heads, the repeated
    heads' gradients summed back."""
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    g = q.shape[1] // k.shape[1]
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = scores(q, kr, scale, causal, mask)
    m = s.max(-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - m)
        p = e / e.sum(-1, keepdims=True)
    p = np.nan_to_num(p)  # a fully masked row: no softmax, no gradient
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(vr, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = ds @ kr * scale
    dk = np.swapaxes(ds, -1, -2) @ q * scale

    def fold(x):
        return x.reshape(x.shape[0], -1, g, *x.shape[2:]).sum(2)

    return dq, fold(dk), fold(dv)


def loss(q, k, v, do, **kw):
    """sum(out * do) in float64, from the dense softmax (for finite differences)."""
    g = q.shape[1] // k.shape[1]
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    scale = kw.get("scale") or 1 / np.sqrt(q.shape[-1])
    s = scores(q, kr, scale, kw.get("causal", False), kw.get("mask"))
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return float(((p @ vr) * do).sum())


def rand(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def test_the_dense_reference_is_the_derivative():
    # central differences on a small float64 problem with GQA, causal, unequal lengths
    rng = np.random.default_rng()
    q, k, v = rand(rng, (1, 4, 5, 3), np.float64), rand(rng, (1, 2, 7, 3), np.float64), \
        rand(rng, (1, 2, 7, 2), np.float64)
    do = rand(rng, (1, 4, 5, 2), np.float64)
    grads = dense_grads(q, k, v, do, causal=True)
    h = 1e-6
    for x, g in zip((q, k, v), grads, strict=True):
        fd = np.empty_like(x)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + h
            up = loss(q, k, v, do, causal=True)
            x[idx] = old - h
            down = loss(q, k, v, do, causal=True)
            x[idx] = old
            fd[idx] = (up - down) / (2 * h)
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(("b", "hq", "hk", "sq", "sk", "d", "dv"), [
    (2, 4, 4, 37, 53, 16, 16),                       # odd lengths
    (1, 8, 2, BLOCK_Q + 1, BLOCK_K + 1, 16, 8),      # GQA, one past a block
    (2, 6, 3, 1, 300, 32, 32),                       # one query
    (1, 2, 1, 300, 1, 8, 8),                         # one key
])
@pytest.mark.parametrize("causal", [False, True])
def test_float64_gradients_match_the_dense_derivation(b, hq, hk, sq, sk, d, dv, causal):
    rng = np.random.default_rng()
    q, k, v = rand(rng, (b, hq, sq, d), np.float64), rand(rng, (b, hk, sk, d), np.float64), \
        rand(rng, (b, hk, sk, dv), np.float64)
    do = rand(rng, (b, hq, sq, dv), np.float64)
    got = pl.attention_backward(q, k, v, do, causal=causal)
    want = dense_grads(q, k, v, do, causal=causal)
    for x, g, w in zip((q, k, v), got, want, strict=True):
        assert g.shape == x.shape and g.dtype == np.float64
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_saved_output_and_log_sum_exp_are_used_as_given():
    rng = np.random.default_rng()
    q, k, v = (rand(rng, (1, 2, 40, 16)) for _ in range(3))
    do = rand(rng, (1, 2, 40, 16))
    out, lse = pl.attention(q, k, v, causal=True, return_lse=True)
    a = pl.attention_backward(q, k, v, do, out=out, lse=lse, causal=True)
    b = pl.attention_backward(q, k, v, do, causal=True)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    # a different saved log-sum-exp changes the answer: it is really read
    c = pl.attention_backward(q, k, v, do, out=out, lse=lse + 1, causal=True)
    assert not np.allclose(c[0], a[0])


def test_float32_large_scores_and_masks():
    rng = np.random.default_rng()
    q, k, v = rand(rng, (2, 4, 37, 32), scale=3), rand(rng, (2, 4, 53, 32), scale=3), \
        rand(rng, (2, 4, 53, 32))
    mask = rand(rng, (2, 1, 37, 53), scale=2)
    mask[..., 5] = -np.inf
    do = rand(rng, (2, 4, 37, 32))
    got = pl.attention_backward(q, k, v, do, mask=mask, scale=1.0)
    want = dense_grads(q, k, v, do, mask=mask, scale=1.0)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32 and np.isfinite(g).all()
        np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-3 * np.abs(w).max())
    assert (got[1][..., 5, :] == 0).all() and (got[2][..., 5, :] == 0).all()


def test_a_fully_masked_row_passes_no_gradient():
    rng = np.random.default_rng()
    q, k, v = rand(rng, (1, 2, 20, 16)), rand(rng, (1, 2, 30, 16)), rand(rng, (1, 2, 30, 16))
    keep = rng.random((20, 30)) < 0.7
    keep[4] = False
    do = rand(rng, (1, 2, 20, 16))
    dq, dk, dv = pl.attention_backward(q, k, v, do, mask=keep)
    assert (dq[:, :, 4] == 0).all()
    for g, w in zip((dq, dk, dv), dense_grads(q, k, v, do, mask=keep), strict=True):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_bshd_layout_is_the_transposed_problem():
    rng = np.random.default_rng()
    q, k, v = rand(rng, (2, 33, 4, 16)), rand(rng, (2, 40, 2, 16)), rand(rng, (2, 40, 2, 16))
    do = rand(rng, (2, 33, 4, 16))
    got = pl.attention_backward(q, k, v, do, layout="bshd", causal=True)
    want = pl.attention_backward(*(np.ascontiguousarray(x.swapaxes(1, 2))
                                   for x in (q, k, v, do)), causal=True)
    for x, g, w in zip((q, k, v), got, want, strict=True):
        assert g.shape == x.shape
        np.testing.assert_array_equal(g, w.swapaxes(1, 2))


def test_float16_and_bfloat16_within_their_rounding():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng()
    for dtype, tol in ((np.float16, 4e-3), (np.dtype(ml_dtypes.bfloat16), 3e-2)):
        q, k, v, do = (rand(rng, (1, 4, 65, 32)).astype(dtype) for _ in range(4))
        got = pl.attention_backward(q, k, v, do, causal=True)
        want = dense_grads(q, k, v, do, causal=True)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == dtype
            np.testing.assert_allclose(g.astype(np.float64), w, rtol=tol,
                                       atol=tol * np.abs(w).max())


def test_blocks_of_any_size_give_the_same_answer_and_bound_memory():
    import tracemalloc

    rng = np.random.default_rng()
    q, k, v, do = (rand(rng, (1, 1, 50, 8)) for _ in range(4))
    out, lse = pl.attention(q, k, v, causal=True, return_lse=True)
    a = blocked_attention_backward(np, q, k, v, out, lse, do, scale=0.3, causal=True,
                                   block_q=7, block_k=5)
    b = blocked_attention_backward(np, q, k, v, out, lse, do, scale=0.3, causal=True)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    # 4096 x 4096 scores would be 64 MiB; the operands and gradients are 1.25 MiB
    q, k, v, do = (rand(rng, (1, 1, 4096, 16)) for _ in range(4))
    tracemalloc.start()
    pl.attention_backward(q, k, v, do)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 12 * 2**20, peak


def test_bad_gradients_are_refused():
    rng = np.random.default_rng()
    q, k, v = (rand(rng, (1, 2, 4, 8)) for _ in range(3))
    with pytest.raises(PycLabError, match="dout must be"):
        pl.attention_backward(q, k, v, rand(rng, (1, 2, 5, 8)))
    with pytest.raises(PycLabError, match="lse must be"):
        pl.attention_backward(q, k, v, rand(rng, (1, 2, 4, 8)), lse=rand(rng, (1, 2, 5)))
    with pytest.raises(PycLabError, match="out must be"):
        pl.attention_backward(q, k, v, rand(rng, (1, 2, 4, 8)), out=[[0.0]])
    with pytest.raises(PycLabError, match="not a multiple"):
        pl.attention_backward(rand(rng, (1, 3, 4, 8)), k, v, rand(rng, (1, 3, 4, 8)))


# --- torch's autograd through pl.attention (CPU tensors) ---------------------------------

def test_autograd_gradcheck_float64():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(int(np.random.default_rng().integers(2**31)))
    q = torch.randn(1, 4, 6, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(1, 2, 9, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(1, 2, 9, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: pl.attention(a, b, c, causal=True),
                                     (q, k, v))


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_autograd_matches_torch_math(layout):
    torch = pytest.importorskip("torch")
    shape_q, shape_k = ((2, 4, 33, 16), (2, 2, 47, 16)) if layout == "bhsd" else \
        ((2, 33, 4, 16), (2, 47, 2, 16))
    q, k, v = (torch.randn(s, requires_grad=True) for s in (shape_q, shape_k, shape_k))
    mask = torch.randn(33, 47)
    out = pl.attention(q, k, v, mask=mask, layout=layout)
    do = torch.randn_like(out)
    out.backward(do)
    got = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    t = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
    ref = torch.nn.functional.scaled_dot_product_attention(
        t(q), t(k), t(v), attn_mask=mask, enable_gqa=True)
    t(ref).backward(do)
    torch.testing.assert_close(out, t(ref), rtol=1e-4, atol=1e-5)
    for g, x in zip(got, (q, k, v), strict=True):
        torch.testing.assert_close(g, x.grad, rtol=1e-4, atol=1e-5)


def test_autograd_with_the_log_sum_exp_and_refusals():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.randn(1, 2, 9, 8, requires_grad=True) for _ in range(3))
    out, lse = pl.attention(q, k, v, causal=True, return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    (out * out).sum().backward()
    assert all(x.grad is not None and bool(torch.isfinite(x.grad).all()) for x in (q, k, v))
    with pytest.raises(PycLabError, match="with respect to the mask"):
        pl.attention(q, k, v, mask=torch.zeros(9, 9, requires_grad=True))
    # torch tensors through pl.attention_backward: the same gradients as autograd
    do = torch.randn(1, 2, 9, 8)
    for x in (q, k, v):
        x.grad = None
    pl.attention(q, k, v, causal=True).backward(do)
    got = pl.attention_backward(q.detach(), k.detach(), v.detach(), do, causal=True)
    for g, x in zip(got, (q, k, v), strict=True):
        torch.testing.assert_close(g, x.grad)
