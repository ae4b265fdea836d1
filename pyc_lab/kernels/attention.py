"""``pl.attention``: scaled dot-product attention on NumPy, CuPy and torch arrays.

``softmax(q @ k^T * scale + mask) @ v`` over heads, with causal masking, an additive (or
boolean) mask, grouped-query attention (fewer key/value heads than query heads) and the
(B, H, S, D) or (B, S, H, D) layout. On a GPU the computation goes to the attention
library a user would otherwise call, torch's ``scaled_dot_product_attention`` (cuDNN,
FlashAttention or its memory-efficient kernel, as torch picks) or pyc_lab's own Hopper
kernel (:mod:`.attention_sm90`), whichever was faster on the problem's first call, with
CuPy arrays passed through DLPack without copies on CuPy's current stream. The
log-sum-exp comes from pyc_lab's kernel where it can run. Without torch, without a GPU,
or for a log-sum-exp the kernel cannot give, it runs
:func:`~.attention_blocked.blocked_attention`, whose memory is bounded by its block
size. :func:`attention_route` names the path, :func:`attention_explain` says why.

The semantics are those of :mod:`.attention_blocked` (causal aligned at the top left as
torch's ``is_causal``; a row with every score masked gives NaN, as the NumPy expression
does).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import PycLabError
from . import arrays
from .attention_blocked import blocked_attention, blocked_attention_backward, default_scale

__all__ = ["LAYOUTS", "attention", "attention_backward", "attention_explain", "attention_route",
           "attention_xp"]

#: Operand layouts: batch, heads, sequence, head dimension in that order, or the
#: sequence before the heads (as most models keep their projections).
LAYOUTS = ("bhsd", "bshd")
_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _scale(scale: Any, q: Any) -> float:
    """The softmax scale as a float: ``1 / sqrt(head_dim)`` for None, else a finite real
    number (a string, a boolean, a complex number or NaN is refused here, not inside a
    kernel)."""
    if scale is None:
        return default_scale(int(q.shape[-1]))
    value = None
    if not isinstance(scale, (str, bytes, bool, np.bool_)):
        try:
            value = float(scale)
        except (TypeError, ValueError):
            value = None
    if value is None or not np.isfinite(value):
        raise PycLabError(f"pl.attention: scale must be a finite real number (or None for "
                          f"1 / sqrt(head_dim)), got {scale!r}")
    return value


def _check(q: Any, k: Any, v: Any, mask: Any, layout: str) -> tuple[Any, Any, Any]:
    if layout not in LAYOUTS:
        raise PycLabError(f"pl.attention: layout {layout!r} is not one of {LAYOUTS}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise PycLabError(f"pl.attention: {name} is a {type(x).__name__}, not an array; "
                              "pass NumPy arrays, CuPy arrays or torch tensors")
    kinds = {arrays.kind(x) for x in (q, k, v)}
    if len(kinds) != 1:
        raise PycLabError(f"pl.attention: q, k and v are of different array types {kinds}; "
                          "pass three NumPy arrays, three CuPy arrays or three tensors")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if len(x.shape) != 4:
            raise PycLabError(f"pl.attention: {name} has shape {tuple(x.shape)}; expected 4 "
                              f"axes ({layout})")
        dt = arrays.dtype_name(x.dtype)
        if dt not in _DTYPES:
            raise PycLabError(f"pl.attention: {name} is {dt}; attention takes {_DTYPES}")
    if len({arrays.dtype_name(x.dtype) for x in (q, k, v)}) != 1:
        raise PycLabError("pl.attention: q, k and v have different dtypes "
                          f"({arrays.dtype_name(q.dtype)}, {arrays.dtype_name(k.dtype)}, "
                          f"{arrays.dtype_name(v.dtype)}); cast them to one")
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2) if arrays.is_torch(x) else x.swapaxes(1, 2)
                   for x in (q, k, v))
    (b, hq, sq, d), (bk, hk, sk, dk), (bv, hv, sv, _) = q.shape, k.shape, v.shape
    if not (b == bk == bv) or hk != hv or sk != sv or d != dk:
        raise PycLabError(f"pl.attention: shapes (B, H, S, D) q {tuple(q.shape)}, k "
                          f"{tuple(k.shape)}, v {tuple(v.shape)} do not fit: batch must "
                          "match, k and v must have the same heads and length, q and k the "
                          "same head dimension")
    if hq % hk:
        raise PycLabError(f"pl.attention: {hq} query heads are not a multiple of {hk} "
                          "key/value heads (grouped-query attention needs whole groups)")
    if mask is not None:
        if not hasattr(mask, "shape") or arrays.kind(mask) != arrays.kind(q):
            raise PycLabError(f"pl.attention: the mask is a {type(mask).__name__}; pass it "
                              "as the same kind of array as q, k and v")
        try:
            np.broadcast_shapes(tuple(mask.shape), (b, hq, sq, sk))
        except ValueError:
            raise PycLabError(f"pl.attention: mask of shape {tuple(mask.shape)} does not "
                              f"broadcast to (B, H, Sq, Sk) = {(b, hq, sq, sk)}") from None
        if len(mask.shape) > 4:
            raise PycLabError("pl.attention: mask has more than 4 axes")
    return q, k, v


def attention_route(q: Any, *, return_lse: bool = False) -> str:
    """Which family of paths :func:`attention` takes for operands like ``q``.

    Returns
    -------
    str
        ``"torch-sdpa"`` (a CUDA tensor, or a CuPy array through DLPack when torch is
        installed: torch's scaled_dot_product_attention or pyc_lab's own kernel, raced
        on the first call; :func:`attention_explain` says which) or ``"blocked"`` (the
        blocked online softmax on NumPy or CuPy, and the log-sum-exp where pyc_lab's
        kernel cannot give it).
    """
    kind = arrays.kind(q)
    if kind == "numpy" or (return_lse and arrays.dtype_name(q.dtype) not in
                           ("float16", "bfloat16")):
        return "blocked"
    if kind == "torch":
        return "torch-sdpa" if q.is_cuda else "blocked"
    return "torch-sdpa" if arrays.torch_installed() else "blocked"


def _sdpa(q: Any, k: Any, v: Any, causal: bool, scale: float, mask: Any) -> Any:
    """torch's SDPA on (B, H, S, D) tensors; a row with every score masked gives NaN."""
    import torch
    import torch.nn.functional as F

    attn_mask = None
    if mask is not None:
        attn_mask = mask if mask.dtype == torch.bool else mask.to(q.dtype)
        if causal:  # SDPA takes one or the other: the causal part joins the mask
            sq, sk = q.shape[-2], k.shape[-2]
            keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
            attn_mask = (attn_mask & keep) if attn_mask.dtype == torch.bool else \
                attn_mask.masked_fill(~keep, float("-inf"))
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=causal and mask is None, scale=scale,
        enable_gqa=q.shape[1] != k.shape[1])
    if attn_mask is not None:
        dead = (~attn_mask if attn_mask.dtype == torch.bool
                else torch.isneginf(attn_mask)).all(dim=-1)
        if bool(dead.any()):
            out = out.masked_fill(dead.expand(out.shape[:-1]).unsqueeze(-1), float("nan"))
    return out


