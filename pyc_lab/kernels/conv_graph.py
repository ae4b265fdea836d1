"""Convolutions as calls a CUDA graph records.

A compiled program's CUDA graphs (:mod:`pyc_lab.compiler.backend.graphs`) record a
convolution when a form of it can be launched on fixed device addresses with nothing done
on the host around the launch:

- pyc_lab's direct kernel (:mod:`.conv_direct`), which reads its input through strides
  and writes a channels-first result (for a channels-last output, into a scratch array
  of the graph, then copied across in the same graph);
- the tuned CUTLASS kernel of the problem (:func:`.conv_gemm.tuned_launch_for_cupy`),
  for a contiguous channels-last input, after a copy of the filter into the
  ``(O, *kernel, C)`` order it reads (in the graph too: a filter given as an input may
  change between replays). A kernel that needs a workspace is not recorded (its
  workspace belongs to the kernel object, which serves other problems too).

cuDNN and the GEMM form run through torch and are not recorded: they run between
graphs. Which form a graph gets is :func:`.conv_gemm.graph_choice` of what the problem's
first-call race measured: a recorded form costs its GPU time alone, a call between
graphs its GPU time plus its host time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from . import arrays, conv_direct, conv_gemm
from .conv import LAYOUTS, _to_first, conv_geometry, conv_route
from .conv_library import tf32_allowed

__all__ = ["recordable_conv"]


def recordable_conv(x: Any, w: Any, bias: Any, out: Any, *, stride: Any = 1,
                    padding: Any = 0, dilation: Any = 1, groups: int = 1,
                    layout: str = "channels_first", activation: str | None = None,
                    tf32: bool | None = None) -> Callable[[], None] | None:
    """A call computing ``pl.conv(x, w, bias, ...)`` into ``out`` that a CUDA-graph
    capture can record, or ``None`` where the problem's form in a graph is a library call
    between graphs (:func:`.conv_gemm.graph_choice`), the problem was not raced yet, or
    the operands do not suit (not CuPy arrays; ``out``, the filter or the bias not
    contiguous; ``out`` of another dtype): the caller then runs it between graphs.

    The race consulted is the problem's with ``activation`` or without one (the race
    ``pl.inference``'s import runs before the activation is folded in); the recorded
    kernel applies ``activation`` in its epilogue. A channels-last problem is the
    channels-first view of its arrays, as :func:`.conv.conv` hands it to the race.
    Nothing is launched, timed or exchanged with torch here (a CUDA-graph capture may be
    under way)."""
    if arrays.kind(x) != "cupy" or layout not in LAYOUTS or conv_route(x) != "cudnn":
        return None
    if out.dtype != x.dtype or not out.flags.c_contiguous or not w.flags.c_contiguous \
            or (bias is not None and not bias.flags.c_contiguous):
        return None
    _, stride_t, pads, dilation_t = conv_geometry(
        tuple(x.shape), tuple(w.shape), None if bias is None else tuple(bias.shape),
        stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    nd = len(w.shape) - 2
    last = layout == "channels_last"
    first, out_first = (_to_first(x, nd), _to_first(out, nd)) if last else (x, out)
    keys = (activation, None) if activation is not None else (None,)
    problem = (stride_t, pads, dilation_t, groups)
    for key in keys:
        with tf32_allowed(tf32):  # the race that decided ran under this setting
            choice = conv_gemm.choice_for_cupy(first, w, bias, *problem, key)
            tuned = None
            if last and x.flags.c_contiguous and key == activation:
                tuned = conv_gemm.tuned_launch_for_cupy(first, w, bias, *problem, key)
        if choice is None:
            continue
        forms = {"direct": lambda: _direct(first, w, bias, out_first, problem, activation)}
        if tuned is not None and not tuned[0].workspace_bytes(tuned[1]):
            forms["cutlass"] = functools.partial(_tuned, x, w, bias, out, tuned)
        pick = conv_gemm.graph_choice(choice, forms)
        call = forms[pick]() if pick is not None else None
        if call is not None:
            return call
    return None


def _direct(x: Any, w: Any, bias: Any, out: Any, problem: tuple[Any, ...],
            activation: str | None) -> Callable[[], None] | None:
    """The direct kernel of channels-first ``x`` (any strides) into ``out``: in place
    where ``out`` is contiguous, else into a scratch array of the graph copied into it
    (``out`` a channels-last array viewed channels first); ``None`` for a problem the
    kernel does not take."""
    import cupy as cp

    item = x.dtype.itemsize
    geo = conv_direct.geometry(tuple(x.shape), tuple(s // item for s in x.strides),
                               tuple(w.shape), *problem)
    if geo is None or x.dtype.name not in conv_direct.KINDS:
        return None
    device = x.device.id
    launch = conv_direct.launcher(conv_direct.KINDS[x.dtype.name], geo, device, activation,
                                  conv_direct.sm_count(device))
    target = out if out.flags.c_contiguous else cp.empty(out.shape, dtype=out.dtype)
    ptrs = (x.data.ptr, w.data.ptr, 0 if bias is None else bias.data.ptr, target.data.ptr)
    if target is out:
        def call() -> None:
            launch(*ptrs, cp.cuda.get_current_stream())
    else:
        def call() -> None:
            launch(*ptrs, cp.cuda.get_current_stream())
            cp.copyto(out, target)

    return call  # holds the scratch array: the graph's program keeps the call


def _tuned(x: Any, w: Any, bias: Any, out: Any,
           tuned: tuple[Any, Any]) -> Callable[[], None]:
    """The tuned CUTLASS kernel ``(conv, geometry)`` of a contiguous channels-last ``x``
    into ``out``, launched on CuPy's current stream after the filter is copied into the
    ``(O, *kernel, C)`` order the kernel reads."""
    import cupy as cp

    nd = len(w.shape) - 2
    kernel, geometry = tuned
    w_last = cp.empty((w.shape[0], *w.shape[2:], w.shape[1]), dtype=w.dtype)
    w_view = w.transpose(0, *range(2, nd + 2), 1)
    ptrs = (x.data.ptr, w_last.data.ptr, None if bias is None else bias.data.ptr,
            out.data.ptr)

    def call() -> None:
        cp.copyto(w_last, w_view)
        kernel.run(geometry, ptrs[0], ptrs[1], ptrs[2], ptrs[3],
                   cp.cuda.get_current_stream().ptr)

    return call  # holds w_last: the graph's program keeps the call, so the copy lives on
