"""A tuned CUTLASS convolution as a candidate of ``pl.conv``'s race.

:func:`tuned_runner` looks up the tuning database's winner for a problem
(:func:`pyc_lab.autotune_conv` put it there, with cuDNN's time beside it), finds its
library in the kernel cache (never builds: nvcc takes a minute), and returns a function
computing the convolution of torch tensors with it. :mod:`.conv_gemm` times that
function beside cuDNN and the GEMM form on the problem's first call and keeps it only
when it is faster — the never-slower rule of ``pl.matmul``, here with cuDNN as the
library.

What the kernels take: a channels-last input (``torch.channels_last`` for 2-D,
``channels_last_3d`` for 3-D, ``(N, C, L)`` with unit channel stride for 1-D),
``groups == 1``, float16 or bfloat16; float32 as TF32 while
``torch.backends.cudnn.allow_tf32`` allows cuDNN the same, else at float32's accuracy
(a kernel tuned as ``f32``: 3xTF32, CUTLASS 2 only). The winner is of either
family: a Hopper kernel (:mod:`.cutlass.conv`: channel counts multiples of 16 bytes) or,
for the channels TMA cannot load (a stem's three), a CUTLASS 2 kernel
(:mod:`.cutlass.conv_2x`: 1 or 2 spatial axes), whose input and filter a ``pad_to``
configuration zero-pads on each call. The filter is handed over as ``(K, *kernel, C)``:
a filter already in torch's channels-last memory format is read in place, any other is
copied to that order on each call (the race times that copy, and any padding, too).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .arrays import torch_raw_stream
from .memo import remember

__all__ = ["conv_config_of", "conv_problem_key", "grad_call", "kernel_call",
           "tuned_grad_runner", "tuned_runner"]

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_MEMO: dict[tuple, tuple[Any, str]] = {}
MAX_MEMO = 256


def conv_problem_key(geometry: Any, kernel: Any) -> Any:
    """The tuning database's key of a convolution
    (:class:`~pyc_lab.kernels.tuning.keys.ProblemKey`): op ``conv2d_fprop[_bias][_act]``,
    the window as the layout (``ConvGeometry.layout``) and the implicit GEMM's sizes."""
    from .tuning.keys import ProblemKey

    m, n, k = geometry.gemm
    return ProblemKey(kernel.op, kernel.dtype, kernel.dtype, kernel.dtype, geometry.layout,
                      m, n, k)


def conv_config_of(d: dict[str, Any]) -> Any:
    """The configuration a tuning-database entry holds: a CUTLASS 2 one
    (:class:`~.cutlass.conv_2x.Conv2xConfig`, which has warp tiles) or a Hopper one
    (:class:`~.cutlass.conv.ConvConfig`).

    Raises
    ------
    PycLabError
        ``d`` is neither.
    """
    from .cutlass.conv import ConvConfig
    from .cutlass.conv_2x import Conv2xConfig

    return (Conv2xConfig if "warp" in d else ConvConfig).from_dict(d)


def _dtype(x: Any) -> str | None:
    import torch

    if x.dtype == torch.float16:
        return "f16"
    if x.dtype == torch.bfloat16:
        return "bf16"
    if x.dtype == torch.float32:  # TF32 where cuDNN may use it, else float32's accuracy
        return "tf32" if torch.backends.cudnn.allow_tf32 else "f32"
    return None


def _channels_last(x: Any) -> bool:
    """Whether ``x``'s memory is ``(N, *spatial, C)`` contiguous."""
    nd = x.ndim - 2
    return x.permute(0, *range(2, nd + 2), 1).is_contiguous()