def _choose(q: Any, k: Any, v: Any, causal: bool, scale: float, mask: Any,
            return_lse: bool, layout: str) -> tuple[Any, Any]:
    """The output view pyc_lab's kernel would write, and the choice between the kernel and
    SDPA for these (B, H, S, D) CUDA tensors (made, with its race, on first sight).

    The output is allocated in the caller's layout, so a ``"bshd"`` result is a plain
    transpose of contiguous memory either way.
    """
    import torch

    from .attention_sm90 import fused_choice

    b, hq, sq, _ = q.shape
    shape = (b, sq, hq, v.shape[-1]) if layout == "bshd" else (b, hq, sq, v.shape[-1])
    o = torch.empty(shape, dtype=q.dtype, device=q.device)
    o = o.transpose(1, 2) if layout == "bshd" else o
    return o, fused_choice(q, k, v, o, causal, scale, mask,
                           lambda: _sdpa(q, k, v, causal, scale, mask), need_lse=return_lse)


def _torch_gpu(q: Any, k: Any, v: Any, causal: bool, scale: float, mask: Any,
               return_lse: bool, layout: str) -> tuple[Any, ...] | None:
    """pyc_lab's kernel or SDPA on (B, H, S, D) CUDA tensors: the outputs, or ``None``
    when the log-sum-exp is asked for and the kernel cannot give it."""
    o, choice = _choose(q, k, v, causal, scale, mask, return_lse, layout)
    if choice.kernel is not None:
        outs = _run_kernel(choice, q, k, v, o, return_lse)
        return outs if return_lse else outs[:1]
    if return_lse:
        return None
    return (_sdpa(q, k, v, causal, scale, mask),)


