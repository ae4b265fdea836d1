"""The ``conv`` op: ``pl.conv`` / ``pl.conv1d`` / ``pl.conv2d`` inside ``pl.compile``, as
one node.

A call of ``pl.conv`` on traced values records this node: the compiler installs
:func:`trace_conv` as ``pl.conv``'s tracing hook (:func:`pyc_lab.kernels.conv.set_tracer`;
the kernels layer does not import the compiler). Its shape comes from
:func:`~pyc_lab.kernels.conv.conv_geometry`, the checks ``pl.conv`` makes, so a call that
does not fit fails while tracing with ``pl.conv``'s words. Its reference is ``pl.conv``
itself on the backend's arrays: im2col on NumPy; on a GPU cuDNN, the GEMM form or
pyc_lab's direct kernel, whichever the problem's first call measured fastest — the
direct kernel recorded into the program's CUDA graphs, the libraries run as calls
between them (as ``attention`` is). Inputs: ``x, w[, bias][, residual]``, one dtype;
attributes: per-axis ``stride``, ``padding`` and ``dilation``, ``groups``, ``layout``,
``residual`` (``True`` when the last input is a tensor of the result's shape added after
the bias) and ``activation`` (applied in the same call, after the residual). A residual
block's ``add`` of the convolution and another value of its shape, and a
``relu``/``gelu``/``silu`` after the convolution, are folded into it by
:mod:`.passes.epilogue`. A float32 convolution is exact float32 (cuDNN's TF32 off for
its calls), as the compiler's GEMMs are, unless the traced call passed ``tf32=True``
(attribute ``tf32``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import PycLabError
from ..kernels import conv as _conv
from ..kernels.conv_graph import recordable_conv
from .op_registry import REGISTRY, OpDef, ShapeError, register
from .values import is_traced

__all__ = ["conv_bind", "conv_gemm_recorded", "conv_record", "conv_reference", "trace_conv"]


def _operands(args: Sequence[Any], attrs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """``x, w, bias`` (``None`` when the node has no bias input)."""
    n = len(args) - bool(attrs.get("residual"))
    return args[0], args[1], args[2] if n > 2 else None


def _residual(args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    """The residual input (the last), or ``None``."""
    return args[-1] if attrs.get("residual") else None


def _arguments(args: Sequence[Any], attrs: dict[str, Any]) -> dict[str, Any]:
    """``pl.conv``'s keyword arguments from the node's inputs and attributes."""
    return {"stride": attrs["stride"], "padding": attrs["padding"],
            "dilation": attrs["dilation"], "groups": attrs["groups"],
            "layout": attrs["layout"], "activation": attrs.get("activation"),
            "tf32": bool(attrs.get("tf32", False)), "residual": _residual(args, attrs)}


def conv_reference(xp: Any, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    """The conv op on NumPy or CuPy arrays: ``pl.conv`` (see the module docstring)."""
    return _conv.conv(*_operands(args, attrs), **_arguments(args, attrs))


def conv_bind(xp: Any, args: Sequence[Any], attrs: dict[str, Any],
              out: Any) -> Any:
    """The conv op between CUDA graphs with its operands' torch views made once
    (:func:`pyc_lab.kernels.conv.bound_conv`), or ``None`` (NumPy, or where that does not
    apply)."""
    if xp is np:
        return None
    return _conv.bound_conv(*_operands(args, attrs), out, **_arguments(args, attrs))


def conv_record(xp: Any, args: Sequence[Any], attrs: dict[str, Any], out: Any,
                workspace: tuple[int, int] | None = None) -> Any:
    """The conv op as a call a CUDA graph records (a kernel pyc_lab launches, where the
    problem's first call measured it worth recording: :func:`pyc_lab.kernels.conv_graph.
    recordable_conv`; ``workspace``: the graph program's cuBLAS workspace, for the GEMM
    form), or ``None`` (NumPy, or a problem a library call runs)."""
    if xp is np:
        return None
    return recordable_conv(*_operands(args, attrs), out, **_arguments(args, attrs),
                           workspace=workspace)


def conv_gemm_recorded(attrs: dict[str, Any]) -> bool:
    """Whether the conv's recorded form may be the GEMM form, which issues cuBLAS with
    the graphs' workspace: a channels-last convolution
    (:mod:`pyc_lab.kernels.conv_graph`)."""
    return attrs.get("layout") == "channels_last"


def _shape(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[int, ...]:
    dtypes = {np.dtype(i.dtype) for i in inputs}
    if len(dtypes) != 1:
        raise ShapeError(f"conv: x, w (and bias, residual) must share one dtype, got "
                         f"{sorted(str(d) for d in dtypes)}; cast them first")
    x, w, bias = _operands(inputs, attrs)
    try:
        shape, *_ = _conv.conv_geometry(
            tuple(x.shape), tuple(w.shape), None if bias is None else tuple(bias.shape),
            stride=attrs["stride"], padding=attrs["padding"], dilation=attrs["dilation"],
            groups=attrs["groups"], layout=attrs["layout"])
    except PycLabError as exc:
        raise ShapeError(str(exc)) from None
    residual = _residual(inputs, attrs)
    if residual is not None and tuple(residual.shape) != tuple(shape):
        raise ShapeError(f"conv: residual of shape {tuple(residual.shape)}; it is added to "
                         f"the result, of shape {tuple(shape)} (no broadcasting)")
    return shape


def trace_conv(x: Any, w: Any, bias: Any = None, *, stride: Any = 1, padding: Any = 0,
               dilation: Any = 1, groups: int = 1, layout: str = "channels_first",
               activation: str | None = None, tf32: bool | None = None,
               residual: Any = None) -> Any:
    """Record ``pl.conv(x, w, bias, ...)`` on traced values as one ``conv`` node, its
    arguments resolved per axis now (``padding="same"`` becomes numbers); ``tf32=True``
    is kept as an attribute, anything else is exact float32."""
    traced = next(a for a in (x, w, bias, residual) if is_traced(a))
    _, stride_t, pads, dilation_t = _conv.conv_geometry(
        tuple(x.shape), tuple(w.shape), None if bias is None else tuple(bias.shape),
        stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    args = ((x, w) if bias is None else (x, w, bias)) + \
        (() if residual is None else (residual,))
    attrs = {"stride": stride_t, "padding": pads, "dilation": dilation_t,
             "groups": int(groups), "layout": layout}
    if residual is not None:
        attrs["residual"] = True
    if activation is not None:
        attrs["activation"] = activation
    if tf32:
        attrs["tf32"] = True
    return traced.tracer.op("conv", args, attrs)


if "conv" not in REGISTRY:
    register(OpDef("conv", "conv", None, _shape, conv_reference,
                    dtype=lambda inputs, attrs: np.dtype(inputs[0].dtype),
                    doc="pl.conv's convolution (cross-correlation, torch's semantics)",
                    bind=conv_bind, record=conv_record, record_workspace=conv_gemm_recorded))
_conv.set_tracer(trace_conv)
