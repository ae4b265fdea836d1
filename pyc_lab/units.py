"""Units shared by every report: byte sizes and arithmetic rates.

One formula each, so that a tuner, a benchmark and a widget never disagree on what a
TFLOP/s figure means.
"""

from __future__ import annotations

__all__ = ["format_bytes", "gemm_flops", "tflops"]


def format_bytes(n: int) -> str:
    """``4096 -> '4 KiB'``, ``2**30 -> '1 GiB'`` (binary units)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            v = n / scale
            return f"{v:g} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def gemm_flops(m: int, n: int, k: int, batch: int = 1) -> float:
    """Floating-point operations of ``batch`` GEMMs of ``m x n x k``: ``2 m n k``."""
    return 2.0 * batch * m * n * k


def tflops(flops: float, ms: float | None) -> float | None:
    """TFLOP/s of ``flops`` operations done in ``ms`` milliseconds (``None`` without a
    positive time)."""
    if not ms or ms <= 0:
        return None
    return flops / (ms * 1e-3) / 1e12
