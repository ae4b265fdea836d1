"""The ``attention`` op: ``softmax(q @ k^T * scale [+ mask]) @ v`` as one node.

:mod:`.passes.attention_find` rewrites a hand-written attention into it. Its reference
is :func:`pyc_lab.kernels.attention.attention_xp` on operands of any rank: leading axes
that broadcast are viewed as (batch, heads) = (1, N); on a GPU where torch is installed
it runs what ``pl.attention`` chose (pyc_lab's Hopper kernel or torch's
``scaled_dot_product_attention``, through DLPack), elsewhere the
blocked online softmax, whose memory is bounded by its blocks instead of the score
matrix. Inputs: ``q, k, v[, mask]``; attributes: ``scale`` (a float) and ``causal``.
The operands go in their own dtype (the library's fused kernels take float16 and
bfloat16 as they are; the blocked path accumulates in float32) and the result is cast
to the node's dtype, the dtype NumPy gives the hand-written expression.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .op_registry import REGISTRY, OpDef, register

__all__ = ["attention_bound", "attention_reference"]


def _common(q: Any, k: Any, v: Any) -> np.dtype:
    """The one dtype the three operands are given in: theirs when they agree (float16
    stays float16, the dtype the library's fused kernels take), else NumPy's promotion
    (float32 where NumPy has none, as for bfloat16 with float16)."""
    if q.dtype == k.dtype == v.dtype:
        return np.dtype(q.dtype)
    try:
        return np.dtype(np.result_type(q.dtype, k.dtype, v.dtype))
    except TypeError:
        return np.dtype(np.float32)


def attention_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    """The attention op on ``xp`` arrays (see the module docstring)."""
    from ..kernels.attention import attention_xp

    q, k, v = args[:3]
    mask = args[3] if len(args) > 3 else None
    work = _common(q, k, v)
    if mask is not None and mask.dtype.kind == "f" and mask.dtype.itemsize > work.itemsize:
        work = np.dtype(mask.dtype)  # NumPy computes the scores in the mask's precision
    q, k, v = (x.astype(work, copy=False) for x in (q, k, v))
    lead = np.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2]))
    n = int(np.prod(lead, dtype=np.int64))

    def four(x: Any) -> Any:  # (..., S, D) -> (1, N, S, D), broadcast first (a view)
        x = xp.broadcast_to(x, (*lead, *x.shape[-2:]))
        return x.reshape(1, n, *x.shape[-2:])

    q4, k4, v4 = four(q), four(k), four(v)
    m4 = None
    if mask is not None:
        m = mask.astype(work, copy=False) if mask.dtype != np.bool_ else mask
        m = m.reshape((1,) * max(0, 2 - m.ndim) + tuple(m.shape))
        if all(d == 1 for d in m.shape[:-2]):  # one mask for every (batch, head): no copy
            m4 = m.reshape(1, 1, *m.shape[-2:])
        else:
            m4 = four(xp.broadcast_to(m, (*lead, *m.shape[-2:])))
    out = attention_xp(xp, xp.ascontiguousarray(q4), xp.ascontiguousarray(k4),
                       xp.ascontiguousarray(v4), causal=bool(attrs.get("causal", False)),
                       scale=float(attrs["scale"]), mask=m4, return_lse=False)
    return out.reshape(*lead, q.shape[-2], v.shape[-1])


def attention_bound(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    """The attention op on CuPy operands at fixed addresses as ``call(out)``
    (:func:`pyc_lab.kernels.attention_bound.bound_attention`: conversions and the choice
    made once), or ``None`` where that does not apply and the reference runs instead.

    Taken: ``q, k, v`` C-contiguous of the node's dtype with the same leading axes (no
    broadcasting among them), viewed as ``(1, N, S, D)`` as the reference views them, and
    no mask or one C-contiguous mask for every (batch, head) of the node's dtype or
    boolean: views only, so that new contents at the same addresses are read.
    """
    if xp is np:
        return None
    from ..kernels.attention_bound import bound_attention

    q, k, v = args[:3]
    mask = args[3] if len(args) > 3 else None
    work = np.dtype(attrs["dtype"])
    if any(x.dtype != work or not x.flags.c_contiguous or x.ndim < 2 for x in (q, k, v)):
        return None
    lead = tuple(q.shape[:-2])
    if tuple(k.shape[:-2]) != lead or tuple(v.shape[:-2]) != lead:
        return None
    n = int(np.prod(lead, dtype=np.int64))
    q4, k4, v4 = (x.reshape(1, n, *x.shape[-2:]) for x in (q, k, v))
    m4 = None
    if mask is not None:
        if any(d != 1 for d in mask.shape[:-2]) or mask.ndim < 2 or \
                not mask.flags.c_contiguous or (mask.dtype != np.bool_ and mask.dtype != work):
            return None  # (a copy of a strided mask would miss later writes into it)
        m4 = mask.reshape(1, 1, *mask.shape[-2:])
    return bound_attention(q4, k4, v4, causal=bool(attrs.get("causal", False)),
                           scale=float(attrs["scale"]), mask=m4)


def _shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    q, k, v = inputs[:3]
    lead = np.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2]))
    return (*lead, q.shape[-2], v.shape[-1])


if "attention" not in REGISTRY:
    register(OpDef("attention", "attention", None, _shape, attention_reference,
                    dtype=lambda inputs, attrs: np.dtype(attrs["dtype"]),
                    doc="softmax(q @ k^T * scale [+ mask]) @ v (pl.attention's semantics)",
                    bound=attention_bound))