def tuned_runner(x: Any, w: Any, b: Any, stride: tuple[int, ...], pads: tuple[int, ...],
                 dilation: tuple[int, ...], activation: str | None = None,
                 residual: bool = False) -> tuple[Callable[..., Any] | None, str]:
    """The tuned CUTLASS kernel for this problem, with ``activation`` (and, where
    ``residual``, a residual's sum) in its epilogue, as ``fn(x, w, b, r=None) -> y`` on
    torch tensors (``y`` channels last, shaped ``(N, K, *out)`` as cuDNN answers; ``r``
    of ``y``'s shape), or ``None`` and why there is none. ``groups`` must be 1 (the
    caller's check)."""
    dtype = _dtype(x)
    if dtype is None:
        return None, f"{x.dtype} is not a CUTLASS convolution dtype"
    if not x.is_cuda or not _channels_last(x) or x.ndim - 2 not in (1, 2, 3):
        return None, "the input is not a channels-last GPU tensor"
    if residual and b is None:
        return None, "CUTLASS residual kernels take a bias"
    from .cutlass.conv import ConvGeometry, ConvKernel

    geometry = ConvGeometry.from_channels_first(x.shape, w.shape, stride, pads, dilation)
    kernel = ConvKernel(dtype, geometry.spatial, b is not None, activation,
                        residual=residual)
    conv, why = _lookup(geometry, kernel, x.device.index)
    return (None, why) if conv is None else (kernel_call(conv, geometry), why)


def _lookup(geometry: Any, kernel: Any, device: int) -> tuple[Any, str]:
    """The loaded winner for ``kernel`` on ``geometry`` (:func:`_find`), remembered per
    problem and tuning-database state, or ``None`` and why; a problem neither family
    takes is refused before the database is asked."""
    from .cutlass.conv_2x import geometry_issue

    why = geometry.issue(kernel)
    if why and geometry_issue(geometry):
        return None, why  # neither family takes it
    from .matmul import db_stamp

    key = (geometry, kernel, device, db_stamp())
    hit = _MEMO.get(key)
    if hit is None:
        hit = _find(geometry, kernel, device)
        remember(_MEMO, key, hit, MAX_MEMO, _LOCK)
    return hit


def tuned_grad_runner(direction: str, x: Any, w: Any, stride: tuple[int, ...],
                      pads: tuple[int, ...], dilation: tuple[int, ...]
                      ) -> tuple[Callable[[Any, Any, Any], Any] | None, str]:
    """The tuned CUTLASS gradient kernel (``direction`` ``"dgrad"`` or ``"wgrad"``) of the
    forward problem ``x (N, C, *spatial)``, ``w (K, C, *kernel)`` (``groups == 1``, the
    caller's check) as ``fn(x, w, dy) -> dx`` or ``-> dw`` on torch tensors (channels-first
    shapes, the result channels last in memory), or ``None`` and why there is none
    (:func:`grad_call`)."""
    dtype = _dtype(x)
    if dtype is None:
        return None, f"{x.dtype} is not a CUTLASS convolution dtype"
    if not x.is_cuda or x.ndim - 2 not in (1, 2, 3):
        return None, "not a GPU tensor of 1-3 spatial axes"
    from .cutlass.conv import ConvGeometry, ConvKernel

    geometry = ConvGeometry.from_channels_first(x.shape, w.shape, stride, pads, dilation)
    kernel = ConvKernel(dtype, geometry.spatial, direction=direction)
    conv, why = _lookup(geometry, kernel, x.device.index)
    return (None, why) if conv is None else (grad_call(conv, geometry), why)


