"""The backward pass of ``pl.attention``: gradients for training.

:func:`library_backward`, used by :func:`~.attention.attention` (torch tensors that
require gradients, through :func:`~.autograd.differentiable`) and
:func:`~.attention.attention_backward` (any arrays), gives the gradients of
``(B, H, S, D)`` CUDA tensors from the forward's output and log-sum-exp (FlashAttention's
contract: the softmax is recomputed from the log-sum-exp, never stored). The candidates
are the backward kernels of the attention library a user would call: cuDNN's and
FlashAttention-2's (torch's ``_scaled_dot_product_{cudnn,flash}_attention_backward``, fed
pyc_lab's output and log-sum-exp), and torch's SDPA run again under autograd (which
needs neither). On the first backward of each signature every candidate runs once and is
checked against the SDPA recompute; the correct ones are raced
(:func:`~.blas_direct.race`) and the fastest is kept — the never-slower rule of
``pl.matmul``, applied to the backward.

pyc_lab's own Hopper kernel computes the forward only; the backward runs on these
library kernels.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .arrays import torch_raw_stream
from .memo import remember

__all__ = ["BackwardChoice", "backward_choice", "clear", "library_backward",
           "recompute_backward"]

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_CHOICES: dict[tuple, BackwardChoice] = {}
MAX_MEMO = 256

#: A candidate's gradients must be within this fraction of the largest gradient of the
#: SDPA recompute (16-bit gradients from different blockings differ by ~1e-2 of it).
CHECK_RTOL = 5e-2

Grads = tuple[Any, Any, Any]


@dataclass(frozen=True)
class BackwardChoice:
    """Which backward kernel runs one signature, and why."""
    name: str  # "cudnn", "flash" or "sdpa-recompute"
    why: str
    times_ms: dict[str, float] = field(default_factory=dict)


def clear() -> None:
    """Forget every backward choice (tests)."""
    with _LOCK:
        _CHOICES.clear()


_SEEDS: dict[Any, Any] = {}


def _seed(q: Any) -> Any:
    """The dropout seed/offset tensor the library backwards take (never read without
    dropout): one per device, made once."""
    seed = _SEEDS.get(q.device)
    if seed is None:
        import torch

        seed = _SEEDS.setdefault(q.device, torch.zeros((), dtype=torch.long,
                                                       device=q.device))
    return seed


def _cudnn(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool,
           scale: float) -> Grads:
    import torch

    seed = _seed(q)
    return tuple(torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, o, lse.unsqueeze(-1), seed, seed, None, None, None,
        int(q.shape[2]), int(k.shape[2]), 0.0, causal, scale=scale))


def _flash(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool,
           scale: float) -> Grads:
    import torch

    seed = _seed(q)
    return tuple(torch.ops.aten._scaled_dot_product_flash_attention_backward(
        do, q, k, v, o, lse, None, None, int(q.shape[2]), int(k.shape[2]), 0.0, causal,
        seed, seed, scale=scale))


def recompute_backward(forward: Callable[[Any, Any, Any], Any], q: Any, k: Any, v: Any,
                       do: Any) -> Grads:
    """The gradients by running ``forward(q, k, v)`` (torch's SDPA) again under autograd:
    needs no saved output, takes any mask."""
    import torch

    with torch.enable_grad():
        leaves = tuple(x.detach().requires_grad_() for x in (q, k, v))
        out = forward(*leaves)
        return tuple(torch.autograd.grad(out, leaves, do))


_LIBRARY = {"cudnn": _cudnn, "flash": _flash}


def _close(got: Grads, want: Grads) -> str:
    """Why ``got`` is not ``want`` within :data:`CHECK_RTOL` (``""`` when it is)."""
    import torch

    for name, a, b in zip("qkv", got, want, strict=True):
        if a is None or tuple(a.shape) != tuple(b.shape):
            return f"d{name} has the wrong shape"
        a, b = a.float(), b.float()
        if bool((torch.isfinite(b) & ~torch.isfinite(a)).any()):
            return f"d{name} has non-finite values where the recompute has none"
        err = float((a - b).nan_to_num().abs().max())
        ref = float(b.nan_to_num().abs().max())
        if err > CHECK_RTOL * ref + 1e-6:
            return f"d{name} differs by {err:.3g} (largest gradient {ref:.3g})"
    return ""


def _choose(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool,
            scale: float, forward: Callable[[Any, Any, Any], Any]) -> BackwardChoice:
    """Check every library backward against the recompute, race the correct ones."""
    from .blas_direct import race

    want = recompute_backward(forward, q, k, v, do)
    runs: dict[str, Callable[[], Any]] = {
        "sdpa-recompute": lambda: recompute_backward(forward, q, k, v, do)}
    refused: list[str] = []
    for name, fn in _LIBRARY.items():
        try:
            why = _close(fn(q, k, v, o, lse, do, causal, scale), want)
        except Exception as exc:  # a kernel that refuses the problem is no candidate
            why = f"refused ({str(exc).splitlines()[0][:120]})"
        if why:
            refused.append(f"{name}: {why}")
        else:
            runs[name] = (lambda fn=fn: fn(q, k, v, o, lse, do, causal, scale))
    stream = torch_raw_stream(q.device)
    try:
        times = dict(zip(runs, race(list(runs.values()), stream), strict=True))
    except Exception as exc:  # no CuPy to time with: the first correct library kernel
        log.warning("attention backward race failed: %s", exc)
        name = next(iter(n for n in runs if n != "sdpa-recompute"), "sdpa-recompute")
        return BackwardChoice(name, f"the race failed ({exc}); first correct candidate")
    best = min(times, key=times.__getitem__)
    timing = ", ".join(f"{n} {t:.4g} ms" for n, t in sorted(times.items(),
                                                            key=lambda kv: kv[1]))
    why = f"fastest correct backward on the first call: {timing}"
    if refused:
        why += "; not candidates: " + "; ".join(refused)
    return BackwardChoice(best, why, times)


def _signature(q: Any, k: Any, v: Any, o: Any, do: Any, causal: bool,
               scale: float) -> tuple:
    return (tuple(q.shape), tuple(k.shape), tuple(v.shape),
            tuple(tuple(t.stride()) for t in (q, k, v, o, do)), str(q.dtype),
            q.device.index, bool(causal), float(scale))


def backward_choice(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool,
                    scale: float, forward: Callable[[Any, Any, Any], Any]
                    ) -> BackwardChoice:
    """The backward kernel for these ``(B, H, S, D)`` CUDA tensors: made (checked and
    raced) on the first call of each signature and remembered.

    ``forward(q, k, v)`` is torch's SDPA for the problem (the recompute candidate and the
    reference the library kernels are checked against).
    """
    sig = _signature(q, k, v, o, do, causal, scale)
    hit = _CHOICES.get(sig)
    if hit is None:
        hit = _choose(q, k, v, o, lse, do, causal, scale, forward)
        log.info("pyc_lab attention backward %s: %s", hit.name, hit.why)
        remember(_CHOICES, sig, hit, MAX_MEMO, _LOCK)
    return hit


def _like(o: Any, do: Any) -> Any:
    """``do`` in ``o``'s memory layout (the library kernels read both alike)."""
    import torch

    if do.stride() == o.stride():
        return do
    out = torch.empty_like(o)
    out.copy_(do)
    return out


def library_backward(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool,
                     scale: float, forward: Callable[[Any, Any, Any], Any]) -> Grads:
    """``(dq, dk, dv)`` of ``(B, H, S, D)`` CUDA tensors from the forward's output ``o``
    and its natural log-sum-exp ``lse`` (``(B, Hq, Sq)`` float32), on the fastest correct
    library backward (:func:`backward_choice`)."""
    do = _like(o, do)
    choice = backward_choice(q, k, v, o, lse, do, causal, scale, forward)
    if choice.name == "sdpa-recompute":
        return recompute_backward(forward, q, k, v, do)
    return _LIBRARY[choice.name](q, k, v, o, lse, do, causal, scale)
