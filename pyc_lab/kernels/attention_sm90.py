"""pyc_lab's own Hopper attention kernel as a candidate of ``pl.attention``.

For torch CUDA tensors (and CuPy arrays, handed over through DLPack) that the kernel
takes (:meth:`~.cutlass.attention.AttnGeometry.issue`: float16/bfloat16, head dimension
64 or 128, no mask other than causal, strides TMA can read), :func:`fused_choice` finds
the kernel — the tuning database's winner for the problem's (dtype, head dimension,
causal, sequence-length bucket), else the default configuration — in the kernel cache
(never builds: nvcc takes a minute; :func:`pyc_lab.autotune_attention` builds and tunes),
and on the problem's first call races it against torch's SDPA on the caller's operands
(:func:`~.blas_direct.race`: interleaved rounds, L2 flushed). The faster is kept for
every later call with the same signature: the never-slower rule of ``pl.matmul``, with
torch's SDPA (cuDNN on the H200) as the library a user would call instead.

When the log-sum-exp is asked for, the kernel computes it in the same pass; there is no
race then (SDPA's public call does not return it).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from .arrays import torch_raw_stream
from .memo import remember

__all__ = [
    "FusedChoice",
    "attention_problem_key",
    "clear",
    "fused_choice",
    "geometry_of",
    "run_fused",
]

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_CHOICES: dict[tuple, FusedChoice] = {}
_KERNELS: dict[tuple, tuple[Any, str]] = {}
MAX_MEMO = 256


@dataclass(frozen=True)
class FusedChoice:
    """What ``pl.attention`` runs for one problem signature, and why."""
    kernel: Any  # a FusedAttention, or None: torch's SDPA
    why: str
    fused_ms: float | None = None
    sdpa_ms: float | None = None
    geometry: Any = None  # the kernel's AttnGeometry when it runs

    @property
    def route(self) -> str:
        """``"pyc-fused"`` or ``"torch-sdpa"``."""
        return "pyc-fused" if self.kernel is not None else "torch-sdpa"


def clear() -> None:
    """Forget every choice and loaded kernel (a new tuning result, or tests)."""
    with _LOCK:
        _CHOICES.clear()
        _KERNELS.clear()


def _dtype(t: Any) -> str | None:
    import torch

    return {torch.float16: "f16", torch.bfloat16: "bf16"}.get(t.dtype)


def geometry_of(q: Any, k: Any, v: Any, o: Any, causal: bool, scale: float) -> Any:
    """The kernel's geometry of ``(B, H, S, D)`` torch views ``q, k, v`` and output ``o``."""
    from .cutlass.attention import AttnGeometry

    b, hq, sq, d = q.shape
    return AttnGeometry(int(b), int(hq), int(k.shape[1]), int(sq), int(k.shape[2]), int(d),
                        tuple(tuple(int(s) for s in t.stride()[:3]) for t in (q, k, v, o)),
                        float(scale), bool(causal))


def attention_problem_key(geometry: Any, dtype: str) -> Any:
    """The tuning database's key of an attention problem
    (:class:`~pyc_lab.kernels.tuning.keys.ProblemKey`): op ``attention_fwd[_causal]``,
    layout ``d<head dim>``, sizes ``(Sq, Sk, B * Hq)``; lookups match the nearest tuned
    problem with every size within a factor of 2 (the sequence bucket)."""
    from .cutlass.attention import AttnKernel
    from .tuning.keys import ProblemKey

    op = AttnKernel(dtype, geometry.head_dim).op(geometry.causal)
    return ProblemKey(op, dtype, dtype, dtype, f"d{geometry.head_dim}", geometry.len_q,
                      geometry.len_k, geometry.batch * geometry.heads_q)


def _find(geometry: Any, dtype: str, device: int) -> tuple[Any, str]:
    """The tuned (else default) kernel for the problem, loaded, or ``None`` and why."""
    try:
        from .cutlass.attention import (
            AttnConfig,
            AttnKernel,
            FusedAttention,
            attention_configs,
            cached_attention,
        )
        from .tuning import database
        from .tuning.keys import device_key

        dev, cc, _ = device_key(device)
        if cc < 90:
            return None, f"pyc_lab's attention kernel is for Hopper; this GPU is sm_{cc}"
        kernel = AttnKernel(dtype, geometry.head_dim)
        with database.TuningDB() as db:
            found = db.lookup(dev, attention_problem_key(geometry, dtype))
        if found is not None:
            config = AttnConfig.from_dict(found.measurement.config)
            how = f"tuned {config.id} ({found.match} match)"
        else:
            config = attention_configs(kernel, geometry.causal)[0]
            how = f"default {config.id} (not tuned for this problem)"
        library = cached_attention(config, kernel, cc)
        if library is None:
            return None, (f"{how} is not in the kernel cache; pl.autotune_attention builds "
                          "and tunes it")
        return FusedAttention(library, config, kernel), how
    except Exception as exc:  # a tuned entry must never break attention
        log.warning("pyc_lab attention kernel unusable for %s: %s", geometry, exc)
        return None, f"pyc_lab kernel unavailable: {exc}"


