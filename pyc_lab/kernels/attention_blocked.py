"""Blocked attention with an online softmax, for any array module (NumPy or CuPy).

``softmax(q @ k^T * scale + mask) @ v`` computed one block of queries against one block
of keys at a time, with the running maximum, running sum and running output of each
query row kept in float32 (the online softmax of FlashAttention). Memory beyond the
operands and the result is bounded by the block sizes: the full score matrix never
exists. It is the path without a GPU (and with one where no attention library is
installed), and the reference the fused paths are checked against.

Semantics, shared with :func:`pyc_lab.kernels.attention.attention`:

- operands are ``q (..., Sq, D)``, ``k (..., Sk, D)``, ``v (..., Sk, Dv)`` with leading
  dimensions that broadcast against each other (grouped-query attention is a size-1 axis
  of ``k`` and ``v`` against the query heads of ``q``);
- ``mask`` is added to the scaled scores and broadcasts to ``(..., Sq, Sk)``;
- ``causal``: query ``i`` sees keys ``j <= i`` (aligned at the top left, as torch's
  ``is_causal``);
- a row whose every score is ``-inf`` has no softmax: its output is NaN, as NumPy's
  ``exp(s - s.max()) / sum(...)`` gives, and its log-sum-exp is ``-inf``;
- the result has ``q``'s dtype (float32 arithmetic for 16-bit inputs).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["BLOCK_K", "BLOCK_Q", "blocked_attention", "blocked_attention_backward",
           "default_scale"]

#: Queries and keys per block: the scores of one step are BLOCK_Q x BLOCK_K per head.
BLOCK_Q = 128
BLOCK_K = 512


def _acc_dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def blocked_attention(xp: Any, q: Any, k: Any, v: Any, *, scale: float, causal: bool = False,
                      mask: Any = None, return_lse: bool = False,
                      block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> Any:
    """Attention over the last two axes, one (query block, key block) at a time.

    Parameters
    ----------
    xp : module
        ``numpy`` or ``cupy``: the module of the operands.
    q, k, v : arrays
        ``(..., Sq, D)``, ``(..., Sk, D)``, ``(..., Sk, Dv)``; leading axes broadcast.
    scale : float
        Multiplies ``q @ k^T`` before the mask is added.
    causal : bool
        Mask key ``j > i`` for query ``i``.
    mask : array, optional
        Added to the scaled scores; broadcasts to ``(..., Sq, Sk)``. ``-inf`` masks.
    return_lse : bool
        Also return the natural log-sum-exp of each row's scaled, masked scores
        (``(..., Sq)``, float32; float64 for float64 inputs).
    block_q, block_k : int
        Block sizes (memory per step: ``block_q * block_k`` scores per head).

    Returns
    -------
    array or (array, array)
        ``(..., Sq, Dv)`` in ``q``'s dtype, and the log-sum-exp when asked for.
    """
    acc = _acc_dtype(q.dtype)
    sq, sk = int(q.shape[-2]), int(k.shape[-2])
    lead = np.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2]),
                               tuple(mask.shape[:-2]) if mask is not None and mask.ndim > 2
                               else ())
    dv = int(v.shape[-1])
    out = xp.empty((*lead, sq, dv), dtype=q.dtype)
    lse = xp.empty((*lead, sq), dtype=acc) if return_lse else None
    qf = q.astype(acc, copy=False)
    kt = xp.swapaxes(k.astype(acc, copy=False), -1, -2)
    vf = v.astype(acc, copy=False)
    maskf = _mask_of(xp, mask, acc)
    s = acc.type(scale)
    ninf = acc.type(-np.inf)
    for q0 in range(0, sq, block_q):
        q1 = min(q0 + block_q, sq)
        qb = qf[..., q0:q1, :]
        m = xp.full((*lead, q1 - q0), ninf, dtype=acc)
        total = xp.zeros((*lead, q1 - q0), dtype=acc)
        o = xp.zeros((*lead, q1 - q0, dv), dtype=acc)
        k_end = min(sk, q1) if causal else sk  # keys past the block's last query: masked
        for k0 in range(0, k_end, block_k):
            k1 = min(k0 + block_k, k_end)
            scores = _scores(xp, qb, kt, maskf, q0, q1, k0, k1, s, causal)
            m_new = xp.maximum(m, scores.max(axis=-1))
            # rows with no finite score yet keep a zero contribution (not exp(nan))
            safe = xp.where(xp.isneginf(m_new), acc.type(0), m_new)
            p = xp.exp(scores - safe[..., None])
            alpha = xp.exp(m - safe)
            total = total * alpha + p.sum(axis=-1)
            o = o * alpha[..., None] + xp.matmul(p, vf[..., k0:k1, :])
            m = m_new
        with np.errstate(invalid="ignore", divide="ignore"):
            res = o / total[..., None]  # a fully masked row: 0 / 0 = NaN, as NumPy's
        out[..., q0:q1, :] = res.astype(q.dtype, copy=False)
        if lse is not None:
            with np.errstate(divide="ignore"):
                lse[..., q0:q1] = m + xp.log(total)
    return (out, lse) if return_lse else out


def _sum_to(xp: Any, x: Any, shape: tuple[int, ...]) -> Any:
    """``x`` summed over the leading axes that ``shape`` broadcasts (its size-1 axes):
    the gradient of a broadcast operand (a key/value head shared by a query group)."""
    axes = tuple(i for i, (n, t) in enumerate(zip(x.shape[:len(shape)], shape, strict=True))
                 if t == 1 and n != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def _mask_of(xp: Any, mask: Any, acc: np.dtype) -> Any:
    """The additive float mask (``-inf`` where a boolean mask is ``False``), at least 2-D."""
    if mask is None:
        return None
    maskf = mask.astype(acc, copy=False) if mask.dtype != np.bool_ \
        else xp.where(mask, acc.type(0), acc.type(-np.inf))
    if maskf.ndim < 2:
        maskf = maskf.reshape((1,) * (2 - maskf.ndim) + tuple(maskf.shape))
    return maskf


def _scores(xp: Any, qb: Any, kt: Any, maskf: Any, q0: int, q1: int, k0: int, k1: int,
            scale: Any, causal: bool) -> Any:
    """The scaled, masked scores of query rows ``q0:q1`` against keys ``k0:k1``."""
    scores = xp.matmul(qb, kt[..., :, k0:k1]) * scale
    if maskf is not None:
        rows_m = slice(q0, q1) if maskf.shape[-2] != 1 else slice(0, 1)
        cols_m = slice(k0, k1) if maskf.shape[-1] != 1 else slice(0, 1)
        scores = scores + maskf[..., rows_m, cols_m]
    if causal and k1 - 1 > q0:
        rows = xp.arange(q0, q1).reshape(-1, 1)
        cols = xp.arange(k0, k1).reshape(1, -1)
        scores = xp.where(cols > rows, np.dtype(scores.dtype).type(-np.inf), scores)
    return scores


def blocked_attention_backward(xp: Any, q: Any, k: Any, v: Any, out: Any, lse: Any,
                               dout: Any, *, scale: float, causal: bool = False,
                               mask: Any = None, block_q: int = BLOCK_Q,
                               block_k: int = BLOCK_K) -> tuple[Any, Any, Any]:
    """The gradients ``(dq, dk, dv)`` of :func:`blocked_attention` with respect to its
    operands, given its output, its log-sum-exp and the output's gradient ``dout``.

    FlashAttention's backward, one (query block, key block) at a time: the softmax is
    recomputed from the saved log-sum-exp (``P = exp(S - lse)``), then
    ``dV += P^T dO``, ``dS = P * (dO V^T - rowsum(dO * O))``, ``dQ += dS K * scale``,
    ``dK += dS^T Q * scale``, in float32 (float64 for float64 operands). Memory beyond
    the operands and the gradients is bounded by the block sizes. A broadcast key/value
    head (grouped-query attention) gets the sum of its group's gradients. A row with
    every score masked (output NaN, log-sum-exp ``-inf``) passes no gradient.

    Parameters
    ----------
    xp : module
        ``numpy`` or ``cupy``.
    q, k, v, mask, scale, causal, block_q, block_k
        As for :func:`blocked_attention`.
    out, lse : arrays
        :func:`blocked_attention`'s result and log-sum-exp for these operands.
    dout : array
        The gradient of a loss with respect to ``out`` (``out``'s shape).

    Returns
    -------
    (array, array, array)
        ``dq, dk, dv`` of the shapes and dtypes of ``q``, ``k``, ``v``.
    """
    acc = _acc_dtype(q.dtype)
    sq, sk = int(q.shape[-2]), int(k.shape[-2])
    lead = tuple(out.shape[:-2])
    qf, kf, vf = (x.astype(acc, copy=False) for x in (q, k, v))
    kt = xp.swapaxes(kf, -1, -2)
    vt = xp.swapaxes(vf, -1, -2)
    do = dout.astype(acc, copy=False)
    lse_f = lse.astype(acc, copy=False)
    dead = xp.isneginf(lse_f)  # every score masked: no softmax, no gradient
    with np.errstate(invalid="ignore"):
        delta = xp.where(dead, acc.type(0), (do * out.astype(acc, copy=False)).sum(axis=-1))
    lse_safe = xp.where(dead, acc.type(0), lse_f)
    maskf = _mask_of(xp, mask, acc)
    s = acc.type(scale)
    dq = xp.empty(q.shape, dtype=q.dtype)
    dk_acc = xp.zeros((*lead, sk, k.shape[-1]), dtype=acc)
    dv_acc = xp.zeros((*lead, sk, v.shape[-1]), dtype=acc)
    for q0 in range(0, sq, block_q):
        q1 = min(q0 + block_q, sq)
        qb = xp.broadcast_to(qf[..., q0:q1, :], (*lead, q1 - q0, q.shape[-1]))
        dob = do[..., q0:q1, :]
        live = ~dead[..., q0:q1, None]
        dq_b = xp.zeros((*lead, q1 - q0, q.shape[-1]), dtype=acc)
        k_end = min(sk, q1) if causal else sk
        for k0 in range(0, k_end, block_k):
            k1 = min(k0 + block_k, k_end)
            scores = _scores(xp, qb, kt, maskf, q0, q1, k0, k1, s, causal)
            p = xp.where(live, xp.exp(scores - lse_safe[..., q0:q1, None]), acc.type(0))
            dv_acc[..., k0:k1, :] += xp.matmul(xp.swapaxes(p, -1, -2), dob)
            dp = xp.matmul(dob, vt[..., :, k0:k1])
            ds = p * (dp - delta[..., q0:q1, None])
            dq_b += xp.matmul(ds, kf[..., k0:k1, :]) * s
            dk_acc[..., k0:k1, :] += xp.matmul(xp.swapaxes(ds, -1, -2), qb) * s
        dq[..., q0:q1, :] = _sum_to(xp, dq_b, tuple(q.shape[:-2])).astype(q.dtype, copy=False)
    dk = _sum_to(xp, dk_acc, tuple(k.shape[:-2])).astype(k.dtype, copy=False)
    dv = _sum_to(xp, dv_acc, tuple(v.shape[:-2])).astype(v.dtype, copy=False)
    return dq, dk.reshape(k.shape), dv.reshape(v.shape)


def default_scale(head_dim: int) -> float:
    """``1 / sqrt(head_dim)``: the scale when none is given (as torch's SDPA)."""
    return 1.0 / math.sqrt(head_dim)
