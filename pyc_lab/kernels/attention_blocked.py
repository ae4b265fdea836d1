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

__all__ = ["BLOCK_K", "BLOCK_Q", "blocked_attention", "default_scale"]

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
    maskf = None
    if mask is not None:
        maskf = mask.astype(acc, copy=False) if mask.dtype != np.bool_ \
            else xp.where(mask, acc.type(0), acc.type(-np.inf))
        if maskf.ndim < 2:
            maskf = maskf.reshape((1,) * (2 - maskf.ndim) + tuple(maskf.shape))
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
            scores = xp.matmul(qb, kt[..., :, k0:k1]) * s
            if maskf is not None:
                rows_m = slice(q0, q1) if maskf.shape[-2] != 1 else slice(0, 1)
                cols_m = slice(k0, k1) if maskf.shape[-1] != 1 else slice(0, 1)
                scores = scores + maskf[..., rows_m, cols_m]
            if causal and k1 - 1 > q0:
                rows = xp.arange(q0, q1).reshape(-1, 1)
                cols = xp.arange(k0, k1).reshape(1, -1)
                scores = xp.where(cols > rows, ninf, scores)
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


def default_scale(head_dim: int) -> float:
    """``1 / sqrt(head_dim)``: the scale when none is given (as torch's SDPA)."""
    return 1.0 / math.sqrt(head_dim)
