"""Which kernels compute ``pl.conv``'s gradients on a GPU: cuDNN's, or tuned CUTLASS ones.

The backward of a convolution is two more convolutions: the input's gradient (dgrad,
``dy, w -> dx``) and the filter's (wgrad, ``dy, x -> dw``). For each, a kernel that
:func:`pyc_lab.autotune_conv` tuned (``direction="dgrad"`` / ``"wgrad"``; the database's
winner, found by :func:`~.conv_cutlass.tuned_grad_runner`) is raced against cuDNN's
backward convolution on the problem's first backward call, on the caller's tensors, as
``pl.conv``'s forward race does (:func:`~.conv_gemm.time_calls`: the larger of GPU and
host time per call, interleaved rounds), and kept only when at least
:data:`~.conv_gemm.MARGIN` cheaper and no slower on the GPU: the never-slower rule with
cuDNN as the library a user would call. Without a tuned kernel, inside a CUDA-graph
capture of an unraced problem, or with grouped convolutions, cuDNN runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .memo import remember

__all__ = ["choices", "conv_grads"]

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
#: signature -> ``{"impl": "cutlass" | "cudnn", ...timings}`` and the kept runners.
_CHOICES: dict[tuple, tuple[dict[str, Any], Callable[..., Any] | None]] = {}
MAX_CHOICES = 512


def choices() -> dict[tuple, dict[str, Any]]:
    """Every gradient choice made so far: signature -> what runs it and the race's
    milliseconds (``cudnn_ms``, ``cutlass_ms``, their GPU and host parts)."""
    with _LOCK:
        return {k: dict(v[0]) for k, v in _CHOICES.items()}


def conv_grads(x: Any, w: Any, dy: Any, *, has_bias: bool, stride: tuple[int, ...],
               pads: tuple[int, ...], dilation: tuple[int, ...], groups: int,
               needs: tuple[bool, bool] = (True, True)) -> tuple[Any, Any, Any]:
    """The gradients of a convolution of CUDA tensors, each by the faster of cuDNN and a
    tuned CUTLASS kernel.

    Parameters
    ----------
    x, w, dy
        The forward's input ``(N, C, *spatial)`` and filter ``(K, C // groups,
        *kernel)``, and the gradient of its result ``(N, K, *out)``, in one dtype.
    has_bias
        Whether the forward had a bias (``db`` is computed only then).
    stride, pads, dilation, groups
        The forward's, per spatial axis.
    needs
        Whether ``dx`` and ``dw`` are wanted (a network's input image takes no
        gradient); an unwanted one is ``None``.

    Returns
    -------
    tuple
        ``(dx, dw, db)``: each of ``dx`` and ``dw`` by the tuned kernel where it won its
        race (:func:`~.conv_cutlass.tuned_grad_runner`), else by cuDNN
        (:func:`~.conv_grad.torch_conv_backward`); ``db`` is ``dy`` summed, ``None``
        without a bias.
    """
    from .conv_grad import torch_conv_backward

    geo = {"stride": stride, "pads": pads, "dilation": dilation, "groups": groups}
    fns = {d: _chosen(d, x, w, dy, geo) if need else None
           for d, need in zip(("dgrad", "wgrad"), needs, strict=True)}
    need = (needs[0] and fns["dgrad"] is None, needs[1] and fns["wgrad"] is None, has_bias)
    dx, dw, db = torch_conv_backward(x, w, dy, bias=has_bias, needs=need, **geo) \
        if any(need) else (None, None, None)
    if fns["dgrad"] is not None:
        dx = fns["dgrad"](x, w, dy)
    if fns["wgrad"] is not None:
        dw = fns["wgrad"](x, w, dy)
    return dx, dw, db


def _signature(direction: str, x: Any, w: Any, dy: Any, geo: dict[str, Any]) -> tuple:
    return (direction, x.device.index, str(x.dtype), tuple(x.shape), tuple(x.stride()),
            tuple(w.shape), tuple(w.stride()), tuple(dy.stride()), geo["stride"],
            geo["pads"], geo["dilation"], geo["groups"])


def _chosen(direction: str, x: Any, w: Any, dy: Any, geo: dict[str, Any]
            ) -> Callable[..., Any] | None:
    """The tuned kernel's call when it won (or now wins) this signature's race, else
    ``None`` (cuDNN)."""
    key = _signature(direction, x, w, dy, geo)
    hit = _CHOICES.get(key)
    if hit is not None:
        return hit[1]
    if geo["groups"] != 1:
        return _keep(key, {"impl": "cudnn", "why": "grouped"}, None)
    try:
        from .conv_cutlass import tuned_grad_runner

        tuned, why = tuned_grad_runner(direction, x, w, geo["stride"], geo["pads"],
                                       geo["dilation"])
    except Exception as exc:  # a tuned entry must never break a backward pass
        log.warning("tuned %s lookup failed: %s", direction, exc)
        tuned, why = None, f"{type(exc).__name__}: {exc}"
    if tuned is None:
        return _keep(key, {"impl": "cudnn", "why": why}, None)
    return _race(key, direction, tuned, why, x, w, dy, geo)


def _race(key: tuple, direction: str, tuned: Callable[..., Any], why: str, x: Any, w: Any,
          dy: Any, geo: dict[str, Any]) -> Callable[..., Any] | None:
    from .conv_gemm import CAPTURING, keeps, time_calls, timing_refused
    from .conv_grad import torch_conv_backward

    refused = timing_refused(x.device)
    if refused == CAPTURING:
        return None  # nothing may be timed inside a capture: cuDNN, undecided
    if refused:
        return _keep(key, {"impl": "cudnn", "why": refused}, None)
    needs = (direction == "dgrad", direction == "wgrad", False)
    index = 0 if direction == "dgrad" else 1

    def cudnn() -> Any:
        return torch_conv_backward(x, w, dy, bias=False, needs=needs, **geo)[index]

    library, candidate = time_calls([cudnn, lambda: tuned(x, w, dy)], x.device.index)
    (c_cost, c_gpu, c_host), (t_cost, t_gpu, t_host) = library, candidate
    won = keeps(candidate, library)
    choice = {"impl": "cutlass" if won else "cudnn", "cutlass_kernel": why,
              "cudnn_ms": c_cost, "cudnn_gpu_ms": c_gpu, "cudnn_host_ms": c_host,
              "cutlass_ms": t_cost, "cutlass_gpu_ms": t_gpu, "cutlass_host_ms": t_host}
    log.info("conv %s %s: cudnn %.4f ms, cutlass %.4f ms -> %s", direction, key[3],
             c_cost, t_cost, choice["impl"])
    return _keep(key, choice, tuned if won else None)


def _keep(key: tuple, choice: dict[str, Any], fn: Callable[..., Any] | None
          ) -> Callable[..., Any] | None:
    remember(_CHOICES, key, (choice, fn), MAX_CHOICES, _LOCK)
    return fn