def _run_kernel(choice: Any, q: Any, k: Any, v: Any, o: Any,
                with_lse: bool) -> tuple[Any, Any]:
    """pyc_lab's kernel of ``choice`` into ``o`` (and a fresh float32 log-sum-exp with
    ``with_lse``, else ``None``): ``(o, lse)``."""
    import torch

    from .attention_sm90 import run_fused

    b, hq, sq, _ = q.shape
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device) \
        if with_lse else None
    run_fused(choice.kernel, choice.geometry, q, k, v, o, lse)
    return o, lse


def attention_explain(q: Any, k: Any, v: Any, *, causal: bool = False,
                      scale: float | None = None, mask: Any = None, layout: str = "bhsd",
                      return_lse: bool = False) -> str:
    """Which path :func:`attention` takes for these operands, and why: for CUDA tensors
    and CuPy arrays, the choice between pyc_lab's kernel and torch's SDPA (made, with its
    first-call race, if it was not made yet), e.g. ``"pyc-fused: tuned attn_n128_s2_w2
    (exact match): 0.51 ms against torch SDPA's 0.55 ms on the first call"``.
    """
    q, k, v = _check(q, k, v, mask, layout)
    scale = _scale(scale, q)
    route = attention_route(q, return_lse=return_lse)
    kind = arrays.kind(q)
    if kind == "numpy" or (kind == "torch" and not q.is_cuda) or \
            (kind == "cupy" and not arrays.torch_installed()):
        return f"{route}: no CUDA tensors for torch's SDPA or pyc_lab's kernel"
    import torch

    if kind == "cupy":
        q, k, v = (torch.from_dlpack(x) for x in (q, k, v))
        mask = None if mask is None else torch.from_dlpack(mask)
    _, choice = _choose(q, k, v, causal, scale, mask, return_lse, layout)
    if choice.kernel is None and return_lse:
        return f"blocked: the log-sum-exp, and pyc_lab's kernel cannot run ({choice.why})"
    return f"{choice.route}: {choice.why}"


def _grouped(q: Any, k: Any, v: Any, mask: Any) -> tuple[Any, Any, Any, Any]:
    """(B, Hkv, G, S, D) query groups against (B, Hkv, 1, S, D) keys and values (views)."""
    b, hq, sq, d = q.shape
    hk = k.shape[1]
    g = hq // hk
    qg = q.reshape(b, hk, g, sq, d)
    kg, vg = k[:, :, None], v[:, :, None]
    if mask is not None:
        m = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
        mask = m[:, :, None] if m.shape[1] == 1 else m.reshape(m.shape[0], hk, g, *m.shape[2:])
    return qg, kg, vg, mask


def attention_xp(xp: Any, q: Any, k: Any, v: Any, *, causal: bool, scale: float, mask: Any,
                 return_lse: bool) -> Any:
    """:func:`attention` on (B, H, S, D) NumPy or CuPy arrays, already checked."""
    if xp is not np and arrays.torch_installed():
        import torch

        with torch.cuda.stream(arrays.torch_stream_of_cupy()):
            tq, tk, tv = (torch.from_dlpack(x) for x in (q, k, v))
            tm = torch.from_dlpack(mask) if mask is not None else None
            outs = _torch_gpu(tq, tk, tv, causal, scale, tm, return_lse, "bhsd")
            if outs is not None:
                res = tuple(xp.from_dlpack(t) for t in outs)
                return res if return_lse else res[0]
    qg, kg, vg, mg = _grouped(q, k, v, mask)
    res = blocked_attention(xp, qg, kg, vg, scale=scale, causal=causal, mask=mg,
                            return_lse=return_lse)
    b, hq, sq, _ = q.shape
    if return_lse:
        out, lse = res
        return out.reshape(b, hq, sq, v.shape[-1]), lse.reshape(b, hq, sq)
    return res.reshape(b, hq, sq, v.shape[-1])


