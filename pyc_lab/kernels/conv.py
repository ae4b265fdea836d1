"""``pl.conv`` / ``pl.conv1d`` / ``pl.conv2d``: convolutions on NumPy, CuPy and torch arrays.

Cross-correlation as deep-learning frameworks define it (``torch.nn.functional.conv2d``'s
semantics): input ``(N, C, *spatial)`` and weights ``(O, C // groups, *kernel)`` in the
channels-first layout, or ``(N, *spatial, C)`` input and output with
``layout="channels_last"`` (the weights stay ``(O, C // groups, *kernel)``); stride,
zero padding (symmetric per axis, or ``"valid"`` / ``"same"``), dilation, groups
(depthwise when ``groups == C``) and a bias. On a GPU the work goes to the convolution
library a user would otherwise call, cuDNN through torch's ``conv1d``/``conv2d``/
``conv3d`` in its benchmark mode, or, where the problem's first call measured it
faster, to the same convolution as one cuBLAS GEMM over its patches
(:mod:`.conv_gemm`); CuPy arrays travel through DLPack without copies, on CuPy's
current stream. Elsewhere it is im2col and one matrix product per group
(:mod:`.conv_im2col`, float32 arithmetic for 16-bit inputs). :func:`conv_route` names
the path. Where ``pl.autotune_conv`` has tuned one of pyc_lab's own CUTLASS 3
convolutions for the problem (channels-last input, ``groups == 1``), it is a third
candidate of the first call's race (:mod:`.conv_cutlass`), kept only when it beats cuDNN.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..checks import is_whole
from ..errors import PycLabError
from . import arrays, conv_gemm
from .conv_im2col import conv_im2col, out_size
from .conv_library import tf32_allowed, tf32_now, torch_activation
from .matmul_launch import apply_epilogue
from .memo import remember

__all__ = ["ACTIVATIONS", "LAYOUTS", "bound_conv", "conv", "conv1d", "conv2d", "conv_backward",
           "conv_geometry", "conv_route", "direct_in_graph", "set_tracer",
           "torch_activation"]

log = logging.getLogger(__name__)

#: Where the channels are: after the batch axis, or last.
LAYOUTS = ("channels_first", "channels_last")
_DTYPES = ("float16", "bfloat16", "float32", "float64")
#: Activations applied to the convolution's result (bias included) in the same call —
#: the ones ``pl.matmul``'s epilogues take (gelu is the tanh form).
ACTIVATIONS = ("relu", "gelu", "silu")
#: Checked calls kept (oldest dropped first): a GPU call of a known key skips its checks.
MAX_PLANS = 512
_LOCK = threading.Lock()
_PLANS: dict[tuple, Callable[[Any, Any, Any], Any]] = {}
#: How a call on values ``pl.compile`` is tracing is recorded (set by the compiler, which
#: this layer does not import): ``fn(x, w, bias, **arguments) -> traced result``.
_TRACE: Callable[..., Any] | None = None


def set_tracer(fn: Callable[..., Any] | None) -> None:
    """Install how ``pl.conv`` on traced values becomes a node (the compiler's hook)."""
    global _TRACE
    _TRACE = fn


def _per_axis(value: int | Sequence[int], nd: int, name: str) -> tuple[int, ...]:
    """``value`` for each of the ``nd`` spatial axes: one whole number for all, or one per
    axis (anything else, a float or a string, is refused)."""
    if is_whole(value):
        vals = (int(value),) * nd
    elif isinstance(value, (tuple, list)) and all(is_whole(v) for v in value):
        vals = tuple(int(v) for v in value)
    else:
        raise PycLabError(f"pl.conv: {name} must be a whole number or a tuple of one per "
                          f"spatial axis, got {value!r}")
    if len(vals) != nd:
        raise PycLabError(f"pl.conv: {name} {value!r} has {len(vals)} entries for {nd} "
                          "spatial axes")
    return vals


def _padding(padding: Any, nd: int, kernel: tuple[int, ...], stride: tuple[int, ...],
             dilation: tuple[int, ...]) -> tuple[int, ...]:
    """Per-axis zero padding at both ends (``"same"``: the input's size at stride 1)."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0,) * nd
        if padding != "same":
            raise PycLabError(f"pl.conv: padding {padding!r} is not 'valid', 'same' or "
                              "numbers")
        if any(s != 1 for s in stride):
            raise PycLabError("pl.conv: padding='same' needs stride 1 (as torch's)")
        total = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
        if any(t % 2 for t in total):
            raise PycLabError("pl.conv: padding='same' with an even dilated kernel needs "
                              "unequal ends; give the padding per axis")
        return tuple(t // 2 for t in total)
    pads = _per_axis(padding, nd, "padding")
    if any(p < 0 for p in pads):
        raise PycLabError(f"pl.conv: negative padding {padding!r}")
    return pads


def conv_route(x: Any) -> str:
    """``"cudnn"`` (torch's convolution on a GPU tensor, or a CuPy array through DLPack
    where torch is installed: cuDNN, or the GEMM form where it raced faster, see
    :func:`.conv_gemm.choices`) or ``"im2col"`` (NumPy, or CuPy without torch)."""
    kind = arrays.kind(x)
    if kind == "torch":
        return "cudnn" if x.is_cuda else "im2col"
    if kind == "cupy":
        return "cudnn" if arrays.torch_installed() else "im2col"
    return "im2col"


def conv(x: Any, w: Any, bias: Any = None, *, stride: int | Sequence[int] = 1,
         padding: int | Sequence[int] | str = 0, dilation: int | Sequence[int] = 1,
         groups: int = 1, layout: str = "channels_first",
         activation: str | None = None, tf32: bool | None = None,
         residual: Any = None) -> Any:
    """N-D convolution (cross-correlation, as torch's ``conv*d``).

    Parameters
    ----------
    x : NumPy array, CuPy array or torch tensor
        ``(N, C, *spatial)``; ``(N, *spatial, C)`` with ``layout="channels_last"``.
    w : array of the same kind and dtype
        ``(O, C // groups, *kernel)``.
    bias : array, optional
        ``(O,)``.
    stride, dilation : int or sequence
        Per spatial axis (one number: every axis).
    padding : int, sequence, "valid" or "same"
        Zeros added at both ends of each spatial axis.
    groups : int
        Channel groups (``C`` and ``O`` multiples of it).
    layout : {"channels_first", "channels_last"}
        Where ``x``'s and the result's channels are.
    activation : {None, "relu", "gelu", "silu"}
        Applied to the result (after the bias and the residual) in the same call: on a
        GPU to the library's output before it is handed back, on the CPU in float32
        before the result is rounded to ``x``'s dtype. gelu is the tanh form, as
        ``pl.matmul``'s.
    residual : array, optional
        Of the result's shape (in ``layout``), kind and dtype: added after the bias and
        before the activation, ``act(conv(x, w) + bias + residual)`` — a residual
        block's sum in the same call. A tuned CUTLASS kernel built with the residual in
        its epilogue reads it there (one pass over the result instead of three); every
        other path adds it to the result (in float32 on the CPU, as the activation).
        Torch tensors that require gradients get the residual's gradient from autograd.
    tf32 : bool, optional
        Whether a float32 convolution may be computed in TF32 (10-bit mantissas: about
        5e-4 relative error, several times faster) by cuDNN or by the GEMM form's
        matrix product. ``None`` (the default) follows torch's settings, as torch's
        ``conv2d`` does (``torch.backends.cudnn.allow_tf32``, on unless the user turned
        it off); ``False`` is exact float32 (what ``pl.compile`` and imported models
        ask for); ``True`` allows TF32. Other dtypes, the CPU and pyc_lab's own kernels
        are unaffected.

    Returns
    -------
    array
        ``(N, O, *out)`` (or ``(N, *out, O)``) in ``x``'s dtype and kind.

    Raises
    ------
    PycLabError
        Mixed kinds or dtypes, shapes that do not fit, a window larger than the padded
        input, an unknown layout or padding, a residual not of the result's shape.
    """
    if activation is not None and activation not in ACTIVATIONS:
        raise PycLabError(f"pl.conv: activation {activation!r} is not one of "
                          f"{ACTIVATIONS} (or None)")
    if _TRACE is not None and any(getattr(type(a), "__pyc_traced__", False)
                                  for a in (x, w, bias, residual)):
        return _TRACE(x, w, bias, stride=stride, padding=padding, dilation=dilation,
                      groups=groups, layout=layout, activation=activation, tf32=tf32,
                      residual=residual)
    if tf32 is not None and arrays.kind(x) != "numpy":
        with tf32_allowed(tf32):
            return conv(x, w, bias, stride=stride, padding=padding, dilation=dilation,
                        groups=groups, layout=layout, activation=activation,
                        residual=residual)
    if arrays.kind(x) == "torch" and any(getattr(a, "requires_grad", False)
                                         for a in (x, w, bias, residual)):
        return _with_grad(x, w, bias, stride, padding, dilation, groups, layout, activation,
                          residual)
    key = _plan_key(x, w, bias, stride, padding, dilation, groups, layout, activation,
                    residual)
    try:
        plan = _PLANS.get(key) if key is not None else None
    except TypeError:  # arguments that are not hashable (a list of strides): checked each call
        key = plan = None
    if plan is None:
        plan, final = _plan(x, w, bias, stride, padding, dilation, groups, layout,
                            activation, residual)
        if key is not None and final:
            remember(_PLANS, key, plan, MAX_PLANS, _LOCK)
    return plan(x, w, bias, residual)


def _plan_key(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
              groups: Any, layout: Any, activation: Any = None,
              residual: Any = None) -> tuple | None:
    """What a GPU call's checks and choices depend on — every operand's type, dtype,
    device, shape and strides, and the arguments — or ``None`` where nothing is kept
    (NumPy: the im2col work dwarfs the checks)."""
    tx = type(x)
    if tx is not type(w) or any(a is not None and type(a) is not tx
                                for a in (bias, residual)):
        return None
    kind = arrays.kind(x)
    if kind == "torch":
        b, r = ((None if a is None else (a.dtype, a.get_device(), a.shape, a.stride()))
                for a in (bias, residual))
        return (tx, x.dtype, x.get_device(), x.shape, x.stride(), w.dtype, w.get_device(),
                w.shape, w.stride(), b, r, stride, padding, dilation, groups, layout,
                activation, tf32_now())
    if kind == "cupy":
        b, r = ((None if a is None else (a.dtype, a.device.id, a.shape, a.strides))
                for a in (bias, residual))
        return (tx, x.dtype, x.device.id, x.shape, x.strides, w.dtype, w.device.id, w.shape,
                w.strides, b, r, stride, padding, dilation, groups, layout, activation,
                tf32_now())
    return None


def conv_geometry(x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                  bias_shape: tuple[int, ...] | None, *, stride: Any = 1, padding: Any = 0,
                  dilation: Any = 1, groups: int = 1, layout: str = "channels_first",
                  ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...],
                             tuple[int, ...]]:
    """Check a convolution's shapes and arguments: the result's shape (in ``layout``) and
    the per-axis stride, padding and dilation — what :func:`conv` checks of its operands,
    and what ``pl.compile`` infers for a traced ``pl.conv``.

    Raises
    ------
    PycLabError
        Shapes that do not fit, bad arguments (see :func:`conv`).
    """
    if layout not in LAYOUTS:
        raise PycLabError(f"pl.conv: layout {layout!r} is not one of {LAYOUTS}")
    nd = len(w_shape) - 2
    if nd < 1 or len(x_shape) != nd + 2:
        raise PycLabError(f"pl.conv: x has shape {x_shape} and w {w_shape}; x needs the "
                          "batch, channel and as many spatial axes as w")
    if layout == "channels_last":
        x_shape = (x_shape[0], x_shape[-1], *x_shape[1:-1])
    c, o = int(x_shape[1]), int(w_shape[0])
    if not is_whole(groups):
        raise PycLabError(f"pl.conv: groups must be a whole number, got {groups!r}")
    if groups < 1 or c % groups or o % groups or int(w_shape[1]) * groups != c:
        raise PycLabError(f"pl.conv: {c} input channels, weights {w_shape} and "
                          f"groups={groups} do not fit (w must be (O, C // groups, ...))")
    if bias_shape is not None and tuple(bias_shape) != (o,):
        raise PycLabError(f"pl.conv: bias has shape {tuple(bias_shape)}, expected ({o},)")
    kernel = tuple(int(k) for k in w_shape[2:])
    stride_t = _per_axis(stride, nd, "stride")
    dilation_t = _per_axis(dilation, nd, "dilation")
    if any(s < 1 for s in stride_t) or any(d < 1 for d in dilation_t):
        raise PycLabError("pl.conv: stride and dilation must be positive")
    pads = _padding(padding, nd, kernel, stride_t, dilation_t)
    spatial = tuple(int(s) for s in x_shape[2:])
    out = tuple(out_size(n + 2 * p, k, s, d) for n, p, k, s, d
                in zip(spatial, pads, kernel, stride_t, dilation_t, strict=True))
    if any(n <= 0 for n in out):
        raise PycLabError(f"pl.conv: the window {kernel} (dilation {dilation_t}) does not "
                          f"fit the input's spatial shape {spatial} padded by {pads}")
    shape = (int(x_shape[0]), o, *out) if layout == "channels_first" \
        else (int(x_shape[0]), *out, o)
    return shape, stride_t, pads, dilation_t


def _check_operands(x: Any, w: Any, bias: Any, residual: Any = None) -> None:
    """Arrays of one kind, device and floating dtype, or a clear error."""
    named = [("x", x), ("w", w)] + ([("residual", residual)] if residual is not None else [])
    for name, a in named:
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise PycLabError(f"pl.conv: {name} is a {type(a).__name__}, not an array")
    parts = [a for a in (x, w, bias, residual) if a is not None]
    if len({arrays.kind(a) for a in parts}) != 1:
        raise PycLabError("pl.conv: x, w (and bias, residual) are of different array types")
    if arrays.kind(x) in ("torch", "cupy") and len({str(a.device) for a in parts}) != 1:
        raise PycLabError(f"pl.conv: x, w (and bias, residual) are on different devices "
                          f"({', '.join(str(a.device) for a in parts)}); move them to one")
    names = {arrays.dtype_name(a.dtype) for a in parts}
    if len(names) != 1 or next(iter(names)) not in _DTYPES:
        raise PycLabError(f"pl.conv: dtypes {sorted(names)}; x, w, bias and residual take "
                          f"one of {_DTYPES}")


def _check_residual(residual: Any, shape: tuple[int, ...]) -> None:
    """A residual of the result's ``shape``, or a clear error."""
    if residual is not None and tuple(residual.shape) != tuple(shape):
        raise PycLabError(f"pl.conv: residual has shape {tuple(residual.shape)}; it is added "
                          f"to the result, of shape {tuple(shape)} (no broadcasting)")


def _plan(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
          groups: int, layout: str, activation: str | None = None,
          residual: Any = None) -> tuple[Callable[..., Any], bool]:
    """Check a call and make the function that runs it: ``(plan, final)``, ``plan(x, w,
    bias, residual)`` for every call of the same key (:func:`_plan_key`), ``final``
    whether it may be kept (not while the GPU's choice for the problem is still open).

    Raises
    ------
    PycLabError
        See :func:`conv`.
    """
    _check_operands(x, w, bias, residual)
    kind = arrays.kind(x)
    shape, stride_t, pads, dilation_t = conv_geometry(
        tuple(x.shape), tuple(w.shape), None if bias is None else tuple(bias.shape),
        stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    _check_residual(residual, shape)
    nd = len(w.shape) - 2
    if layout == "channels_last":  # raced (on a GPU) and run as the kernels see it
        x = _to_first(x, nd)
        residual = None if residual is None else _to_first(residual, nd)
    route = conv_route(x)
    final = True
    if route == "cudnn" and nd <= 3:
        if kind == "torch":
            run, final = conv_gemm.prepare(x, w, bias, stride_t, pads, dilation_t, groups,
                                           activation, residual)
        else:
            run = functools.partial(_through_torch, stride=stride_t, pads=pads,
                                    dilation=dilation_t, groups=groups, activation=activation)
    else:
        def run(x: Any, w: Any, bias: Any, r: Any = None) -> Any:
            return _im2col(kind, x, w, bias, stride_t, pads, dilation_t, groups, activation,
                           r)
    if layout != "channels_last":
        return run, final
    to_first = (0, nd + 1, *range(1, nd + 1))
    to_last = (0, *range(2, nd + 2), 1)
    if kind == "torch":
        def plan(x: Any, w: Any, bias: Any, r: Any = None) -> Any:
            return run(x.permute(*to_first), w, bias,
                       None if r is None else r.permute(*to_first)).permute(*to_last)
    else:
        def plan(x: Any, w: Any, bias: Any, r: Any = None) -> Any:
            return run(x.transpose(to_first), w, bias,
                       None if r is None else r.transpose(to_first)).transpose(to_last)
    return plan, final


def _through_torch(x: Any, w: Any, bias: Any, r: Any = None, *, stride: tuple[int, ...],
                   pads: tuple[int, ...], dilation: tuple[int, ...], groups: int,
                   activation: str | None = None) -> Any:
    """CuPy arrays through DLPack (no copies) to torch on CuPy's current stream."""
    import cupy as cp
    import torch

    with torch.cuda.stream(arrays.torch_stream_of_cupy()):
        y = conv_gemm.run(
            *(torch.from_dlpack(a) if a is not None else None for a in (x, w, bias)),
            stride, pads, dilation, groups, activation,
            None if r is None else torch.from_dlpack(r))
        return cp.from_dlpack(y)


def bound_conv(x: Any, w: Any, bias: Any, out: Any, *, stride: Any = 1, padding: Any = 0,
               dilation: Any = 1, groups: int = 1, layout: str = "channels_first",
               activation: str | None = None, tf32: bool | None = None,
               residual: Any = None) -> Callable[[], None] | None:
    """A call computing ``pl.conv(x, w, bias, ..., residual=residual)`` into ``out``, for
    CuPy arrays that keep their addresses between calls (a CUDA-graph replay program's
    static arrays).

    The torch views of the operands and of ``out`` (DLPack) and the problem's choice
    (cuDNN or the GEMM form) are made once here; each call issues the convolution on
    CuPy's current stream and copies its result into ``out``. ``None`` where that does
    not apply — not CuPy arrays, no torch, a CUDA-graph capture under way, or ``out``
    of another dtype or not contiguous: the caller then calls :func:`conv` each time.
    Channels-last operands are viewed channels first (no copy), as :func:`conv` hands
    them to the race. A problem seen for the first time is raced here (call
    :func:`conv` once first to race it elsewhere).
    """
    if arrays.kind(x) != "cupy" or layout not in LAYOUTS or conv_route(x) != "cudnn":
        return None
    _, stride_t, pads, dilation_t = conv_geometry(
        tuple(x.shape), tuple(w.shape), None if bias is None else tuple(bias.shape),
        stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    nd = len(w.shape) - 2
    if nd > 3 or out.dtype != x.dtype or not out.flags.c_contiguous:
        return None
    import torch

    xt, wt, ot = (torch.from_dlpack(a) for a in (x, w, out))
    bt, rt = (None if a is None else torch.from_dlpack(a) for a in (bias, residual))
    if layout == "channels_last":  # viewed channels first, as the race saw them
        xt, ot = _to_first(xt, nd), _to_first(ot, nd)
        rt = None if rt is None else _to_first(rt, nd)
    with tf32_allowed(tf32):
        run, final = conv_gemm.prepare(xt, wt, bt, stride_t, pads, dilation_t, groups,
                                       activation, rt)
    if not final:
        return None
    # a residual no kernel reads: the convolution alone, then the sum written into the
    # output (no copy of a summed result across)
    plain = getattr(run, "unfused", None)
    stream_of_cupy = arrays.torch_stream_of_cupy

    def call() -> None:
        with tf32_allowed(tf32), torch.cuda.stream(stream_of_cupy()):
            y = run(xt, wt, bt, rt) if plain is None else plain(xt, wt, bt)
            if tuple(y.shape) != tuple(ot.shape):
                raise PycLabError(f"pl.conv: a bound call gave shape {tuple(y.shape)}, "
                                  f"its output is {tuple(ot.shape)}")
            if plain is None:
                ot.copy_(y)
            else:
                torch.add(y, rt, out=ot)
                torch_activation(ot, activation)

    return call


def direct_in_graph(x_shape: Sequence[int], w_shape: Sequence[int], dtype: str, *,
                    stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                    groups: int = 1, bias: bool = True, tf32: bool | None = None) -> bool:
    """Whether a CUDA graph would record pyc_lab's direct kernel for this channels-first
    problem (:func:`.conv_gemm.records_direct`), raced now on random CuPy arrays of its
    shapes if it was not before; ``False`` without a GPU, CuPy or torch, or for a problem
    the race does not time the kernel on."""
    from ..hardware.device import no_gpu_reason

    if not arrays.torch_installed() or no_gpu_reason() is not None:
        return False
    import cupy as cp

    args = {"stride": tuple(stride), "padding": tuple(padding), "dilation": tuple(dilation),
            "groups": int(groups)}
    try:
        rng = cp.random.default_rng(0)
        x = rng.standard_normal(tuple(x_shape), dtype=cp.float32).astype(dtype)
        w = rng.standard_normal(tuple(w_shape), dtype=cp.float32).astype(dtype)
        b = rng.standard_normal((int(w_shape[0]),), dtype=cp.float32).astype(dtype) \
            if bias else None
        conv(x, w, b, **args, tf32=tf32)
    except Exception as exc:  # a race that cannot run leaves the problem to im2col
        log.warning("direct convolution not raced for %s x %s: %s", tuple(x_shape),
                    tuple(w_shape), exc)
        return False
    with tf32_allowed(tf32):
        choice = conv_gemm.choice_for_cupy(x, w, b, args["stride"], args["padding"],
                                           args["dilation"], args["groups"])
    return choice is not None and conv_gemm.records_direct(choice)


def _im2col(kind: str, x: Any, w: Any, bias: Any, stride: tuple[int, ...],
            pads: tuple[int, ...], dilation: tuple[int, ...], groups: int,
            activation: str | None = None, residual: Any = None) -> Any:
    """The im2col path (the residual and the activation) in float32 (float64 for
    float64), cast back to ``x``'s dtype."""
    if kind == "torch":
        out = _im2col("numpy", *(arrays.host_of(a) for a in (x, w, bias)),
                      stride, pads, dilation, groups, activation,
                      None if residual is None else arrays.host_of(residual))
        return arrays.torch_on(out, x.device)
    if kind == "cupy":
        import cupy as xp
    else:
        xp = np
    dt = np.dtype(x.dtype)
    work = np.float64 if dt == np.float64 else np.float32
    y = conv_im2col(x.astype(work), w.astype(work),
                    None if bias is None else bias.astype(work), strides=stride,
                    pads=pads + pads, dilations=dilation, group=groups, xp=xp)
    if residual is not None:
        y += residual.astype(work)
    if activation is not None:
        y = apply_epilogue(xp, y, None, activation)
    return y.astype(dt)


def _to_first(a: Any, nd: int) -> Any:
    """A channels-last ``(N, *spatial, C)`` array viewed channels first."""
    order = (0, nd + 1, *range(1, nd + 1))
    return a.permute(*order) if arrays.kind(a) == "torch" else a.transpose(order)


def _to_last(a: Any, nd: int) -> Any:
    """A channels-first ``(N, C, *spatial)`` array viewed channels last."""
    order = (0, *range(2, nd + 2), 1)
    return a.permute(*order) if arrays.kind(a) == "torch" else a.transpose(order)


def _with_grad(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
               groups: int, layout: str, activation: str | None,
               residual: Any = None) -> Any:
    """:func:`conv` of torch tensors that require gradients: the forward as ``pl.conv``
    runs it, recorded with :func:`conv_backward`'s gradients; a residual and an
    activation are applied by torch after it (so torch differentiates them)."""
    from .autograd import differentiable

    _check_operands(x, w, bias, residual)
    shape, stride_t, pads, dilation_t = conv_geometry(
        tuple(x.shape), tuple(w.shape), None if bias is None else tuple(bias.shape),
        stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    _check_residual(residual, shape)
    nd = len(w.shape) - 2
    xf = _to_first(x, nd) if layout == "channels_last" else x
    args = {"stride": stride_t, "padding": pads, "dilation": dilation_t, "groups": groups}

    def forward() -> tuple[Any]:
        return (conv(xf.detach(), w.detach(), None if bias is None else bias.detach(),
                     **args),)

    def backward(inputs: tuple, outputs: tuple, grads: tuple) -> tuple:
        xi, wi, bi = inputs
        needs = (bool(xi.requires_grad), bool(wi.requires_grad))
        return _grads("torch", xi.detach(), wi.detach(), grads[0], bi is not None,
                      stride_t, pads, dilation_t, groups, needs)

    (y,) = differentiable((xf, w, bias), forward, backward)
    if residual is not None:
        y = y + (_to_first(residual, nd) if layout == "channels_last" else residual)
    y = torch_activation(y, activation, inplace=False)
    return _to_last(y, nd) if layout == "channels_last" else y


def _grads(kind: str, x: Any, w: Any, dy: Any, has_bias: bool, stride: tuple[int, ...],
           pads: tuple[int, ...], dilation: tuple[int, ...],
           groups: int, needs: tuple[bool, bool] = (True, True)) -> tuple[Any, Any, Any]:
    """``(dx, dw, db)`` of channels-first operands: on a GPU cuDNN's backward
    convolutions, or tuned CUTLASS ones where they won their race
    (:func:`~.conv_grad_route.conv_grads`; only the gradients ``needs`` asks for, the
    others ``None``); the im2col backward elsewhere (float32 arithmetic for 16-bit
    operands)."""
    from .conv_grad import conv_backward_im2col
    from .conv_grad_route import conv_grads

    geo = {"stride": stride, "pads": pads, "dilation": dilation, "groups": groups}
    if kind == "torch" and x.is_cuda:
        return conv_grads(x, w, dy.to(x.dtype), has_bias=has_bias, needs=needs, **geo)
    if kind == "cupy" and arrays.torch_installed():
        import cupy as cp
        import torch

        with torch.cuda.stream(arrays.torch_stream_of_cupy()):
            res = conv_grads(*(torch.from_dlpack(a) for a in (x, w, dy)),
                             has_bias=has_bias, needs=needs, **geo)
            return tuple(None if r is None else cp.from_dlpack(r) for r in res)
    if kind == "torch":
        res = _grads("numpy", *(arrays.host_of(a) for a in (x, w, dy)), has_bias, stride,
                     pads, dilation, groups)
        return tuple(arrays.torch_on(r, x.device) for r in res)
    xp = np
    if kind == "cupy":
        import cupy as xp
    dt = np.dtype(x.dtype)
    work = np.float64 if dt == np.float64 else np.float32
    dx, dw, db = conv_backward_im2col(x.astype(work), w.astype(work), dy.astype(work),
                                      bias=has_bias, xp=xp, **geo)
    return dx.astype(dt), dw.astype(dt), None if db is None else db.astype(dt)


def conv_backward(x: Any, w: Any, dy: Any, bias: Any = None, *,
                  stride: int | Sequence[int] = 1, padding: int | Sequence[int] | str = 0,
                  dilation: int | Sequence[int] = 1, groups: int = 1,
                  layout: str = "channels_first",
                  activation: str | None = None) -> tuple[Any, Any, Any]:
    """Gradients of :func:`conv` with respect to ``x``, ``w`` and ``bias``.

    For arrays without an autograd of their own (NumPy, CuPy) and for a training step
    written by hand; torch tensors that require gradients get them from
    ``loss.backward()`` through :func:`conv` itself.

    Parameters
    ----------
    x, w, bias, stride, padding, dilation, groups, layout, activation
        The forward's operands and arguments, as for :func:`conv`.
    dy : array
        The gradient of the loss with respect to the forward's result: its shape (in
        ``layout``), kind and dtype.

    Returns
    -------
    (array, array, array or None)
        ``dx`` (``x``'s shape and layout), ``dw`` (``w``'s shape), ``db`` (``(O,)``;
        ``None`` without a bias), in the operands' dtype and kind.

    Raises
    ------
    PycLabError
        As :func:`conv`; or ``dy`` of the wrong shape or kind.

    Notes
    -----
    On a GPU these are cuDNN's backward convolutions (dgrad, wgrad) through torch, or
    tuned CUTLASS ones where they won their race (:func:`~.conv_grad_route.conv_grads`),
    CuPy arrays handed over by DLPack; elsewhere the transpose of the im2col forward
    (:func:`~.conv_grad.conv_backward_im2col`). A fused activation is differentiated at
    the pre-activation, which is computed again.
    """
    if activation is not None and activation not in ACTIVATIONS:
        raise PycLabError(f"pl.conv_backward: activation {activation!r} is not one of "
                          f"{ACTIVATIONS} (or None)")
    _check_operands(x, w, bias)
    shape, stride_t, pads, dilation_t = conv_geometry(
        tuple(x.shape), tuple(w.shape), None if bias is None else tuple(bias.shape),
        stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    kind = arrays.kind(x)
    if not hasattr(dy, "shape") or arrays.kind(dy) != kind or tuple(dy.shape) != shape:
        raise PycLabError(f"pl.conv_backward: dy must be a {kind} array of the result's "
                          f"shape {shape}; got {getattr(dy, 'shape', type(dy).__name__)}")
    nd = len(w.shape) - 2
    if kind == "torch":
        x, w, dy = (a.detach() for a in (x, w, dy))
        bias = None if bias is None else bias.detach()
    if activation is not None:
        z = conv(x, w, bias, stride=stride_t, padding=pads, dilation=dilation_t,
                 groups=groups, layout=layout)
        dy = _activation_grad(kind, z, dy, activation)
    if layout == "channels_last":
        x, dy = _to_first(x, nd), _to_first(dy, nd)
    dx, dw, db = _grads(kind, x, w, dy, bias is not None, stride_t, pads, dilation_t,
                        groups)
    return (_to_last(dx, nd) if layout == "channels_last" else dx), dw, db


def _activation_grad(kind: str, z: Any, dy: Any, activation: str) -> Any:
    """``dy`` times the activation's derivative at ``z``, in float32 (float64 for
    float64) and rounded back to ``dy``'s dtype."""
    from .conv_grad import activation_grad

    if kind == "torch":
        import torch

        work = torch.float64 if z.dtype == torch.float64 else torch.float32
        return activation_grad(torch, z.to(work), dy.to(work), activation).to(dy.dtype)
    xp = np
    if kind == "cupy":
        import cupy as xp
    dt = np.dtype(dy.dtype)
    work = np.float64 if dt == np.float64 else np.float32
    return activation_grad(xp, z.astype(work), dy.astype(work), activation).astype(dt)


def conv1d(x: Any, w: Any, bias: Any = None, **kwargs: Any) -> Any:
    """1-D :func:`conv`: ``x (N, C, L)``, ``w (O, C // groups, K)``."""
    if len(w.shape) != 3:
        raise PycLabError(f"pl.conv1d: weights of shape {tuple(w.shape)}; expected "
                          "(O, C // groups, K)")
    return conv(x, w, bias, **kwargs)


def conv2d(x: Any, w: Any, bias: Any = None, **kwargs: Any) -> Any:
    """2-D :func:`conv`: ``x (N, C, H, W)``, ``w (O, C // groups, KH, KW)``."""
    if len(w.shape) != 4:
        raise PycLabError(f"pl.conv2d: weights of shape {tuple(w.shape)}; expected "
                          "(O, C // groups, KH, KW)")
    return conv(x, w, bias, **kwargs)