def _kernel_for(geometry: Any, dtype: str, device: int) -> tuple[Any, str]:
    from .matmul import db_stamp

    key = (geometry.head_dim, geometry.causal, geometry.len_q, geometry.len_k,
           geometry.batch * geometry.heads_q, dtype, device, db_stamp())
    hit = _KERNELS.get(key)
    if hit is None:
        hit = _find(geometry, dtype, device)
        remember(_KERNELS, key, hit, MAX_MEMO, _LOCK)
    return hit


def issue(q: Any, mask: Any) -> str:
    """Why the kernel cannot take these torch operands at all (before their geometry)."""
    if mask is not None:
        return "a mask other than causal (the kernel masks causally only)"
    if not q.is_cuda:
        return "not a CUDA tensor"
    if _dtype(q) is None:
        return f"{q.dtype} (the kernel takes float16 and bfloat16)"
    if q.stride(-1) != 1:
        return "the head dimension is not contiguous"
    return ""


def run_fused(kernel: Any, geometry: Any, q: Any, k: Any, v: Any, o: Any,
              lse: Any = None) -> None:
    """Launch ``kernel`` on torch's current stream of the operands' device (``lse``: a
    float32 ``(B, Hq, Sq)`` contiguous tensor, or ``None``)."""
    kernel.run(geometry, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
               0 if lse is None else lse.data_ptr(),
               torch_raw_stream(q.device))


def fused_choice(q: Any, k: Any, v: Any, o: Any, causal: bool, scale: float, mask: Any,
                 sdpa: Any, *, need_lse: bool = False) -> FusedChoice:
    """What runs this problem: pyc_lab's kernel or torch's SDPA (``sdpa()``), raced on
    the first call of each signature and remembered.

    ``q, k, v`` are ``(B, H, S, D)`` torch views and ``o`` the output view the kernel
    would write. With ``need_lse`` the kernel is taken whenever it can run (no race:
    SDPA's public call has no log-sum-exp).
    """
    why = issue(q, mask)
    if why:
        return FusedChoice(None, why)
    from .matmul import db_stamp

    dtype = _dtype(q)
    geometry = geometry_of(q, k, v, o, causal, scale)
    aligned = all(t.data_ptr() % 16 == 0 for t in (q, k, v, o))
    sig = (geometry, dtype, q.device.index, need_lse, aligned, db_stamp())
    hit = _CHOICES.get(sig)
    if hit is not None:
        return hit
    kernel, how = _kernel_for(geometry, dtype, q.device.index)
    if kernel is None:
        choice = FusedChoice(None, how)
    elif why := geometry.issue(kernel.kernel):
        choice = FusedChoice(None, why)
    elif not aligned:
        choice = FusedChoice(None, "an operand or the output does not start on 16 bytes (TMA)")
    elif need_lse:
        choice = FusedChoice(kernel, f"{how}; the log-sum-exp comes from the same pass",
                             geometry=geometry)
    else:
        choice = _race(kernel, how, geometry, q, k, v, o, sdpa)
    remember(_CHOICES, sig, choice, MAX_MEMO, _LOCK)
    return choice


def _race(kernel: Any, how: str, geometry: Any, q: Any, k: Any, v: Any, o: Any,
          sdpa: Any) -> FusedChoice:
    """Time the kernel against SDPA on the caller's operands; keep the faster."""
    from .blas_direct import race

    stream = torch_raw_stream(q.device)
    try:
        fused_ms, sdpa_ms = race([lambda: run_fused(kernel, geometry, q, k, v, o), sdpa],
                                 stream)
    except Exception as exc:  # no CuPy to time with, or a failed launch: the library
        log.warning("attention race failed: %s", exc)
        return FusedChoice(None, f"the first-call race failed ({exc}); torch SDPA")
    if fused_ms <= sdpa_ms:
        return FusedChoice(kernel, f"{how}: {fused_ms:.4g} ms against torch SDPA's "
                           f"{sdpa_ms:.4g} ms on the first call", fused_ms, sdpa_ms,
                           geometry)
    return FusedChoice(None, f"torch SDPA {sdpa_ms:.4g} ms beat pyc_lab's {how} "
                       f"({fused_ms:.4g} ms) on the first call", fused_ms, sdpa_ms)