def grad_call(conv: Any, geometry: Any) -> Callable[[Any, Any, Any], Any]:
    """``fn(x, w, dy) -> dx`` (a dgrad kernel) or ``-> dw`` (a wgrad kernel): the gradient
    of the forward problem ``geometry`` computed by a loaded gradient kernel on torch
    tensors of channels-first shapes (``x (N, C, *spatial)``, ``w (K, C, *kernel)``,
    ``dy (N, K, *out)``). The kernel reads its two operands channels last (``dy`` and
    ``w`` for dgrad, ``dy`` and ``x`` for wgrad), copied to that order when they are not
    (part of what the race times); the result is a fresh tensor, channels last in
    memory, of ``x``'s or ``w``'s shape."""
    import torch

    nd = geometry.spatial
    to_last = (0, *range(2, nd + 2), 1)
    to_first = (0, nd + 1, *range(1, nd + 1))
    wgrad = conv.kernel.direction == "wgrad"
    shape = geometry.flt if wgrad else geometry.act

    def run(x: Any, w: Any, dy: Any) -> Any:
        a = dy.permute(*to_last).contiguous()  # itself when already channels last
        b = (x if wgrad else w).permute(*to_last).contiguous()
        out = torch.empty(shape, device=dy.device, dtype=dy.dtype)
        conv.run(geometry, a.data_ptr(), b.data_ptr(), None, out.data_ptr(),
                 torch_raw_stream(dy.device))
        return out.permute(*to_first)

    return run


def _find(geometry: Any, kernel: Any, device: int) -> tuple[Any, str]:
    """The database's winner for the problem, loaded, or ``None`` and why."""
    try:
        from .cutlass.conv import ConvConfig, CutlassConv, cached_conv
        from .cutlass.conv_2x import CutlassConv2x, cached_conv2x, conv2x_widths, padded_geometry
        from .tuning import database
        from .tuning.keys import device_key

        dev, cc, sm_count = device_key(device)
        with database.TuningDB() as db:
            found = db.lookup(dev, conv_problem_key(geometry, kernel))
        if found is None:
            return None, (f"no tuned {kernel.dtype} {kernel.op} kernel for {geometry.gemm} "
                          "on this GPU")
        config = conv_config_of(found.measurement.config)
        c, k = geometry.act[-1], geometry.flt[0]
        if isinstance(config, ConvConfig):
            library, read, why = cached_conv(config, kernel, cc), geometry, ""
        else:
            align, align_out = conv2x_widths(config, kernel, c, k)
            library = cached_conv2x(config, kernel, align, cc, align_out=align_out)
            read = padded_geometry(geometry, config.channels(c))
            why = config.issue(kernel, c, align, k, align_out)
        if library is None:
            return None, (f"the tuned {config.id} is not in the kernel cache; run "
                          "pl.autotune_conv for the problem again")
        conv = CutlassConv(library, config, kernel, sm_count) \
            if isinstance(config, ConvConfig) else \
            CutlassConv2x(library, config, kernel, sm_count, align=align, align_out=align_out)
        if why or not conv.can_implement(read):
            return None, f"the tuned {config.id} ({found.match} match) cannot take it"
        return conv, f"tuned {config.id} ({found.match} match)"
    except Exception as exc:  # a tuned entry must never break a convolution
        log.warning("tuned convolution for %s unusable: %s", geometry, exc)
        return None, f"tuning database: {exc}"


class _PaddedFilters:
    """Filters zero-padded to a ``pad_to`` configuration's channels, kept per filter
    tensor while it lives unchanged: an entry holds a weak reference to the caller's
    tensor (a freed one, whose memory a new tensor may reuse, never matches) and torch's
    version counter of it (which every in-place write, an optimiser step's included,
    bumps), so a call with the same weights pads them once. At most ``limit`` entries,
    the oldest dropped."""

    def __init__(self, limit: int = 8) -> None:
        self._kept: list[tuple[Any, tuple, Any]] = []
        self._limit = limit
        self._lock = threading.Lock()

    def get(self, w: Any, wl: Any, pad: int) -> Any:
        """``wl`` (``w`` channels last) padded by ``pad`` zero channels (outside autograd:
        the kernels read raw pointers, and a kept copy must not hold a graph)."""
        import torch
        import torch.nn.functional as F

        version = (w._version, w.data_ptr(), tuple(w.shape), tuple(w.stride()), w.dtype)
        with self._lock:
            for ref, seen, padded in self._kept:
                if ref() is w and seen == version:
                    return padded
        with torch.no_grad():
            padded = F.pad(wl.detach(), (0, pad))
        with self._lock:
            self._kept = [e for e in self._kept if e[0]() is not None and e[0]() is not w]
            self._kept.append((weakref.ref(w), version, padded))
            del self._kept[:-self._limit]
        return padded


