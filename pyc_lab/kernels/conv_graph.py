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

- the GEMM form (:mod:`.conv_gemm`) of a contiguous channels-last 2-D input: its
  pixels read in place (a 1x1 filter at stride 1 without padding) or its patches
  gathered into a matrix of the graph (``native/conv_patches.cuh``), times the filter
  (copied into the patches' ``(R, S, C)`` order for a larger filter) by cuBLAS issued
  directly (:class:`.blas_direct.CublasGemm`, with the graph's workspace) onto the bias
  broadcast into the output (``beta = 1``: the bias added in the GEMM's float32
  accumulation, as torch's ``addmm`` adds it), then the activation in place.

cuDNN runs through torch and is not recorded: it runs between graphs. Which form a graph
gets is :func:`.conv_gemm.graph_choice` of what the problem's first-call race measured:
a recorded form costs its GPU time alone, a call between graphs its GPU time plus its
host time.

A residual (``pl.conv(..., residual=r)``) is read by the epilogue of a tuned CUTLASS
kernel built for it; after any other form, one elementwise kernel in the graph computes
``act(y + r)`` over the result.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from . import arrays, conv_direct, conv_gemm
from .conv import LAYOUTS, _to_first, conv_geometry, conv_route
from .conv_library import tf32_allowed, tf32_now

__all__ = ["recordable_conv"]


def recordable_conv(x: Any, w: Any, bias: Any, out: Any, *, stride: Any = 1,
                    padding: Any = 0, dilation: Any = 1, groups: int = 1,
                    layout: str = "channels_first", activation: str | None = None,
                    tf32: bool | None = None, workspace: tuple[int, int] | None = None,
                    residual: Any = None) -> Callable[[], None] | None:
    """A call computing ``pl.conv(x, w, bias, ..., residual=residual)`` into ``out`` that
    a CUDA-graph capture can record, or ``None`` where the problem's form in a graph is a
    library call between graphs (:func:`.conv_gemm.graph_choice`), the problem was not
    raced yet, or the operands do not suit (not CuPy arrays; ``out``, the filter, the
    bias or the residual not contiguous; ``out`` or the residual of another dtype): the
    caller then runs it between graphs.

    The race consulted is the problem's with ``activation`` (and the residual) or
    without either (the race ``pl.inference``'s import runs before they are folded in);
    the recorded kernel applies ``activation`` in its epilogue, or an elementwise kernel
    after it adds the residual and applies the activation. A channels-last problem is
    the channels-first view of its arrays, as :func:`.conv.conv` hands it to the race.
    ``workspace`` ``(pointer, bytes)``: the cuBLAS workspace the graph's program owns
    (without one the GEMM form is not recorded). Nothing is launched, timed or
    exchanged with torch here (a CUDA-graph capture may be under way)."""
    if arrays.kind(x) != "cupy" or layout not in LAYOUTS or conv_route(x) != "cudnn":
        return None
    if out.dtype != x.dtype or not out.flags.c_contiguous \
            or not (w.flags.c_contiguous or _filter_last(w).flags.c_contiguous) \
            or (bias is not None and not bias.flags.c_contiguous) \
            or (residual is not None and (residual.dtype != x.dtype
                                          or residual.shape != out.shape
                                          or not residual.flags.c_contiguous)):
        return None
    _, stride_t, pads, dilation_t = conv_geometry(
        tuple(x.shape), tuple(w.shape), None if bias is None else tuple(bias.shape),
        stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    nd = len(w.shape) - 2
    last = layout == "channels_last"
    first, out_first = (_to_first(x, nd), _to_first(out, nd)) if last else (x, out)
    res = residual is not None
    keys = [(activation, res)] + ([(None, False)] if activation is not None or res else [])
    problem = (stride_t, pads, dilation_t, groups)
    after = _after(out, residual, activation)  # the residual and activation, unfused

    def direct() -> Callable[[], None] | None:
        if res and x.dtype.name not in GEMM_DTYPES:  # the residual's kernel reads float
            return None
        return _chain(_direct(first, w, bias, out_first, problem, None if res else activation),
                      after if res else None)

    for act, key_res in keys:
        with tf32_allowed(tf32):  # the race that decided ran under this setting
            choice = conv_gemm.choice_for_cupy(first, w, bias, *problem, act, key_res)
            tuned = None
            if last and x.flags.c_contiguous:
                # the kernel that raced with the key: the residual and activation fused
                # for the call's own key, neither for the plain one
                tuned = conv_gemm.tuned_launch_for_cupy(first, w, bias, *problem, act,
                                                        key_res)
            matmul_tf32 = tf32_now()[1]
        if choice is None:
            continue
        forms = {"direct": direct}
        if tuned is not None and not tuned[0].workspace_bytes(tuned[1]):
            fused = (act, key_res) == (activation, res)
            forms["cutlass"] = functools.partial(
                _tuned_then, x, w, bias, out, tuned, residual if fused else None,
                None if fused else after)
        if last and workspace is not None and _gemm_takes(x, w, groups):
            forms["gemm"] = functools.partial(_gemm, x, w, bias, out, problem, activation,
                                              matmul_tf32, workspace, residual)
        pick = conv_gemm.graph_choice(choice, forms)
        call = forms[pick]() if pick is not None else None
        if call is not None:
            return call
    return None


def _after(out: Any, residual: Any, activation: str | None) -> Callable[[], None] | None:
    """The launch of ``out = act(out + residual)`` (or ``act(out)``) in place, by one
    elementwise kernel; ``None`` when there is nothing to apply."""
    if residual is None and activation is None:
        return None
    if residual is None:
        act = _epilogue_kernel(activation, False)
        return lambda: act(out, out)
    add = _epilogue_kernel(activation, True)
    return lambda: add(out, residual, out)


def _chain(call: Callable[[], None] | None,
          after: Callable[[], None] | None) -> Callable[[], None] | None:
    """``call`` followed by ``after`` (``call`` itself without one; ``None`` without a
    call)."""
    if call is None or after is None:
        return call

    def both() -> None:
        call()
        after()

    return both


def _tuned_then(x: Any, w: Any, bias: Any, out: Any, tuned: tuple[Any, Any],
                residual: Any, after: Callable[[], None] | None) -> Callable[[], None]:
    """:func:`_tuned`, then ``after`` (the residual and activation a kernel tuned without
    them leaves)."""
    return _chain(_tuned(x, w, bias, out, tuned, residual), after)


def _direct(x: Any, w: Any, bias: Any, out: Any, problem: tuple[Any, ...],
            activation: str | None) -> Callable[[], None] | None:
    """The direct kernel of channels-first ``x`` (any strides) into ``out``: in place
    where ``out`` is contiguous, else into a scratch array of the graph copied into it
    (``out`` a channels-last array viewed channels first), the filter copied into the
    ``(O, C, *kernel)`` order the kernel reads where it is held otherwise; ``None`` for
    a problem the kernel does not take."""
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
    filt = w if w.flags.c_contiguous else cp.empty(w.shape, dtype=w.dtype)
    ptrs = (x.data.ptr, filt.data.ptr, 0 if bias is None else bias.data.ptr,
            target.data.ptr)

    def call() -> None:
        if filt is not w:  # the kernel reads (O, C, *kernel): a copy of the filter
            cp.copyto(filt, w)
        launch(*ptrs, cp.cuda.get_current_stream())
        if target is not out:
            cp.copyto(out, target)

    return call  # holds the scratch arrays: the graph's program keeps the call


def _tuned(x: Any, w: Any, bias: Any, out: Any, tuned: tuple[Any, Any],
           residual: Any = None) -> Callable[[], None]:
    """The tuned CUTLASS kernel ``(conv, geometry)`` of a contiguous channels-last ``x``
    into ``out`` (adding ``residual``, of ``out``'s layout, where it is a residual
    kernel), launched on CuPy's current stream, the filter read in place where it is
    held in the ``(O, *kernel, C)`` order the kernel reads, else copied into it first on
    each call."""
    import cupy as cp

    kernel, geometry = tuned
    w_view = _filter_last(w)
    held = w_view.flags.c_contiguous  # a filter held (O, *kernel, C): read in place
    w_last = w_view if held else cp.empty(w_view.shape, dtype=w.dtype)
    ptrs = (x.data.ptr, w_last.data.ptr, None if bias is None else bias.data.ptr,
            out.data.ptr)
    r_ptr = None if residual is None else residual.data.ptr

    def call() -> None:
        if not held:
            cp.copyto(w_last, w_view)
        kernel.run(geometry, ptrs[0], ptrs[1], ptrs[2], ptrs[3],
                   cp.cuda.get_current_stream().ptr, r_ptr)

    return call  # holds w_last: the graph's program keeps the call, so the copy lives on


#: The dtypes the recorded GEMM form takes, and the residual's kernel after any form
#: (those the elementwise kernels below read as ``float``).
GEMM_DTYPES = ("float16", "float32")


def _gemm_takes(x: Any, w: Any, groups: int) -> bool:
    """Whether the recorded GEMM form applies: a contiguous channels-last 2-D input of
    :data:`GEMM_DTYPES`, one group, nvmath-python's cuBLAS bindings installed."""
    from . import cublaslt

    return (x.ndim == 4 and groups == 1 and x.dtype.name in GEMM_DTYPES
            and x.flags.c_contiguous and cublaslt.status()[0])


def _gemm(x: Any, w: Any, bias: Any, out: Any, problem: tuple[Any, ...],
          activation: str | None, tf32: bool, workspace: tuple[int, int],
          residual: Any = None) -> Callable[[], None] | None:
    """The GEMM form of a contiguous channels-last ``x`` (``N, H, W, C``) into ``out``
    (``N, P, Q, O``), as the module describes it (the product issued as
    :func:`.matmul_plan.direct_for` describes it), then ``residual`` added and the
    activation applied; ``None`` where cuBLAS cannot take the product."""
    import cupy as cp

    from .matmul_plan import direct_for

    stride, pads, dilation, _ = problem
    n, h, wd, c = (int(v) for v in x.shape)
    o, kh, kw = int(w.shape[0]), int(w.shape[2]), int(w.shape[3])
    p, q = int(out.shape[1]), int(out.shape[2])
    rows, item, k = n * p * q, x.dtype.itemsize, kh * kw * c
    out2d = out.reshape(rows, o)
    launches: list[Callable[[Any], None]] = []
    if (kh, kw) == (1, 1) and tuple(stride) == (1, 1) and not any(pads):
        a, b = x.reshape(rows, c), w.reshape(o, c).T  # the pixels, the filter: in place
    else:
        width = conv_gemm.row_width(k, item)
        if rows * (width * item // 16) >= 2**31:  # the gather kernel's 32-bit indices
            return None
        a = cp.empty((rows, width), dtype=x.dtype)
        geometry = (n, h, wd, c, p, q, kh, kw, *stride, *pads, *dilation)
        strides = (h * wd * c, wd * c, c)
        ptrs = (x.data.ptr, a.data.ptr)
        device = x.device.id

        def gather(stream: Any) -> None:
            conv_gemm.gather_patches(device, item, *ptrs, geometry, strides, rows, width,
                                     stream)

        launches.append(gather)
        w_last = _filter_last(w)
        if (kh, kw) == (1, 1):
            b = w.reshape(o, c).T
        elif width == k and w_last.flags.c_contiguous:  # held in the patches' order
            b = w_last.reshape(o, k).T
        else:  # the filter in the patches' (R, S, C) order, zeros after its k columns
            wm = cp.zeros((o, width), dtype=w.dtype)
            target = cp.lib.stride_tricks.as_strided(
                wm, (o, kh, kw, c), (width * item, kw * c * item, c * item, item))
            launches.append(lambda stream: cp.copyto(target, w_last))
            b = wm.T
    direct = direct_for(a, b, out2d, "cublas", 1.0, 0.0 if bias is None else 1.0,
                        x.dtype.name, tf32=tf32)
    if direct is None:
        return None
    gemm = direct.gemm
    if bias is not None:
        launches.append(lambda stream: cp.copyto(out2d, bias))
    # the operands themselves are held (the patch matrix and the filter copy live as
    # long as the call, which the graph's program keeps); a call runs at capture only
    launches.append(lambda stream: gemm(a.data.ptr, b.data.ptr, out2d.data.ptr, stream.ptr,
                                        workspace))
    after = _after(out, residual, activation)
    if after is not None:
        launches.append(lambda stream: after())

    def call() -> None:
        stream = cp.cuda.get_current_stream()
        for launch in launches:
            launch(stream)

    return call


#: ``torch_activation``'s functions in float arithmetic (gelu in its tanh form), NaN
#: kept and ``relu(-0.0) = -0.0``, as torch computes them.
_ACTIVATIONS = {
    "relu": "v < 0.f ? 0.f : v",
    "silu": "v / (1.f + expf(-v))",
    "gelu": "0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))",
}
_KERNELS: dict[str, Any] = {}


def _epilogue_kernel(activation: str | None, residual: bool) -> Any:
    """A CuPy elementwise kernel ``y = act(x)``, or with ``residual`` ``y = act(x + r)``
    (``act`` of :data:`_ACTIVATIONS`, or none), in float arithmetic rounded once (``x``
    and ``y`` may be one array)."""
    name = f"residual_{activation}" if residual else str(activation)
    fn = _KERNELS.get(name)
    if fn is None:
        import cupy as cp

        body = _ACTIVATIONS[activation] if activation is not None else "v"
        fn = _KERNELS[name] = cp.ElementwiseKernel(
            "T x, T r" if residual else "T x", "T y",
            f"float v = (float)x{' + (float)r' if residual else ''}; y = (T)({body});",
            f"pyc_conv_graph_{name}")
    return fn


def _filter_last(w: Any) -> Any:
    """A ``(O, C, *kernel)`` filter viewed ``(O, *kernel, C)``."""
    return w.transpose(0, *range(2, w.ndim), 1)