def attention(q: Any, k: Any, v: Any, *, causal: bool = False, scale: float | None = None,
              mask: Any = None, layout: str = "bhsd", return_lse: bool = False) -> Any:
    """Scaled dot-product attention: ``softmax(q @ k^T * scale + mask) @ v``.

    Parameters
    ----------
    q, k, v : NumPy arrays, CuPy arrays or torch tensors (all three of one kind)
        ``(B, Hq, Sq, D)``, ``(B, Hkv, Sk, D)``, ``(B, Hkv, Sk, Dv)`` for ``layout="bhsd"``
        (``(B, S, H, D)`` for ``"bshd"``); ``Hq`` a multiple of ``Hkv`` (grouped-query
        attention: query head ``h`` reads key/value head ``h // (Hq // Hkv)``); one of
        float16, bfloat16, float32, float64.
    causal : bool
        Query ``i`` sees keys ``j <= i`` (top-left aligned, as torch's ``is_causal``).
    scale : float, optional
        Multiplies the scores; ``1 / sqrt(D)`` when not given.
    mask : array, optional
        Of the operands' kind, broadcasting to ``(B, Hq, Sq, Sk)``: added to the scaled
        scores (``-inf`` masks), or boolean (``True`` takes part). A row with every key
        masked gives NaN.
    layout : {"bhsd", "bshd"}
        Axis order of the operands and of the result.
    return_lse : bool
        Also return the natural log-sum-exp of each row's scores, ``(B, Hq, Sq)`` in
        float32 (float64 for float64 operands): the blocked path computes it.

    Returns
    -------
    array or (array, array)
        ``(B, Hq, Sq, Dv)`` (``(B, Sq, Hq, Dv)`` for ``"bshd"``) in the operands' dtype
        and kind; torch results on torch's current stream, CuPy results on CuPy's.

    Raises
    ------
    PycLabError
        Operands of mixed kinds or dtypes, shapes that do not fit, a mask that does not
        broadcast, an unknown layout.
    """
    q, k, v = _check(q, k, v, mask, layout)
    scale = _scale(scale, q)
    kind = arrays.kind(q)
    if kind == "torch" and any(x.requires_grad for x in (q, k, v)):
        outs = _with_grad(q, k, v, causal, scale, mask, return_lse, layout)
    elif kind == "torch":
        outs = _torch_lse(q, k, v, causal, scale, mask, layout) if return_lse else \
            _torch_out(q, k, v, causal, scale, mask, layout)
    else:  # NumPy or CuPy arrays
        xp = np
        if kind == "cupy":
            import cupy as xp
        res = attention_xp(xp, q, k, v, causal=causal, scale=scale, mask=mask,
                           return_lse=return_lse)
        outs = res if return_lse else (res,)
    out = outs[0]
    if layout == "bshd":
        out = out.transpose(1, 2) if kind == "torch" else out.swapaxes(1, 2)
    return (out, outs[1]) if return_lse else out


def _torch_blocked(q: Any, k: Any, v: Any, causal: bool, scale: float,
                   mask: Any) -> tuple[Any, Any]:
    """The output and log-sum-exp of (B, H, S, D) torch tensors on the blocked path (on
    the host, the results moved back to the operands' device)."""
    res = attention_xp(np, *(arrays.host_of(x) for x in (q, k, v)), causal=causal,
                       scale=scale, mask=arrays.host_of(mask), return_lse=True)
    return tuple(arrays.torch_on(o, q.device) for o in res)


def _torch_lse(q: Any, k: Any, v: Any, causal: bool, scale: float, mask: Any,
               layout: str) -> tuple[Any, Any]:
    """Output and log-sum-exp of (B, H, S, D) torch tensors: pyc_lab's kernel where it
    runs, else the blocked path."""
    outs = _torch_gpu(q, k, v, causal, scale, mask, True, layout) if q.is_cuda else None
    return outs if outs is not None else _torch_blocked(q, k, v, causal, scale, mask)


