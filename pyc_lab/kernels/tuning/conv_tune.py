"""``autotune_conv``: tune pyc_lab's CUTLASS convolutions (forward, dgrad, wgrad) for one
problem, against cuDNN.

The candidates of :class:`~pyc_lab.kernels.tuning.conv_runner.ConvRunner` (Hopper
kernels where TMA can load the channels, CUTLASS 2 kernels where it cannot) go through the
shared :class:`~pyc_lab.search.session.TuningSession` (strategy, budget, seed and
observers as for GEMMs); every candidate, the cuDNN baseline of the same run and the
winner go to the tuning database, where ``pl.conv`` finds the winner and races it
against cuDNN on the problem's first call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..conv import conv_geometry
from ..cutlass.conv import ConvConfig, ConvGeometry
from ..cutlass.conv_2x import Conv2xConfig
from .autotune import tune_runner
from .conv_runner import ConvRunner
from .database import TuningDB
from .options import GemmTuneOptions
from .result import TuneResult

__all__ = ["autotune_conv", "conv_geometry_of"]

#: What a convolution tuning changes from the GEMM tuning's defaults: the space is a
#: few tiles and clusters, so it is searched in rank order, best-ranked first.
CONV_DEFAULTS = {"strategy": "exhaustive", "max_candidates": 6}


def conv_geometry_of(x_shape: Sequence[int], w_shape: Sequence[int], *, stride: Any = 1,
                     padding: Any = 0, dilation: Any = 1,
                     layout: str = "channels_first") -> ConvGeometry:
    """The kernels' geometry of a ``pl.conv`` problem given as shapes (checked as
    ``pl.conv`` checks them, with ``groups=1``: CUTLASS's convolutions are not grouped,
    and ``pl.conv`` runs grouped ones on cuDNN)."""
    x_shape, w_shape = tuple(int(v) for v in x_shape), tuple(int(v) for v in w_shape)
    _, stride_t, pads, dilation_t = conv_geometry(x_shape, w_shape, None, stride=stride,
                                                  padding=padding, dilation=dilation,
                                                  layout=layout)
    if layout == "channels_last":
        x_shape = (x_shape[0], x_shape[-1], *x_shape[1:-1])
    return ConvGeometry.from_channels_first(x_shape, w_shape, stride_t, pads, dilation_t)


def autotune_conv(x_shape: Sequence[int], w_shape: Sequence[int], *, stride: Any = 1,
                  padding: Any = 0, dilation: Any = 1, layout: str = "channels_first",
                  options: GemmTuneOptions | None = None,
                  restrict: Callable[[ConvConfig | Conv2xConfig], bool] | None = None,
                  db: TuningDB | None = None,
                  cache: Any = None, observer: Callable[[dict[str, Any]], None] | None = None,
                  stop: threading.Event | None = None, direction: str = "fprop",
                  residual: bool = False, **settings: Any) -> TuneResult:
    """Tune a convolution (the forward one, or one of its gradients) on this GPU and
    record the result.

    Parameters
    ----------
    x_shape, w_shape
        The problem as ``pl.conv`` takes it: ``x (N, C, *spatial)`` (or
        ``(N, *spatial, C)`` with ``layout="channels_last"``), ``w (K, C, *kernel)``.
        The kernels read the activations channels last; ``pl.conv`` offers them for
        channels-last inputs. Channels TMA cannot load (not a multiple of 16 bytes, e.g.
        an RGB stem's 3) are tuned over CUTLASS 2 kernels (1-D and 2-D problems), with
        the input zero-padded to a power of two as one more candidate.
    stride, padding, dilation
        As for ``pl.conv``.
    options, **settings
        A :class:`~pyc_lab.kernels.tuning.options.GemmTuneOptions` and fields over it:
        ``dtype`` (``"f16"``, ``"bf16"``, ``"tf32"`` or ``"f32"``: float32 at its own
        accuracy, 3xTF32 CUTLASS 2 kernels against cuDNN with TF32 off), ``bias``,
        ``activation``, ``strategy`` (default ``"exhaustive"``), ``budget_s``, ``max_candidates``
        (default 6), ``repeats``, ``seed``, ``workers``, ``hang_s``.
    restrict
        ``restrict(config) -> bool``: only configurations it accepts are considered
        (before the ``max_candidates`` cut).
    db, cache
        Tuning database and kernel cache (the user's by default).
    observer, stop
        As for :func:`~pyc_lab.kernels.tuning.autotune.autotune_gemm`.
    direction
        ``"fprop"`` (the default), or a gradient of the forward problem the shapes give:
        ``"dgrad"`` (the input's, ``dy, w -> dx``) or ``"wgrad"`` (the filter's,
        ``dy, x -> dw``), which ``pl.conv``'s backward races against cuDNN's. Gradients
        take no bias or activation; their candidates are the Hopper kernels where they
        take the problem (dgrad: unit strides) and CUTLASS 2 kernels (strided dgrad;
        wgrad with split-K), and the baseline is torch's ``convolution_backward``.
    residual
        Tune kernels that add a residual of the output's shape after the bias and before
        the activation (``pl.conv(..., residual=r)``; needs ``bias=True``): CUTLASS 2
        kernels, whose epilogue reads it, against cuDNN followed by torch's add.

    Returns
    -------
    TuneResult
        ``.best`` (the fastest correct CUTLASS configuration), ``.table``,
        ``.baselines`` (``{"cudnn": ms}``), ``.speedup`` against cuDNN.

    Raises
    ------
    PycLabError
        No GPU or torch, not Hopper, no nvcc, a grouped convolution, a 3-D problem with
        channels TMA cannot load, or a bad setting.
    """
    merged = {**{k: v for k, v in CONV_DEFAULTS.items() if options is None}, **settings}
    opts = GemmTuneOptions.resolve(options, merged)
    geometry = conv_geometry_of(x_shape, w_shape, stride=stride, padding=padding,
                                dilation=dilation, layout=layout)
    t_start = time.perf_counter()
    runner = ConvRunner(geometry, opts, restrict=restrict, cache=cache, direction=direction,
                        residual=residual)
    return tune_runner(runner, opts, observer, stop, db, t_start)

