"""Array functions NumPy lacks, usable inside and outside compiled functions.

``softmax``, ``layer_norm``, ``relu``, ``gelu`` (tanh approximation), ``sigmoid``,
``silu`` and ``erf`` work on NumPy and CuPy arrays directly and, inside a function being compiled,
each becomes one IR node — so the compiler sees "softmax", not a dozen primitives.
"""

from __future__ import annotations

from typing import Any

from .ops import evaluate
from .proxy import Traced

__all__ = ["erf", "gelu", "layer_norm", "relu", "sigmoid", "silu", "softmax"]


def _xp(*arrays: Any) -> Any:
    for a in arrays:
        if type(a).__module__.startswith("cupy"):
            import cupy

            return cupy
    import numpy

    return numpy


def _apply(op: str, args: tuple, attrs: dict[str, Any]) -> Any:
    traced = next((a for a in args if isinstance(a, Traced)), None)
    if traced is not None:
        return traced.tracer.op(op, args, attrs)
    xp = _xp(*args)
    return evaluate(op, xp, [xp.asarray(a) for a in args], attrs)


def softmax(x: Any, axis: int = -1) -> Any:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis`` (numerically stable)."""
    return _apply("softmax", (x,), {"axis": int(axis)})


def layer_norm(x: Any, gamma: Any = None, beta: Any = None, eps: float = 1e-5) -> Any:
    """Normalise over the last axis to zero mean and unit variance, then scale and shift."""
    args = (x,) if gamma is None else (x, gamma) if beta is None else (x, gamma, beta)
    if gamma is None and beta is not None:
        args = (x, 1.0, beta)
    return _apply("layer_norm", args, {"eps": float(eps), "axis": -1})


def relu(x: Any) -> Any:
    """``max(x, 0)``, NaN propagating like ``np.maximum``."""
    return _apply("relu", (x,), {})


def gelu(x: Any) -> Any:
    """GELU, tanh approximation: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    return _apply("gelu", (x,), {})


def erf(x: Any) -> Any:
    """The error function, as ``scipy.special.erf`` computes it (float32 stays float32;
    other real inputs, float16 included, give float64); one fusable op, CUDA's
    ``erf``/``erff`` on the GPU. ``scipy.special.erf`` inside a compiled function is the
    same op."""
    return _apply("erf", (x,), {})


def sigmoid(x: Any) -> Any:
    """``1 / (1 + exp(-x))``."""
    return _apply("sigmoid", (x,), {})


def silu(x: Any) -> Any:
    """``x * sigmoid(x)``."""
    return _apply("silu", (x,), {})