def _torch_out(q: Any, k: Any, v: Any, causal: bool, scale: float, mask: Any,
               layout: str) -> tuple[Any]:
    """The output of (B, H, S, D) torch tensors (no gradients recorded)."""
    if q.is_cuda:
        return _torch_gpu(q, k, v, causal, scale, mask, False, layout)
    return _torch_blocked(q, k, v, causal, scale, mask)[:1]


def _torch_grads(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool,
                 scale: float, mask: Any) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)`` of (B, H, S, D) torch tensors (no autograd state) from the
    forward's output and log-sum-exp: the fastest correct library backward on a GPU
    (:func:`~.attention_grad.library_backward`), SDPA's recompute where a mask or a
    dtype rules the others out, the blocked backward on the host."""
    from .attention_grad import library_backward, recompute_backward

    if q.is_cuda:
        def forward(a: Any, b: Any, c: Any) -> Any:
            return _sdpa(a, b, c, causal, scale, mask)

        if mask is None and arrays.dtype_name(q.dtype) in ("float16", "bfloat16"):
            return library_backward(q, k, v, o, lse, do, causal, scale, forward)
        return recompute_backward(forward, q, k, v, do)
    grads = _blocked_grads(np, *(arrays.host_of(x) for x in (q, k, v, o, lse, do)),
                           causal=causal, scale=scale, mask=arrays.host_of(mask))
    return tuple(arrays.torch_on(g, q.device) for g in grads)


def _with_grad(q: Any, k: Any, v: Any, causal: bool, scale: float, mask: Any,
               return_lse: bool, layout: str) -> tuple[Any, ...]:
    """Attention of (B, H, S, D) torch tensors that require gradients.

    Where torch's SDPA wins the forward's race (or takes the mask), torch's autograd
    records SDPA itself. Where pyc_lab's kernel wins, it runs the forward and saves its
    log-sum-exp, and the backward is the fastest correct library backward given both.
    """
    from .autograd import differentiable

    if mask is not None and getattr(mask, "requires_grad", False) and \
            not (q.is_cuda and not return_lse):
        raise PycLabError("pl.attention: gradients with respect to the mask are taken "
                          "through torch's SDPA on a GPU only; detach the mask "
                          "(mask.detach()) or run on CUDA tensors without return_lse")
    qd, kd, vd = (x.detach() for x in (q, k, v))
    if q.is_cuda and not return_lse:
        o, choice = _choose(qd, kd, vd, causal, scale, mask, False, layout)
        if choice.kernel is None:
            return (_sdpa(q, k, v, causal, scale, mask),)

        def forward() -> tuple[Any, Any]:
            return _run_kernel(choice, qd, kd, vd, o, True)
    else:
        def forward() -> tuple[Any, Any]:
            return _torch_lse(qd, kd, vd, causal, scale, mask, layout)

    def backward(inputs: tuple, outputs: tuple, grads: tuple) -> Any:
        return _torch_grads(*inputs, *outputs, grads[0], causal, scale, mask)

    res = differentiable((q, k, v), forward, backward, non_differentiable=(1,))
    return res if return_lse else res[:1]


def _blocked_grads(xp: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, *,
                   causal: bool, scale: float, mask: Any) -> tuple[Any, Any, Any]:
    """:func:`~.attention_blocked.blocked_attention_backward` on (B, H, S, D) arrays with
    whole query groups against their key/value heads."""
    qg, kg, vg, mg = _grouped(q, k, v, mask)
    lead = qg.shape[:3]
    og = o.reshape(*lead, *o.shape[2:])
    dog = do.reshape(*lead, *do.shape[2:])
    lseg = lse.reshape(*lead, lse.shape[-1])
    dq, dk, dv = blocked_attention_backward(xp, qg, kg, vg, og, lseg, dog, scale=scale,
                                            causal=causal, mask=mg)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


def attention_backward(q: Any, k: Any, v: Any, dout: Any, *, out: Any = None,
                       lse: Any = None, causal: bool = False, scale: float | None = None,
                       mask: Any = None, layout: str = "bhsd") -> tuple[Any, Any, Any]:
    """Gradients of :func:`attention` with respect to ``q``, ``k`` and ``v``.

    For arrays without an autograd of their own (NumPy, CuPy) and for a training step
    written by hand; torch tensors that require gradients get them from
    ``loss.backward()`` through :func:`attention` itself.

    Parameters
    ----------
    q, k, v, causal, scale, mask, layout
        As for :func:`attention` (the same operands and options as the forward).
    dout : array
        The gradient of the loss with respect to the attention's output: its shape and
        kind, and the operands' dtype.
    out, lse : arrays, optional
        The forward's output and log-sum-exp (``attention(..., return_lse=True)``). When
        either is missing the forward runs again to give them.

    Returns
    -------
    (array, array, array)
        ``dq, dk, dv`` of the shapes, layout, dtype and kind of ``q``, ``k``, ``v``
        (a key/value head shared by a query group gets its group's summed gradient). A
        row with every key masked passes no gradient.

    Raises
    ------
    PycLabError
        As :func:`attention`; or ``dout``, ``out`` or ``lse`` of the wrong shape or kind.

    Notes
    -----
    On a GPU the gradients come from the fastest correct library backward for the
    problem (cuDNN's, FlashAttention-2's, or torch's SDPA run again under autograd;
    checked against the last and raced on the first call, :mod:`.attention_grad`); on
    the host, and on CuPy without torch, from the blocked backward
    (:func:`~.attention_blocked.blocked_attention_backward`), whose memory is bounded by
    its blocks.
    """
    q, k, v = _check(q, k, v, mask, layout)
    scale = _scale(scale, q)
    b, hq, sq, _ = q.shape
    want = (b, sq, hq, v.shape[-1]) if layout == "bshd" else (b, hq, sq, v.shape[-1])
    kind = arrays.kind(q)
    for name, x, shape in (("dout", dout, want), ("out", out, want), ("lse", lse, (b, hq, sq))):
        if x is None and name != "dout":
            continue
        if not hasattr(x, "shape") or arrays.kind(x) != kind or tuple(x.shape) != shape:
            raise PycLabError(f"pl.attention_backward: {name} must be a {kind} array of "
                              f"shape {shape} (the forward's); got "
                              f"{getattr(x, 'shape', type(x).__name__)}")
    if layout == "bshd":
        dout, out = (None if x is None else (x.transpose(1, 2) if kind == "torch"
                                             else x.swapaxes(1, 2)) for x in (dout, out))
    grads = _grads_of(kind, q, k, v, out, lse, dout, causal, scale, mask)
    if layout == "bshd":
        grads = tuple(g.transpose(1, 2) if kind == "torch" else g.swapaxes(1, 2)
                      for g in grads)
    return grads


def _grads_of(kind: str, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any,
              causal: bool, scale: float, mask: Any) -> tuple[Any, Any, Any]:
    """:func:`attention_backward` on checked (B, H, S, D) operands."""
    if kind == "torch":
        q, k, v, dout = (x.detach() for x in (q, k, v, dout))
        if out is None or lse is None:
            out, lse = _torch_lse(q, k, v, causal, scale, mask, "bhsd")
        return _torch_grads(q, k, v, out.detach(), lse.detach(), dout, causal, scale,
                            mask)
    xp = np
    if kind == "cupy":
        import cupy as xp

        if arrays.torch_installed():
            import torch

            with torch.cuda.stream(arrays.torch_stream_of_cupy()):
                t = [None if x is None else torch.from_dlpack(x)
                     for x in (q, k, v, out, lse, dout, mask)]
                grads = _grads_of("torch", *t[:6], causal, scale, t[6])
                return tuple(xp.from_dlpack(g) for g in grads)
    if out is None or lse is None:
        out, lse = attention_xp(xp, q, k, v, causal=causal, scale=scale, mask=mask,
                                return_lse=True)
    return _blocked_grads(xp, q, k, v, out, lse, dout, causal=causal, scale=scale,
                          mask=mask)