def kernel_call(conv: Any, geometry: Any) -> Callable[..., Any]:
    """``fn(x, w, b, r=None, out=None) -> y``: the convolution of torch tensors by a
    loaded kernel (:class:`~.cutlass.conv.CutlassConv` or
    :class:`~.cutlass.conv_2x.CutlassConv2x`) for ``geometry`` (the caller's problem),
    ``x (N, C, *spatial)`` channels last, ``w (K, C, *kernel)``, ``y (N, K, *out)``
    channels last, written into ``out`` (``(N, *out, K)`` contiguous) when given; ``r``
    (``y``'s shape) the residual a residual kernel adds, copied channels last where it
    is held otherwise. A
    ``pad_to`` configuration reads the input zero-padded to its channels, copied on each
    call (part of what the race times), and the filter padded once while it lives
    unchanged. A kernel that reads pixels outside the filter window
    (:attr:`~.cutlass.conv_2x.Conv2xConfig.reads_outside_window`) runs inside
    :mod:`.conv_guard`'s check and fix-up, which keep its answer exact for NaN and
    infinity without waiting for the GPU (so the call stays capturable).

    The function's ``launch`` attribute is ``(conv, geometry)`` where a call is the
    kernel's launch alone (no padding, no guard): what
    :func:`pyc_lab.kernels.conv_graph.recordable_conv` records into a CUDA graph; else
    ``None``."""
    import torch
    import torch.nn.functional as F

    nd = geometry.spatial
    to_last = (0, *range(2, nd + 2), 1)
    to_first = (0, nd + 1, *range(1, nd + 1))
    out_shape = geometry.out_shape
    pad = getattr(conv.config, "pad_to", 0) - geometry.act[-1]
    guarded = getattr(conv.config, "reads_outside_window", False)
    read = geometry
    if pad > 0:
        from .cutlass.conv_2x import padded_geometry

        read = padded_geometry(geometry, geometry.act[-1] + pad)
    filters = _PaddedFilters() if pad > 0 else None
    activation = conv.kernel.activation

    from . import conv_guard
    from .arrays import cupy_stream

    def run(x: Any, w: Any, b: Any, r: Any = None, out: Any = None) -> Any:
        if b is not None and not b.is_contiguous():
            b = b.contiguous()
        rl = None if r is None else r.permute(*to_last).contiguous()
        xl, wl = x.permute(*to_last), w.permute(*to_last)
        flag = stream = None
        raw = torch_raw_stream(x.device)
        if guarded:  # the check (and the padded copy) in one pass
            stream = cupy_stream(raw, x.device.index)  # looked up once for both launches
            flag, padded = conv_guard.pad_check(xl, read.act[-1], stream)
            xl = padded if padded is not None else xl
        elif pad > 0:
            xl = F.pad(xl, (0, pad))
        if filters is not None:
            wl = filters.get(w, wl, pad)
        elif not wl.is_contiguous():
            wl = wl.contiguous()
        if not xl.is_contiguous():
            xl = xl.contiguous()
        y = out if out is not None else torch.empty(out_shape, device=x.device,
                                                    dtype=x.dtype)
        conv.run(read, xl.data_ptr(), wl.data_ptr(), None if b is None else b.data_ptr(),
                 y.data_ptr(), raw, None if rl is None else rl.data_ptr())
        if flag is not None:  # returns at once unless the input held a NaN or infinity
            conv_guard.fixup(flag, xl, wl, b, y, read, activation, stream)
        return y.permute(*to_first)

    # the kernel and the geometry it reads, for a caller that launches it itself on
    # channels-last operands (a CUDA-graph capture): only where nothing else runs
    # around the launch (no padded copy, no guard)
    run.launch = (conv, read) if pad <= 0 and not guarded else None  # type: ignore[attr-defined]
    return run
