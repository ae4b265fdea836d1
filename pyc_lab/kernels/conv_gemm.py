"""On a GPU, a convolution runs as cuDNN chose it or as one GEMM over its patches,
whichever the problem's first call measured faster.

cuDNN is the library a user calls for a convolution, and it is the default here (in its
benchmark mode: its own fastest algorithm for the shape). For some problems it is not
the fastest thing the GPU can do: a 16-bit stem convolution with three input channels,
say, where cuDNN's bfloat16 kernels reach a third of its float16 speed on the H200. The
same convolution is a matrix product of its patches and the weights — cuBLAS's GEMMs,
with the bias added in the GEMM's epilogue where cuBLAS has one:

- a 1x1 filter without padding: the (strided) pixels ``(N*P*Q, C)``, read in place for
  a channels-last input at stride 1;
- a channels-last input: its patches gathered by pyc_lab's kernel
  (``native/conv_patches.cuh``, one pass of 16-byte stores; one strided copy off the
  GPU) into a ``(N*P*Q, R*S*C)`` matrix whose rows are padded to 16 bytes (so cuBLAS
  takes its aligned kernels), times the weights in the same ``(R, S, C)`` order;
- otherwise: ``torch.nn.functional.unfold``'s ``(N, C*R*S, P*Q)`` patches.

:func:`prepare` races the GEMM form against cuDNN on the problem's first call
(:func:`~pyc_lab.profiling.timing.benchmark` in interleaved rounds: the GPU's time, a
spin kernel keeping the host's launch gaps out of it, and the host's time to issue the
call; a candidate costs the larger of the two, which is what back-to-back calls
sustain) and keeps it only when it is at least :data:`MARGIN` cheaper; every later call
of that problem signature runs the winner. This is
``torch.backends.cudnn.benchmark``'s idea one level up: one choice per problem, measured
where it runs.

A CUTLASS convolution tuned for the problem by ``pl.autotune_conv`` (found in the
tuning database and the kernel cache by :mod:`.conv_cutlass`) runs in the same race as a
third candidate, under the same margin, and so does pyc_lab's direct kernel for small
problems (:mod:`.conv_direct`: few channels, short filters; any ``groups``), the one
candidate a CUDA graph can record as it is.

The GEMM form needs ``groups == 1``, one or two spatial axes and a patch matrix of at
most :data:`MAX_PATCH_BYTES`; a problem no other candidate takes, a call inside a
CUDA-graph capture before its problem was raced, or a machine without CuPy (whose events
time the race) runs cuDNN.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Collection
from typing import Any

from . import conv_direct
from .arrays import torch_raw_stream
from .conv_im2col import out_size
from .conv_library import cudnn_conv, tf32_now, torch_activation
from .nvrtc import compile_module

__all__ = [
    "CAPTURING",
    "GPU_SLACK",
    "MARGIN",
    "MAX_PATCH_BYTES",
    "choice_for",
    "choice_for_cupy",
    "choices",
    "cudnn_conv",
    "gather_patches",
    "gemm_conv",
    "graph_choice",
    "keeps",
    "patch_bytes",
    "prepare",
    "records_direct",
    "row_width",
    "run",
    "time_calls",
    "timing_refused",
    "torch_activation",
    "tuned_launch_for_cupy",
]

log = logging.getLogger(__name__)

#: How much cheaper (the larger of GPU and host time a call) another candidate must
#: measure to be kept over cuDNN ...
MARGIN = 0.03
#: ... while its GPU time is at most cuDNN's times ``1 + GPU_SLACK``: where the host's
#: time to issue a call decides the cost (both above their GPU time), a candidate that
#: is cheaper to issue but slower on the GPU would lose wherever calls queue up (CUDA
#: graphs, a busy stream) — measured so at 41bf6f1 (a CUTLASS kernel kept for 8 % less
#: host time ran 0.87x cuDNN on the GPU).
GPU_SLACK = 0.0
#: The largest patch matrix (bytes) the GEMM form may make; beyond it, cuDNN only.
MAX_PATCH_BYTES = 2 << 30
#: Interleaved rounds of a race, and timed calls per candidate in each.
ROUNDS = 3
REPEATS = 5
#: Problem signatures remembered (the oldest dropped first).
MAX_CHOICES = 512

_LOCK = threading.Lock()
_CHOICES: dict[tuple, dict[str, Any]] = {}  # oldest first: the first dropped when full
#: The tuned CUTLASS kernels raced for a problem, won or not (dropped with the choice).
_RUNNERS: dict[tuple, Callable[..., Any]] = {}


def choices() -> dict[tuple, dict[str, Any]]:
    """Problem signature -> what runs (``"impl"``: ``"cudnn"``, ``"gemm"``, ``"cutlass"``
    or ``"direct"``) and the race's milliseconds per call (``"cudnn_ms"``, ``"gemm_ms"``,
    ...: the larger of GPU and host time, each also given as ``"*_gpu_ms"`` and
    ``"*_host_ms"``), for the problems raced so far."""
    with _LOCK:
        return {k: dict(v) for k, v in _CHOICES.items() if "cudnn_ms" in v}


def choice_for(x: Any, w: Any, b: Any, stride: tuple[int, ...], pads: tuple[int, ...],
               dilation: tuple[int, ...], groups: int = 1, activation: str | None = None,
               residual: bool = False) -> dict[str, Any] | None:
    """What :func:`run` chose for this problem (see :func:`choices`), or ``None`` while
    it is undecided or not raced (neither the GEMM form nor a tuned kernel applies)."""
    choice = _CHOICES.get(_signature(x, w, b, stride, pads, dilation, groups, activation,
                                     residual))
    return None if choice is None or "cudnn_ms" not in choice else dict(choice)


def graph_choice(choice: dict[str, Any], recordable: Collection[str]) -> str | None:
    """Which form a CUDA graph runs for a raced problem (:func:`choices`' entry), given
    the forms that can be recorded for its operands (``recordable``, of ``"direct"``,
    ``"cutlass"``, ``"gemm"``): in a graph a recorded form costs its GPU time alone,
    while a call that cannot be recorded runs between graphs and costs its GPU time plus
    its host time (the graph before it ends, the host issues it, the next graph starts
    after it: measured on the particle CNN at 4096 rows, its second convolution 53.0 us
    direct against 53.5 us cuDNN on the GPU, the model took 0.127 ms with the direct
    kernel in its graph and 0.367 ms with cuDNN between graphs). The race's winner is
    kept unless a recordable form costs at least :data:`MARGIN` less by that count; the
    answer is that form's name, or ``None`` where the winner cannot be recorded and stays
    cheapest (it runs between graphs)."""
    impl = choice.get("impl")

    def cost(name: str) -> float | None:
        gpu, host = choice.get(f"{name}_gpu_ms"), choice.get(f"{name}_host_ms")
        if gpu is None:
            return None
        if name in recordable:
            return gpu
        return None if host is None else gpu + host

    winner = cost(impl) if impl else None
    if winner is None:
        return impl if impl in recordable else None
    costs = {name: c for name in recordable if name != impl
             and (c := cost(name)) is not None and c <= winner * (1.0 - MARGIN)}
    if costs:
        return min(costs, key=costs.__getitem__)
    return impl if impl in recordable else None


def records_direct(choice: dict[str, Any]) -> bool:
    """Whether a CUDA graph records the direct kernel for a raced problem whose operands
    only that kernel can be recorded for (:func:`graph_choice`)."""
    return graph_choice(choice, ("direct",)) == "direct"


def choice_for_cupy(x: Any, w: Any, b: Any, stride: tuple[int, ...], pads: tuple[int, ...],
                    dilation: tuple[int, ...], groups: int = 1, activation: str | None = None,
                    residual: bool = False) -> dict[str, Any] | None:
    """:func:`choice_for` of CuPy arrays, read from their metadata alone — no DLPack
    exchange, which would order torch's stream after CuPy's and so may not happen inside
    a CUDA-graph capture."""
    choice = _CHOICES.get(_cupy_key(x, w, b, stride, pads, dilation, groups, activation,
                                    residual))
    return None if choice is None or "cudnn_ms" not in choice else dict(choice)


def _cupy_key(x: Any, w: Any, b: Any, stride: tuple[int, ...], pads: tuple[int, ...],
              dilation: tuple[int, ...], groups: int, activation: str | None,
              residual: bool = False) -> tuple:
    """:func:`_key` of CuPy arrays (what :func:`_signature` gives their torch views)."""
    item = x.dtype.itemsize
    return _key(x.device.id, f"torch.{x.dtype.name}", x.shape,
                tuple(v // item for v in x.strides), w.shape,
                tuple(v // w.dtype.itemsize for v in w.strides), b is None, stride, pads,
                dilation, groups, activation, residual)


def patch_bytes(x: Any, w: Any, stride: tuple[int, ...], pads: tuple[int, ...],
                dilation: tuple[int, ...]) -> int:
    """Bytes of the patch matrix the GEMM form makes (0 for a 1x1 filter without
    padding, which reads the input's pixels in place or as one strided copy)."""
    kernel = tuple(int(k) for k in w.shape[2:])
    out = [out_size(int(n) + 2 * p, k, s, d) for n, p, k, s, d
           in zip(x.shape[2:], pads, kernel, stride, dilation, strict=True)]
    rows = int(x.shape[0])
    for n in out:
        rows *= n
    if all(k == 1 for k in kernel) and not any(pads):
        return 0
    cols = int(x.shape[1])
    for k in kernel:
        cols *= k
    return rows * cols * x.element_size()


def _patches_nhwc(x: Any, kernel: tuple[int, int], stride: tuple[int, ...],
                  pads: tuple[int, ...], dilation: tuple[int, ...], out: tuple[int, int],
                  width: int) -> Any:
    """The patches of a channels-last ``x`` as a ``(N*P*Q, width)`` matrix: each row one
    output pixel's ``(R, S, C)`` window, zeros after the first ``R*S*C`` columns — by
    ``native/conv_patches.cuh`` on a GPU (one pass, 16-byte stores), else by one strided
    copy."""
    import torch

    n, c, h, w = (int(v) for v in x.shape)
    (ph, pw), (p, q), (kh, kw) = pads, out, kernel
    patches = x.new_empty((n * p * q, width))
    if x.is_cuda and x.stride(1) == 1 and x.element_size() in _ELEMENTS \
            and patches.numel() * x.element_size() // 16 < 2**31:  # the kernel's 32-bit indices
        _gather(x, patches, (n, h, w, c, p, q, kh, kw, *stride, ph, pw, *dilation), width)
        return patches
    nhwc = x.permute(0, 2, 3, 1)
    if ph or pw:
        padded = x.new_zeros((n, h + 2 * ph, w + 2 * pw, c))
        padded[:, ph:ph + h, pw:pw + w] = nhwc
        nhwc = padded
    sn, sh, sw, sc = nhwc.stride()
    windows = torch.as_strided(
        nhwc, (n, p, q, kh, kw, c),
        (sn, stride[0] * sh, stride[1] * sw, dilation[0] * sh, dilation[1] * sw, sc))
    k = kh * kw * c
    patches[:, :k].view(n, p, q, kh, kw, c).copy_(windows)
    if width > k:
        patches[:, k:].zero_()
    return patches


#: Element sizes the gather kernel moves, and the unsigned type it moves them as.
_ELEMENTS = {2: "unsigned short", 4: "unsigned int"}
_KERNELS: dict[tuple[int, int], Any] = {}


def _gather(x: Any, patches: Any, geometry: tuple[int, ...], width: int) -> None:
    """Launch ``pyc_conv_patches`` on torch's current stream of ``x``'s device."""
    from .arrays import torch_stream

    device = x.device.index
    sn, _, sh, sw = x.stride()
    gather_patches(device, x.element_size(), x.data_ptr(), patches.data_ptr(), geometry,
                   (sn, sh, sw), int(patches.shape[0]), width, torch_stream(device))


def gather_patches(device: int, element_size: int, x_ptr: int, patches_ptr: int,
                   geometry: tuple[int, ...], strides: tuple[int, int, int], rows: int,
                   width: int, stream: Any) -> None:
    """Launch ``pyc_conv_patches`` (``native/conv_patches.cuh``) on ``stream`` (a CuPy
    stream): the ``(rows, width)`` patch matrix of a channels-last input at ``x_ptr``
    (element ``strides`` of its batch, height and width axes; ``geometry`` ``(n, h, w, c,
    p, q, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w)``) into
    ``patches_ptr``, ``width`` a multiple of 16 bytes. Nothing is allocated or
    synchronised (a CUDA-graph capture records it); the kernel is compiled on the first
    launch of its element size on the device."""
    import cupy as cp
    import numpy as np

    from ..paths import native_source

    key = (device, element_size)
    total = rows * (width * element_size // 16)
    blocks = max(1, min(-(-total // _THREADS), 65535 * 8))
    with cp.cuda.Device(device):  # the array's device, whichever is current
        fn = _KERNELS.get(key)
        if fn is None:
            name = f"pyc_conv_patches<{_ELEMENTS[element_size]}>"
            with _LOCK:
                module = compile_module(native_source("conv_patches.cuh"), ("-std=c++17",),
                                        [name], "the convolution patch copy")
                fn = _KERNELS[key] = module.get_function(name)
        sn, sh, sw = strides
        fn((blocks,), (_THREADS,),
           (np.uint64(x_ptr), np.uint64(patches_ptr), *(np.int32(v) for v in geometry),
            np.int64(sn), np.int64(sh), np.int64(sw), np.int32(width)), stream=stream)


_THREADS = 256


def row_width(k: int, element_size: int) -> int:
    """``k`` rounded up to a multiple of 16 bytes."""
    per = max(1, 16 // element_size)
    return -(-k // per) * per


def gemm_conv(x: Any, w: Any, b: Any, stride: tuple[int, ...], pads: tuple[int, ...],
              dilation: tuple[int, ...]) -> Any:
    """The convolution (``groups == 1``, one or two spatial axes) of torch tensors as one
    GEMM: ``(N, O, *out)`` in ``x``'s dtype (cuBLAS accumulates 16-bit products in
    float32), laid out in memory as ``x`` is (channels last for a channels-last input, as
    cuDNN answers)."""
    import torch
    import torch.nn.functional as F

    one_d = x.ndim == 3
    if one_d:  # as a 2-D problem of height 1
        x, w = x.unsqueeze(2), w.unsqueeze(2)
        stride, pads, dilation = (1, *stride), (0, *pads), (1, *dilation)
    n, c = int(x.shape[0]), int(x.shape[1])
    o, kh, kw = int(w.shape[0]), int(w.shape[2]), int(w.shape[3])
    p = out_size(int(x.shape[2]) + 2 * pads[0], kh, stride[0], dilation[0])
    q = out_size(int(x.shape[3]) + 2 * pads[1], kw, stride[1], dilation[1])
    last = not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
    if (kh, kw) == (1, 1) and not any(pads):  # the (strided) pixels times the weights
        xs = x[:, :, ::stride[0], ::stride[1]]
        wm = w.reshape(o, c)
        if last:
            pixels = xs.permute(0, 2, 3, 1).reshape(n * p * q, c)
            y = torch.addmm(b, pixels, wm.t()) if b is not None else pixels @ wm.t()
        else:
            y = torch.matmul(wm, xs.reshape(n, c, p * q))
    elif last:  # the NHWC patches times the weights in (R, S, C) order
        k = kh * kw * c
        width = row_width(k, x.element_size())
        patches = _patches_nhwc(x, (kh, kw), stride, pads, dilation, (p, q), width)
        wm = w.permute(0, 2, 3, 1).reshape(o, k)
        if width > k:
            wm = F.pad(wm, (0, width - k))
        y = torch.addmm(b, patches, wm.t()) if b is not None else patches @ wm.t()
    else:  # the weights times unfold's patches
        cols = F.unfold(x, (kh, kw), dilation=dilation, padding=pads, stride=stride)
        y = torch.matmul(w.reshape(o, c * kh * kw), cols)
    if last:
        y = y.view(n, p, q, o).permute(0, 3, 1, 2)
    else:
        if b is not None:
            y.add_(b.view(1, o, 1))
        y = y.view(n, o, p, q)
    return y.squeeze(2) if one_d else y


def _signature(x: Any, w: Any, b: Any, stride: tuple[int, ...], pads: tuple[int, ...],
               dilation: tuple[int, ...], groups: int, activation: str | None,
               residual: bool = False) -> tuple:
    """A problem's key, from torch tensors (see :func:`_key`)."""
    return _key(x.device.index, str(x.dtype), x.shape, x.stride(), w.shape, w.stride(),
                b is None, stride, pads, dilation, groups, activation, residual)


def _key(device: int, dtype: str, x_shape: Any, x_strides: Any, w_shape: Any,
         w_strides: Any, no_bias: bool, stride: tuple[int, ...], pads: tuple[int, ...],
         dilation: tuple[int, ...], groups: int, activation: str | None,
         residual: bool = False) -> tuple:
    """The key a problem's race is kept under: the operands' device, dtype (torch's name),
    shapes and element strides, the arguments (whether a residual is added among them),
    and torch's TF32 settings now (a race under one setting says nothing of another).
    Torch tensors (:func:`_signature`) and CuPy arrays (:func:`choice_for_cupy`) of one
    problem give one key."""
    return (device, dtype, tuple(x_shape), tuple(x_strides), tuple(w_shape),
            tuple(w_strides), no_bias, stride, pads, dilation, groups, activation,
            tf32_now()) + (("residual",) if residual else ())


def _eligible(x: Any, w: Any, stride: tuple[int, ...], pads: tuple[int, ...],
              dilation: tuple[int, ...], groups: int) -> bool:
    import torch

    return (groups == 1 and x.ndim in (3, 4) and x.is_cuda
            and x.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and patch_bytes(x, w, stride, pads, dilation) <= MAX_PATCH_BYTES)


def tuned_launch_for_cupy(x: Any, w: Any, b: Any, stride: tuple[int, ...],
                          pads: tuple[int, ...], dilation: tuple[int, ...], groups: int = 1,
                          activation: str | None = None,
                          residual: bool = False) -> tuple[Any, Any] | None:
    """``(conv, geometry)`` of the tuned CUTLASS kernel raced for this problem, won or not
    (CuPy arrays, read from their metadata as :func:`choice_for_cupy` reads them), where
    running it is its launch alone, ``activation`` (and the residual) in its epilogue
    (:func:`.conv_cutlass.kernel_call`'s ``launch``); ``None`` where the problem is not
    raced yet, no tuned kernel ran in its race, or the kernel needs more around its
    launch. :func:`graph_choice` says whether a graph should record it."""
    key = _cupy_key(x, w, b, stride, pads, dilation, groups, activation, residual)
    choice = _CHOICES.get(key)
    if choice is None or "cutlass_gpu_ms" not in choice:
        return None
    return getattr(_RUNNERS.get(key), "launch", None)


def prepare(x: Any, w: Any, b: Any, stride: tuple[int, ...], pads: tuple[int, ...],
            dilation: tuple[int, ...], groups: int, activation: str | None = None,
            residual: Any = None) -> tuple[Callable[..., Any], bool]:
    """What runs this problem: ``(fn, decided)``, ``fn(x, w, b, r=None)`` computing the
    convolution of torch tensors on the GPU, then ``r`` (a tensor of the result's shape,
    given where ``residual`` is: the race runs with it) added and ``activation``
    applied after its bias, by the fastest of cuDNN, the GEMM form and a tuned CUTLASS
    kernel (raced now, on the caller's tensors, if this problem signature is new), or by
    cuDNN where neither of the others applies. A tuned kernel with the activation (and
    the residual) in its epilogue runs it in the same kernel; every other path adds the
    residual to the result and applies the activation (:func:`torch_activation`) in
    place. ``decided`` is false only inside a CUDA-graph capture of an unraced problem
    (cuDNN runs, as the user set it, and the next call outside a capture races)."""
    res = residual is not None
    key = _signature(x, w, b, stride, pads, dilation, groups, activation, res)
    choice = _CHOICES.get(key)
    if choice is None:
        gemm_ok = _eligible(x, w, stride, pads, dilation, groups)
        tuned, why = _tuned(x, w, b, stride, pads, dilation, groups, activation, res)
        direct_ok = _direct_eligible(x, w, stride, pads, dilation, groups)
        if not gemm_ok and tuned is None and not direct_ok:
            choice = _remember(key, {"impl": "cudnn"})
        else:
            choice = _race(key, x, w, b, stride, pads, dilation, groups, gemm_ok, tuned, why,
                           activation, direct_ok, residual)
            if choice is None:
                return _then(functools.partial(cudnn_conv, stride=stride, pads=pads,
                                               dilation=dilation, groups=groups,
                                               benchmark=False), activation, res), False
    if choice["impl"] == "gemm":
        return _then(_gemm_runner(x, w, stride, pads, dilation), activation, res), True
    if choice["impl"] == "cutlass":
        return _RUNNERS[key], True
    if choice["impl"] == "direct":
        return _direct_runner(x, w, b, stride, pads, dilation, groups, activation, res), True
    return _then(functools.partial(cudnn_conv, stride=stride, pads=pads, dilation=dilation,
                                   groups=groups), activation, res), True


def _then(fn: Callable[..., Any], activation: str | None, residual: bool = False,
          fused_residual: bool = False) -> Callable[..., Any]:
    """``run(x, w, b, r=None)``: ``fn(x, w, b)`` followed by the residual ``r`` added
    (where ``residual``) and ``activation``, in place on ``fn``'s fresh result;
    ``fused_residual``: ``fn(x, w, b, r)`` adds it itself. ``run.unfused`` is ``fn``
    where the residual is added after it (else ``None``), ``run.launch`` a tuned
    kernel's launch where nothing runs around it."""
    if fused_residual:
        def fused(x: Any, w: Any, b: Any, r: Any = None) -> Any:
            return torch_activation(fn(x, w, b, r), activation)

        return fused
    if activation is None and not residual:
        def plain(x: Any, w: Any, b: Any, r: Any = None) -> Any:
            return fn(x, w, b)

        # nothing runs around ``fn``: a tuned kernel's launch stays recordable
        plain.launch = getattr(fn, "launch", None)  # type: ignore[attr-defined]
        return plain

    def run(x: Any, w: Any, b: Any, r: Any = None) -> Any:
        y = fn(x, w, b)
        if residual:
            y = y.add_(r)
        return torch_activation(y, activation)

    # the convolution alone where the residual is added after it: a caller with an
    # output of its own adds it there (no summed result copied across)
    run.unfused = fn if residual else None  # type: ignore[attr-defined]
    return run


def _direct_runner(x: Any, w: Any, b: Any, stride: tuple[int, ...], pads: tuple[int, ...],
                   dilation: tuple[int, ...], groups: int, activation: str | None,
                   residual: bool) -> Callable[..., Any]:
    """:mod:`.conv_direct`'s kernel for the problem: the activation in its epilogue, or,
    with a residual, the residual and the activation after it (:func:`_then`)."""
    if residual:
        return _then(conv_direct.run(x, w, b, stride, pads, dilation, groups), activation,
                     True)
    return _then(conv_direct.run(x, w, b, stride, pads, dilation, groups, activation), None)



def _direct_eligible(x: Any, w: Any, stride: tuple[int, ...], pads: tuple[int, ...],
                     dilation: tuple[int, ...], groups: int) -> bool:
    """Whether :mod:`.conv_direct`'s kernel takes the problem (a GPU tensor)."""
    return bool(getattr(x, "is_cuda", False)) and conv_direct.eligible(
        str(x.dtype), tuple(x.shape), tuple(x.stride()), tuple(w.shape), stride, pads,
        dilation, groups)


def _tuned(x: Any, w: Any, b: Any, stride: tuple[int, ...], pads: tuple[int, ...],
           dilation: tuple[int, ...], groups: int, activation: str | None = None,
           residual: bool = False) -> tuple[Callable[..., Any] | None, str]:
    """The tuned CUTLASS kernel of :mod:`.conv_cutlass` for the problem, if there is one,
    as ``fn(x, w, b, r=None)``: the most of the residual and ``activation`` fused that a
    tuned kernel has (both; the residual alone; the activation alone when there is no
    residual), the rest after it (:func:`_then`)."""
    if groups != 1 or not getattr(x, "is_cuda", False):
        return None, "grouped, or not on a GPU"
    try:
        from .conv_cutlass import tuned_runner

        if activation is not None or residual:  # everything in the epilogue
            fused, why = tuned_runner(x, w, b, stride, pads, dilation, activation, residual)
            if fused is not None:
                return fused, why
        if activation is not None and residual:  # the residual in it, the activation after
            fused, why = tuned_runner(x, w, b, stride, pads, dilation, None, True)
            if fused is not None:
                return _then(fused, activation, fused_residual=True), why
        plain, why = tuned_runner(x, w, b, stride, pads, dilation)
        return (None if plain is None else _then(plain, activation, residual)), why
    except Exception as exc:  # a tuned kernel must never break a convolution
        log.warning("tuned convolution lookup failed: %s", exc)
        return None, f"{type(exc).__name__}: {exc}"


def _gemm_runner(x: Any, w: Any, stride: tuple[int, ...], pads: tuple[int, ...],
                 dilation: tuple[int, ...]) -> Callable[[Any, Any, Any], Any]:
    """The GEMM form for one problem signature: for the commonest case — a 1x1 filter at
    stride 1 without padding on a channels-last input, a plain matrix product of the
    pixels — with its shapes worked out once (the host's time per call is part of what
    the race weighs); :func:`gemm_conv` for the rest."""
    import torch

    if x.ndim == 4 and tuple(w.shape[2:]) == (1, 1) and stride == (1, 1) \
            and not any(pads) and not x.is_contiguous() \
            and x.is_contiguous(memory_format=torch.channels_last):
        n, c, h, wd = (int(v) for v in x.shape)
        o = int(w.shape[0])
        rows = n * h * wd
        addmm, mm = torch.addmm, torch.mm

        def pixels_times_weights(x: Any, w: Any, b: Any) -> Any:
            pixels = x.permute(0, 2, 3, 1).reshape(rows, c)  # a view: channels last
            wt = w.reshape(o, c).t()
            y = addmm(b, pixels, wt) if b is not None else mm(pixels, wt)
            return y.view(n, h, wd, o).permute(0, 3, 1, 2)

        return pixels_times_weights
    return functools.partial(gemm_conv, stride=stride, pads=pads, dilation=dilation)


def run(x: Any, w: Any, b: Any, stride: tuple[int, ...], pads: tuple[int, ...],
        dilation: tuple[int, ...], groups: int, activation: str | None = None,
        residual: Any = None) -> Any:
    """The convolution (with the residual added, and the activation) of torch tensors on
    the GPU as :func:`prepare` chose it."""
    fn, _ = prepare(x, w, b, stride, pads, dilation, groups, activation, residual)
    return fn(x, w, b, residual)


def _race(key: tuple, x: Any, w: Any, b: Any, stride: tuple[int, ...],
          pads: tuple[int, ...], dilation: tuple[int, ...], groups: int,
          gemm_ok: bool = True, tuned: Callable[..., Any] | None = None,
          tuned_why: str = "", activation: str | None = None,
          direct_ok: bool = False, r: Any = None) -> dict[str, Any] | None:
    """Time cuDNN, the GEMM form (where ``gemm_ok``), a tuned CUTLASS kernel (where
    there is one) and the direct kernel (where ``direct_ok``) on the caller's tensors
    and remember the fastest, kept over cuDNN only
    when at least :data:`MARGIN` cheaper and not slower on the GPU (:data:`GPU_SLACK`);
    no CuPy to time with leaves the problem to cuDNN; ``None`` inside a CUDA-graph capture
    (nothing may be timed there: the problem stays undecided)."""
    refused = timing_refused(x.device)
    if refused == CAPTURING:
        return None
    if refused:
        return _remember(key, {"impl": "cudnn", "why": refused})
    res = r is not None
    lib = _then(functools.partial(cudnn_conv, stride=stride, pads=pads, dilation=dilation,
                                  groups=groups), activation, res)
    runs: dict[str, Callable[[], Any]] = {"cudnn": lambda: lib(x, w, b, r)}
    if gemm_ok:
        runner = _then(_gemm_runner(x, w, stride, pads, dilation), activation, res)
        runs["gemm"] = lambda: runner(x, w, b, r)
    if tuned is not None:
        runs["cutlass"] = lambda: tuned(x, w, b, r)
    if direct_ok:
        try:
            direct = _direct_runner(x, w, b, stride, pads, dilation, groups, activation, res)
            runs["direct"] = lambda: direct(x, w, b, r)
        except Exception as exc:  # a kernel that cannot be built is not a candidate
            log.warning("direct convolution not raced: %s", exc)
    if len(runs) == 1:
        return _remember(key, {"impl": "cudnn", "why": "no other candidate could run"})
    timed = dict(zip(runs, time_calls(list(runs.values()), x.device.index), strict=True))
    # the cheapest of the candidates that beat cuDNN by the rules (one that is cheaper
    # still but slower on the GPU does not hide another that passes)
    kept = [name for name in timed if name != "cudnn" and keeps(timed[name], timed["cudnn"])]
    impl = min(kept, key=lambda n: timed[n][0]) if kept else "cudnn"
    log.info("conv %s: %s -> %s", key[2:5],
             ", ".join(f"{n} {t[0]:.4f} ms" for n, t in timed.items()), impl)
    choice: dict[str, Any] = {"impl": impl}
    for name, (cost, gpu, host) in timed.items():
        choice.update({f"{name}_ms": cost, f"{name}_gpu_ms": gpu, f"{name}_host_ms": host})
    if tuned is not None:  # kept whether it won or not: a CUDA graph may record it
        choice["cutlass_kernel"] = tuned_why
        with _LOCK:
            _RUNNERS[key] = tuned
    return _remember(key, choice)


#: What :func:`timing_refused` answers inside a CUDA-graph capture.
CAPTURING = "inside a CUDA-graph capture"


def timing_refused(device: Any) -> str | None:
    """Why a first-call race may not time now on torch's current stream of ``device``:
    :data:`CAPTURING` inside a CUDA-graph capture (nothing may be timed there: the
    problem stays undecided), ``"CuPy is not installed"`` without CuPy's events to time
    with (the library keeps the problem); ``None`` when it may."""
    stream = torch_raw_stream(device)
    try:
        from . import blas_direct

        if blas_direct._capturing(stream):
            return CAPTURING
    except ImportError:
        return "CuPy is not installed"
    return None


def keeps(candidate: tuple[float, float, float], library: tuple[float, float, float]
          ) -> bool:
    """Whether a race keeps ``candidate`` over the ``library`` (both :func:`time_calls`'
    ``(cost, gpu, host)``): at least :data:`MARGIN` cheaper and no more than
    :data:`GPU_SLACK` slower on the GPU."""
    return (candidate[0] <= library[0] * (1.0 - MARGIN)
            and candidate[1] <= library[1] * (1.0 + GPU_SLACK))


def time_calls(runs: list[Any], device: int) -> list[tuple[float, float, float]]:
    """Each of ``runs`` on torch's current stream of ``device``, over :data:`ROUNDS`
    interleaved rounds of :data:`REPEATS` calls: ``(cost, gpu, host)`` milliseconds per
    call, medians of the rounds' medians, ``cost`` the larger of the GPU's time and the
    host's time to issue the call (what back-to-back calls sustain: a small problem is
    bound by the host, a large one by the GPU); infinities for one that raises."""
    from ..profiling.timing import benchmark
    from .arrays import torch_stream

    s = torch_stream(device)
    gpu: list[list[float]] = [[] for _ in runs]
    host: list[list[float]] = [[] for _ in runs]
    failed = [False] * len(runs)
    for _ in range(ROUNDS):
        for i, fn in enumerate(runs):
            if failed[i]:
                continue
            try:
                t = benchmark(fn, repeats=REPEATS, warmup=1, gpu=True, stream=s)
            except Exception as exc:  # a candidate that cannot run is not chosen
                log.debug("conv candidate %d refused: %s", i, exc)
                failed[i] = True
                continue
            gpu[i].append(t.median_s * 1e3)
            host[i].append(t.cpu_median_s * 1e3)
    out = []
    for i in range(len(runs)):
        if failed[i] or not gpu[i]:
            out.append((float("inf"),) * 3)
            continue
        g, h = sorted(gpu[i])[len(gpu[i]) // 2], sorted(host[i])[len(host[i]) // 2]
        out.append((max(g, h), g, h))
    return out


def _remember(key: tuple, choice: dict[str, Any]) -> dict[str, Any]:
    with _LOCK:
        _CHOICES[key] = choice
        while len(_CHOICES) > MAX_CHOICES:
            _RUNNERS.pop(next(iter(_CHOICES)), None)
            del _CHOICES[next(iter(_CHOICES))]
    return choice
