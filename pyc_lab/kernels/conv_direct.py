"""A convolution computed directly by pyc_lab's own kernel (``native/conv_direct.cuh``).

The small convolutions of scientific models — a 1-D CNN over a particle's hits (4 -> 32
channels, filters of 3), a stem over a few input planes — are a poor fit for the
libraries' kernels: their reduction per output (``C / groups * R * S``, tens of values) is
too short for a GEMM's tiles, a patch matrix moves more bytes than the arithmetic costs,
and at batch 1 the work is a few microseconds a launch. The direct kernel keeps a block
of outputs per thread in float32 registers, reads each input element once per filter
tap for all of its output channels, and adds the bias and the activation before its one
rounded store — one launch per convolution, with no scratch memory.

It is a candidate of the first call's race of :mod:`.conv_gemm` (with cuDNN, the GEMM
form and tuned CUTLASS kernels; kept only where it measures faster than cuDNN), and a
launch a CUDA graph can record (:func:`launcher`): inside ``pl.compile`` a convolution
whose race it won runs inside the program's graphs instead of between them.

:func:`eligible` says which problems it takes: channels-first output, one or two spatial
axes, float16, bfloat16 or float32, a reduction of at most :data:`MAX_TAPS` values per
output and offsets that fit 32-bit arithmetic. The kernels are compiled once per device,
dtype and tile shape with NVRTC (:mod:`.nvrtc`, subnormals kept).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .conv_guard import ACTIVATION_CODES
from .conv_im2col import out_size
from .memo import remember
from .nvrtc import compile_module

__all__ = ["MAX_TAPS", "Config", "configs", "eligible", "geometry", "launcher", "row_taps",
           "rows_fit", "run", "sm_count", "split_lanes", "tile"]

log = logging.getLogger(__name__)

#: The longest reduction per output (``C / groups * R * S``) the kernel takes: past it a
#: thread's serial sum is long enough that the libraries' parallel reductions win.
MAX_TAPS = 512
#: The most multiply-adds x 2 a problem may have for the race to time this kernel: the
#: first call times each build a few times, and at about 20 TFLOP/s on the CUDA cores a
#: problem this large costs ~14 ms a call. The size alone does not decide the race: a
#: stem's few input channels waste a tensor-core tile (on the H200, ResNet's 3 -> 64, 7x7
#: float32 stem took this kernel 0.33 ms at batch 32 and cuDNN 4.06 ms at batch 256, 60
#: Gflop, where an earlier cap of 8.6 Gflop left cuDNN unraced); wider problems are
#: ruled out by :data:`MAX_TAPS` and lose the race where they remain.
MAX_FLOPS = 1 << 38
#: Threads per block, and the pixels per thread of a problem large enough to fill the
#: GPU several times over (:func:`tile`).
THREADS = 128
#: The element kinds of ``pyc_conv_direct`` by dtype name (torch's or NumPy's).
KINDS = {"torch.float16": 0, "torch.bfloat16": 1, "torch.float32": 2,
         "float16": 0, "bfloat16": 1, "float32": 2}
_FUNCTIONS: dict[tuple[int, str], Any] = {}
#: The build each problem's first call measured fastest (:func:`_fastest`).
_CONFIGS: dict[tuple, Config] = {}
#: Timed calls per build in that measurement.
REPEATS = 5
#: Launchers of the problems run through :func:`run` (the oldest dropped first).
_LAUNCHERS: dict[tuple, Callable[..., None]] = {}
MAX_LAUNCHERS = 512
_LOCK = threading.Lock()


def geometry(x_shape: tuple[int, ...], x_strides: tuple[int, ...], w_shape: tuple[int, ...],
             stride: tuple[int, ...], pads: tuple[int, ...], dilation: tuple[int, ...],
             groups: int) -> tuple[int, ...] | None:
    """The kernel's integer arguments after its operand pointers — ``c, h, w, k, groups,
    r, s, p, q, sh, sw, ph, pw, dh, dw, xs_n, xs_c, xs_h, xs_w, pixels`` — for a
    channels-first problem (``x_strides`` in elements; a 1-D problem as height 1), or
    ``None`` where the kernel does not take it (see :func:`eligible`)."""
    nd = len(w_shape) - 2
    if nd not in (1, 2) or len(x_shape) != nd + 2:
        return None
    if nd == 1:
        x_shape = (x_shape[0], x_shape[1], 1, x_shape[2])
        x_strides = (x_strides[0], x_strides[1], 0, x_strides[2])
        w_shape = (w_shape[0], w_shape[1], 1, w_shape[2])
        stride, pads, dilation = (1, *stride), (0, *pads), (1, *dilation)
    n, c, h, w = (int(v) for v in x_shape)
    k, cg, r, s = (int(v) for v in w_shape)
    if groups < 1 or c % groups or k % groups or cg * groups != c:
        return None
    p = out_size(h + 2 * pads[0], r, stride[0], dilation[0])
    q = out_size(w + 2 * pads[1], s, stride[1], dilation[1])
    if p <= 0 or q <= 0 or cg * r * s > MAX_TAPS or min(x_strides) < 0:
        return None
    span = sum((d - 1) * st for d, st in zip(x_shape, x_strides, strict=True))
    if span >= 2**31 or n * k * p * q >= 2**31:
        return None
    return (c, h, w, k, groups, r, s, p, q, *stride, *pads, *dilation,
            *(int(v) for v in x_strides), n * p * q)


def eligible(dtype_name: str, x_shape: tuple[int, ...], x_strides: tuple[int, ...],
             w_shape: tuple[int, ...], stride: tuple[int, ...], pads: tuple[int, ...],
             dilation: tuple[int, ...], groups: int) -> bool:
    """Whether the direct kernel takes this problem (a dtype it knows, the shapes of
    :func:`geometry`, at most :data:`MAX_FLOPS`)."""
    geo = geometry(x_shape, x_strides, w_shape, stride, pads, dilation, groups)
    if dtype_name not in KINDS or geo is None:
        return False
    c, _, _, k, groups, r, s, p, q = geo[:9]
    return 2 * int(x_shape[0]) * k * (c // groups) * r * s * p * q <= MAX_FLOPS


def tile(out_channels_per_group: int, outputs: int, sms: int = 132) -> tuple[int, int]:
    """``(OT, PT)``: output channels and pixels per thread. OT is the largest of 8, 4, 2,
    1 dividing the channels of a group (a block's channels share one group); PT is 4
    where the problem fills every SM with several blocks of 4-pixel threads, else 1 (a
    small problem spreads its outputs over more threads)."""
    ot = next(v for v in (8, 4, 2, 1) if out_channels_per_group % v == 0)
    pt = 4 if outputs // ot >= sms * THREADS * 4 * 4 else 1
    return ot, pt


#: The widest filter (along the last axis) and the strides along it that the row kernel
#: (``pyc_conv_direct_rows``: consecutive outputs of a row per thread) is built for.
ROW_WIDTHS = 8
ROW_STRIDES = (1, 2)
#: The row kernel's wide builds, ``(OT, PT)``: 16 or 32 output channels a thread, so that
#: each input element is loaded once for that many channels (a 32 -> 32 layer reads its
#: input once instead of four times); offered where the channels of a group divide by OT,
#: the reduction fits :func:`row_taps` and the problem still fills every SM.
WIDE_ROWS = ((16, 4), (32, 2), (32, 4))


def row_taps(ot: int) -> int:
    """The longest reduction a row-kernel build of ``ot`` channels keeps in its 48 KiB of
    static shared memory (``pyc_direct_row_taps`` in ``conv_direct.cuh``)."""
    return MAX_TAPS if ot * MAX_TAPS * 4 <= 49152 else 49152 // (4 * ot)


@dataclass(frozen=True)
class Config:
    """One build of the kernel: ``rows`` (``pyc_conv_direct_rows``: PT consecutive outputs
    of an output row per thread, their windows' inputs loaded once), ``split`` lanes a
    pixel (``pyc_conv_direct_split``: the taps of one output pixel summed by that many
    lanes of a warp at once, for problems with few outputs and long sums), or the generic
    ``pyc_conv_direct`` (PT outputs a block apart per thread); with OT output channels
    and PT outputs per thread (1 for a split build)."""

    rows: bool
    ot: int
    pt: int
    split: int = 0

    @property
    def label(self) -> str:
        """A short name for logs and benchmark rows: ``rows 8x4``, ``generic 8x1``,
        ``split 8/32`` (channels / lanes)."""
        if self.split:
            return f"split {self.ot}/{self.split}"
        return f"{'rows' if self.rows else 'generic'} {self.ot}x{self.pt}"


@functools.cache
def sm_count(device: int) -> int:
    """The streaming multiprocessors of a device (what :func:`tile` sizes work by)."""
    import cupy as cp

    return int(cp.cuda.Device(device).attributes["MultiProcessorCount"])


def rows_fit(geo: tuple[int, ...]) -> bool:
    """Whether the row kernel takes a problem (:func:`geometry`'s tuple): a filter at most
    :data:`ROW_WIDTHS` wide along the last axis, undilated there, at a stride of
    :data:`ROW_STRIDES` along it."""
    s, sw, dw = geo[6], geo[10], geo[14]
    return s <= ROW_WIDTHS and sw in ROW_STRIDES and dw == 1


def split_lanes(taps: int) -> tuple[int, ...]:
    """The lanes a pixel of the split build for a reduction of ``taps`` values: the
    largest power of two from 4 to 32 leaving each lane at least 3 taps, and a quarter of
    it where that is still 4 or more (fewer shuffles, a longer serial sum)."""
    lanes = 4
    while lanes < 32 and taps // (lanes * 2) >= 3:
        lanes *= 2
    return (lanes, lanes // 4) if lanes >= 16 else (lanes,)


def configs(geo: tuple[int, ...], sms: int = 132) -> list[Config]:
    """The builds :func:`run`'s first call times for a problem, the default first: the
    row kernel with 4 (and 8) outputs a thread where it fits (and its wide builds,
    :data:`WIDE_ROWS`, where the problem takes them), and the generic kernel
    with the :func:`tile` pixels a thread and with the other of 1 and 4. A problem with
    fewer outputs than one block per SM at that tile (batch 1 of a small model) also
    gets the generic kernel with one or two channels and one pixel a thread: more
    threads, each with a shorter serial sum. A problem with fewer outputs than eight
    blocks per SM and a reduction of 12 values or more also gets the split builds
    (:func:`split_lanes`): a thread's serial sum is what such a problem waits on."""
    k, groups, pixels = geo[3], geo[4], geo[-1]
    taps = (geo[0] // groups) * geo[5] * geo[6]
    ot, pt = tile(k // groups, pixels * k, sms)
    generic = [Config(False, ot, pt), Config(False, ot, 5 - pt)]
    if pixels * k // ot < sms * THREADS:
        generic += [Config(False, v, 1) for v in (2, 1) if v < ot and (k // groups) % v == 0]
    if pixels * k // ot < sms * THREADS * 8 and taps >= 12:
        generic += [Config(False, min(ot, lanes), 1, lanes) for lanes in split_lanes(taps)]
    if rows_fit(geo):
        wide = [Config(True, o, p) for o, p in WIDE_ROWS
                if (k // groups) % o == 0 and taps <= row_taps(o)
                and pixels * k // (o * p) >= sms * THREADS]
        return [Config(True, ot, 4), Config(True, ot, 8), *wide, *generic]
    return generic


def _function(device: int, kind: int, config: Config, act: int,
              geo: tuple[int, ...]) -> Any:
    import cupy as cp

    from ..paths import native_source

    if config.rows:
        name = (f"pyc_conv_direct_rows<{kind}, {config.ot}, {config.pt}, {act}, {geo[6]}, "
                f"{geo[10]}>")
    elif config.split:
        name = f"pyc_conv_direct_split<{kind}, {config.ot}, {config.split}, {act}>"
    else:
        name = f"pyc_conv_direct<{kind}, {config.ot}, {config.pt}, {act}>"
    key = (device, name)
    fn = _FUNCTIONS.get(key)
    if fn is not None:
        return fn
    with _LOCK:
        if key not in _FUNCTIONS:
            code = "".join(native_source(f) for f in
                           ("f16.cuh", "bf16.cuh", "conv_guard.cuh", "conv_direct.cuh"))
            with cp.cuda.Device(device):
                module = compile_module(code, ("-std=c++17",), [name],
                                        "the direct convolution")
                _FUNCTIONS[key] = module.get_function(name)
    return _FUNCTIONS[key]


def launcher(kind: int, geo: tuple[int, ...], device: int, activation: str | None = None,
             sms: int = 132, config: Config | None = None
             ) -> Callable[[int, int, int, int, Any], None]:
    """A function ``launch(x_ptr, w_ptr, bias_ptr, y_ptr, stream)`` issuing the kernel
    for one problem (``geo`` from :func:`geometry`; ``bias_ptr`` 0 for none) on a CuPy
    stream — nothing is synchronised or allocated, so a CUDA-graph capture records it.
    ``config``: the build to run (default: the one :func:`run`'s first call measured
    fastest for the problem, else the first of :func:`configs`). The kernel is compiled
    (or loaded from the disk cache) here, not at the launch."""
    import numpy as np

    if config is None:
        config = _CONFIGS.get((kind, geo, device, activation)) or configs(geo, sms)[0]
    k, q, pixels = geo[3], geo[8], geo[-1]
    fn = _function(device, kind, config, ACTIVATION_CODES[activation], geo)
    if config.rows:
        threads = (pixels // q) * -(-q // config.pt)
        grid = (max(1, -(-threads // THREADS)), k // config.ot)
    elif config.split:
        grid = (max(1, -(-pixels * config.split // THREADS)), k // config.ot)
    else:
        grid = (max(1, -(-pixels // (THREADS * config.pt))), k // config.ot)
    ints = tuple(np.int32(v) for v in geo)

    def launch(x_ptr: int, w_ptr: int, bias_ptr: int, y_ptr: int, stream: Any) -> None:
        fn(grid, (THREADS,), (np.uint64(x_ptr), np.uint64(w_ptr), np.uint64(bias_ptr),
                              np.uint64(y_ptr), *ints), stream=stream)

    return launch


def _fastest(kind: int, geo: tuple[int, ...], device: int, activation: str | None,
             sms: int, ptrs: tuple[int, int, int, int], stream: Any) -> Config:
    """The build of :func:`configs` with the least GPU time on the caller's operands
    (CUDA events, a few calls each; a build that fails to compile or run is skipped),
    remembered for the problem."""
    from ..profiling.timing import benchmark

    key = (kind, geo, device, activation)
    best = _CONFIGS.get(key)
    if best is not None:
        return best
    timed = []
    for config in configs(geo, sms):
        try:
            launch = launcher(kind, geo, device, activation, sms, config)
            t = benchmark(launch, (*ptrs, stream), repeats=REPEATS, warmup=1, gpu=True,
                          stream=stream)
            timed.append((t.median_s, config))
        except Exception as exc:  # a build that cannot run is not chosen
            log.debug("direct convolution build %s refused: %s", config, exc)
    if not timed:
        raise ValueError("no build of the direct convolution could run")
    best = min(timed, key=lambda tc: tc[0])[1]
    log.info("direct conv %s: %s", geo, ", ".join(
        f"{c.label} {t * 1e3:.4f} ms" for t, c in timed))
    remember(_CONFIGS, key, best, MAX_LAUNCHERS, _LOCK)
    return best


def run(x: Any, w: Any, b: Any, stride: tuple[int, ...], pads: tuple[int, ...],
        dilation: tuple[int, ...], groups: int,
        activation: str | None = None) -> Callable[[Any, Any, Any], Any]:
    """The direct convolution of torch tensors on the GPU for this problem signature, as
    ``fn(x, w, b) -> y`` (channels first, contiguous, ``x``'s dtype) on torch's current
    stream; the filter is made contiguous where it is not. The first call of a problem
    times the builds of :func:`configs` on the caller's operands and keeps the fastest
    (outside a CUDA-graph capture). Raises ``ValueError`` for a problem :func:`eligible`
    refuses."""
    import torch

    from .arrays import torch_stream

    geo = geometry(tuple(x.shape), tuple(x.stride()), tuple(w.shape), stride, pads,
                   dilation, groups)
    if geo is None or str(x.dtype) not in KINDS:
        raise ValueError("the direct convolution does not take this problem")
    device = x.device.index
    shape = (int(x.shape[0]), int(w.shape[0]), *((geo[8],) if x.ndim == 3 else geo[7:9]))
    key = (KINDS[str(x.dtype)], geo, device, activation)
    launch = _LAUNCHERS.get(key)
    if launch is None:
        sms = sm_count(device)
        stream = torch_stream(device)
        if stream.is_capturing():  # nothing may be timed inside a capture
            config = _CONFIGS.get(key) or configs(geo, sms)[0]
        else:
            wc = w if w.is_contiguous() else w.contiguous()
            bc = None if b is None else b.contiguous()
            scratch = torch.empty(shape, dtype=x.dtype, device=x.device)
            ptrs = (x.data_ptr(), wc.data_ptr(), 0 if bc is None else bc.data_ptr(),
                    scratch.data_ptr())
            config = _fastest(*key, sms, ptrs, stream)
        launch = launcher(*key, sms=sms, config=config)
        remember(_LAUNCHERS, key, launch, MAX_LAUNCHERS, _LOCK)

    def direct(x: Any, w: Any, b: Any) -> Any:
        y = torch.empty(shape, dtype=x.dtype, device=x.device)
        wc = w if w.is_contiguous() else w.contiguous()
        bc = None if b is None else b.contiguous()  # held until the launch is issued
        launch(x.data_ptr(), wc.data_ptr(), 0 if bc is None else bc.data_ptr(),
               y.data_ptr(), torch_stream(device))
        return y

    return direct
