"""pyc_lab's CUTLASS 3 convolutions for Hopper: configurations, sources, builds, launches.

One kernel is CUTLASS's implicit-GEMM forward convolution for sm_90a
(``cutlass::conv::collective::CollectiveBuilder`` with ``Operator::kFprop``): the
activations read by TMA in its im2col mode (no patch matrix in memory), the filter by
plain TMA, warpgroup MMAs in a warp-specialised pipeline, and a TMA epilogue that adds
the bias and applies the activation before the one store. The source is fixed text,
``native/cutlass_conv_3x.cuh``, under a few ``#define`` s that :func:`emit_conv_source`
writes; it is built by the GEMMs' nvcc path into the hash-verified kernel cache
(:func:`~pyc_lab.kernels.cutlass.nvcc.build_source`) and loaded with ctypes
(:class:`CutlassConv`).

The implicit GEMM of a convolution with activations ``(N, *spatial, C)`` (channels
last), filter ``(K, *kernel, C)`` and output ``(N, *out, K)`` has ``M = N * prod(out)``
rows, ``N = K`` columns and a reduction of ``C * prod(kernel)``. CUTLASS 4.2 has one
Hopper convolution schedule (``KernelImplicitTmaWarpSpecializedSm90``: not persistent,
one consumer warpgroup) and its fused epilogues need the TMA epilogue schedule, so a
configuration is the CTA tile and the thread-block cluster (:class:`ConvConfig`); the
kernel itself is fixed by :class:`ConvKernel` (dtype, spatial rank, bias, activation).
A kernel does not depend on the problem's sizes: one build serves every layer of a
network that shares its dtype and epilogue.

Constraints (CUTLASS's, checked by :meth:`ConvGeometry.issue` before
``can_implement``): ``groups == 1``; ``C`` and ``K`` multiples of 8 elements (4 for tf32:
TMA's 16-byte alignment); activations and output channels-last and contiguous, the
filter ``(K, *kernel, C)`` contiguous. Channels TMA cannot load (a stem's ``C = 3``) go to
the CUTLASS 2 family of :mod:`.conv_2x`, whose libraries :class:`CutlassConv` drives too.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from math import prod
from pathlib import Path
from typing import Any, ClassVar

from ...errors import PycLabError
from ...paths import native_source
from ..cache import KernelCache
from .config import ACTIVATIONS
from .launch import load_library
from .nvcc import BuildResult, build_parallel, build_source, cached_library

__all__ = ["CONV_DTYPES", "DIRECTIONS", "HOPPER_NO_RESIDUAL", "HOPPER_REFUSES", "ConvConfig",
           "ConvGeometry", "ConvKernel", "CutlassConv", "build_conv", "build_conv_many",
           "cached_conv", "conv_configs", "emit_conv_source"]

#: Element types the convolution kernels take and their C++ types: ``tf32`` is float32
#: run as TF32 MMAs (as cuDNN's float32 convolutions are under torch's default
#: ``allow_tf32``), ``f32`` float32 at float32's accuracy as "3xTF32" MMAs (each operand
#: a TF32 big part plus the TF32 rest, three MMAs; CUTLASS 2 kernels only).
CONV_DTYPES = {"f16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t", "tf32": "float",
               "f32": "float"}
#: Why the Hopper kernels of this module take no residual kernel (:class:`ConvKernel`).
HOPPER_NO_RESIDUAL = ("the Hopper kernels here add no residual (their epilogue has no C "
                      "source); CUTLASS 2 kernels do")
#: Dtypes the Hopper kernels of this module do not take, and why.
HOPPER_REFUSES = {"f32": "float32 at float32's accuracy (3xTF32) is a CUTLASS 2 kernel's "
                         "(cutlass::arch::OpMultiplyAddFastF32); the Hopper family has none"}
#: Elements per 16-byte access, and bytes per element, of each dtype (both families).
VECTOR_ELEMENTS = {"f16": 8, "bf16": 8, "tf32": 4, "f32": 4}
ELEMENT_BYTES = {"f16": 2, "bf16": 2, "tf32": 4, "f32": 4}
#: CTA tiles (M, N) the space offers and clusters (M, N).
TILES = ((64, 64), (64, 128), (64, 256), (128, 64), (128, 128), (128, 256))
CLUSTERS = ((1, 1), (2, 1), (1, 2))
#: The K tile, in bytes of a row. A 256-byte step (fewer, longer mainloop steps, fewer
#: stages) was measured at 0.2-0.7x the 128-byte one on every ResNet-50 layer tried
#: (benchmarks/results/h200/issue18-92bac62), so it is not in the space.
K_BYTES = 128


@dataclass(frozen=True)
class ConvConfig:
    """A CUTLASS convolution configuration: CTA tile ``(M, N, K)`` and cluster ``(M, N)``."""

    tile: tuple[int, int, int] = (128, 128, 64)
    cluster: tuple[int, int] = (1, 1)

    @property
    def id(self) -> str:
        """``conv_t128x128x64_c1x1``: the tuning database's config id."""
        return (f"conv_t{'x'.join(map(str, self.tile))}_c{'x'.join(map(str, self.cluster))}")

    def to_dict(self) -> dict[str, Any]:
        """The configuration as the tuning database stores it."""
        return {"tile": "x".join(map(str, self.tile)),
                "cluster": "x".join(map(str, self.cluster))}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConvConfig:
        """Inverse of :meth:`to_dict`."""
        try:
            tile = tuple(int(v) for v in str(d["tile"]).split("x"))
            cluster = tuple(int(v) for v in str(d["cluster"]).split("x"))
        except (KeyError, ValueError) as exc:
            raise PycLabError(f"not a convolution configuration: {d!r}") from exc
        if len(tile) != 3 or len(cluster) != 2:
            raise PycLabError(f"not a convolution configuration: {d!r}")
        return cls(tile, cluster)  # type: ignore[arg-type]


#: The convolutions a kernel computes (CUTLASS's operators) and their ids in the sources:
#: the forward one, the input's gradient (dgrad) and the filter's (wgrad).
DIRECTIONS = {"fprop": 0, "dgrad": 1, "wgrad": 2}
_OPERATORS = {"fprop": "kFprop", "dgrad": "kDgrad", "wgrad": "kWgrad"}


@dataclass(frozen=True)
class ConvKernel:
    """What a convolution kernel is built for (everything but the configuration).

    ``direction`` is the convolution it computes for a forward problem
    (:class:`ConvGeometry`): ``"fprop"`` (``x, w -> y``), ``"dgrad"`` (``dy, w -> dx``)
    or ``"wgrad"`` (``dy, x -> dw``); the gradients have no bias or activation (an
    activation's derivative is applied to ``dy`` before, the bias' gradient is a sum).
    ``residual``: a forward kernel that adds a tensor of the output's shape after the
    bias and before the activation, ``act(conv + bias + residual)`` (a CUTLASS 2 kernel's,
    with a bias: :mod:`.conv_2x`).
    """

    dtype: str = "f16"
    spatial: int = 2
    bias: bool = False
    activation: str | None = None
    direction: str = "fprop"
    residual: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in CONV_DTYPES:
            raise PycLabError(f"CUTLASS convolutions take {sorted(CONV_DTYPES)}, not "
                              f"{self.dtype!r}")
        if self.spatial not in (1, 2, 3):
            raise PycLabError(f"CUTLASS convolutions have 1-3 spatial axes, not "
                              f"{self.spatial}")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise PycLabError(f"activation {self.activation!r} is not one of "
                              f"{sorted(ACTIVATIONS)}")
        if self.direction not in DIRECTIONS:
            raise PycLabError(f"direction {self.direction!r} is not one of "
                              f"{sorted(DIRECTIONS)}")
        if self.direction != "fprop" and (self.bias or self.activation or self.residual):
            raise PycLabError(f"a {self.direction} kernel has no bias, residual or "
                              "activation")
        if self.residual and not self.bias:
            raise PycLabError("a residual kernel takes a bias (its epilogue adds the bias "
                              "as a vector, +0.0 without one, which would turn a -0.0 "
                              "sum into +0.0); without a bias pl.conv adds the residual "
                              "after the kernel")

    @property
    def op(self) -> str:
        """The tuning database's op: ``conv2d_fprop``, ``conv2d_fprop_bias_relu``,
        ``conv2d_fprop_bias_res_relu`` (with a residual), ``conv2d_dgrad``,
        ``conv2d_wgrad``, ..."""
        tail = "_".join(p for p in ("bias" if self.bias else "",
                                    "res" if self.residual else "", self.activation or "")
                        if p)
        return f"conv{self.spatial}d_{self.direction}" + (f"_{tail}" if tail else "")

    @property
    def defines(self) -> dict[str, Any]:
        """The ``#define`` s of the direction both kernel families' sources read."""
        return {"PYC_OP": f"cutlass::conv::Operator::{_OPERATORS[self.direction]}",
                "PYC_OP_ID": DIRECTIONS[self.direction]}

    def operands(self, geometry: ConvGeometry) -> tuple[tuple[int, ...], tuple[int, ...],
                                                        tuple[int, ...]]:
        """The channels-last shapes of the kernel's two operands and its output for the
        forward problem ``geometry``: ``(act, flt) -> out`` for fprop, ``(out, flt) ->
        act`` for dgrad, ``(out, act) -> flt`` for wgrad."""
        act, flt, out = geometry.act, geometry.flt, geometry.out_shape
        return {"fprop": (act, flt, out), "dgrad": (out, flt, act),
                "wgrad": (out, act, flt)}[self.direction]

    @property
    def align(self) -> int:
        """Elements per 16-byte access: what ``C`` and ``K`` must be multiples of."""
        return VECTOR_ELEMENTS[self.dtype]

    @property
    def hopper_refusal(self) -> str | None:
        """Why this module's Hopper kernels cannot be this kernel (:data:`HOPPER_REFUSES`,
        :data:`HOPPER_NO_RESIDUAL`), or ``None`` where they can."""
        if self.dtype in HOPPER_REFUSES:
            return HOPPER_REFUSES[self.dtype]
        return HOPPER_NO_RESIDUAL if self.residual else None


def emit_conv_source(config: ConvConfig, kernel: ConvKernel) -> str:
    """The complete CUDA C++ of one convolution kernel and its ``extern "C"`` wrapper.

    Raises
    ------
    PycLabError
        A kernel this family does not build (:attr:`ConvKernel.hopper_refusal`).
    """
    if kernel.hopper_refusal:
        raise PycLabError(f"CUTLASS 3 convolution {config.id}: {kernel.hopper_refusal}")
    m, n, k = config.tile
    cm, cn = config.cluster
    act = ACTIVATIONS[kernel.activation] if kernel.activation else \
        "cutlass::epilogue::thread::Identity"
    defines = {**kernel.defines, "PYC_ELEMENT": CONV_DTYPES[kernel.dtype],
               "PYC_ALIGN": kernel.align,
               "PYC_SPATIAL": kernel.spatial, "PYC_TILE_M": m, "PYC_TILE_N": n,
               "PYC_TILE_K": k, "PYC_CLUSTER_M": cm, "PYC_CLUSTER_N": cn,
               "PYC_BIAS": int(kernel.bias), "PYC_ACT": act}
    head = f"// pyc_lab CUTLASS convolution {kernel.op} {kernel.dtype}: {config.id}\n"
    return head + "".join(f"#define {k} {v}\n" for k, v in defines.items()) + \
        native_source("cutlass_conv_3x.cuh")


def build_conv(config: ConvConfig, kernel: ConvKernel, cc: int = 90,
               cache: KernelCache | None = None, timeout_s: float = 900.0) -> BuildResult:
    """Build one convolution kernel into the kernel cache (or take it from there); a
    failure is a result carrying nvcc's message, never a raise."""
    if cc < 90:
        return BuildResult(config, "", None, "compile_error", 0.0,
                           f"CUTLASS 3 convolutions need Hopper (sm_90a); this is sm_{cc}")
    if kernel.hopper_refusal:
        return BuildResult(config, "", None, "compile_error", 0.0, kernel.hopper_refusal)
    return build_source(config, emit_conv_source(config, kernel), cc, cache, timeout_s,
                        meta={"config": config.to_dict(), "op": kernel.op,
                              "dtype": kernel.dtype})


def cached_conv(config: ConvConfig, kernel: ConvKernel, cc: int = 90,
                cache: KernelCache | None = None) -> Path | None:
    """The kernel's library if it is in the kernel cache, else ``None``; never builds
    (what a first call of ``pl.conv`` may afford)."""
    if kernel.hopper_refusal:
        return None
    return cached_library(emit_conv_source(config, kernel), cc, cache)


def build_conv_many(configs: Sequence[ConvConfig], kernel: ConvKernel, cc: int = 90,
                    workers: int | None = None, cache: KernelCache | None = None,
                    on_done: Callable[[BuildResult], None] | None = None
                    ) -> dict[ConvConfig, cf.Future]:
    """Start building ``configs`` on ``workers`` threads (one nvcc each); a future per
    configuration, in the order given."""
    return build_parallel(configs, lambda cfg: build_conv(cfg, kernel, cc, cache), workers,
                          on_done, "pyc-nvcc-conv")


@dataclass(frozen=True)
class ConvGeometry:
    """A forward convolution's sizes as the kernel takes them (channels last).

    ``act`` is ``(N, *spatial, C)``, ``flt`` ``(K, *kernel, C)``; ``pad``, ``stride`` and
    ``dilation`` have one entry per spatial axis (outermost first).
    """

    act: tuple[int, ...]
    flt: tuple[int, ...]
    pad: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]

    @classmethod
    def from_channels_first(cls, x_shape: Sequence[int], w_shape: Sequence[int],
                            stride: Sequence[int], pads: Sequence[int],
                            dilation: Sequence[int]) -> ConvGeometry:
        """From ``pl.conv``'s shapes: ``x (N, C, *spatial)``, ``w (K, C, *kernel)``."""
        n, c, *spatial = (int(v) for v in x_shape)
        k, _, *kernel = (int(v) for v in w_shape)
        return cls((n, *spatial, c), (k, *kernel, c), tuple(int(p) for p in pads),
                   tuple(int(s) for s in stride), tuple(int(d) for d in dilation))

    @property
    def spatial(self) -> int:
        """Spatial axes."""
        return len(self.act) - 2

    @property
    def out(self) -> tuple[int, ...]:
        """The output's spatial extents."""
        return tuple((n + 2 * p - d * (r - 1) - 1) // s + 1 for n, r, p, s, d in
                     zip(self.act[1:-1], self.flt[1:-1], self.pad, self.stride,
                         self.dilation, strict=True))

    @property
    def out_shape(self) -> tuple[int, ...]:
        """``(N, *out, K)``: the output, channels last."""
        return (self.act[0], *self.out, self.flt[0])

    @property
    def gemm(self) -> tuple[int, int, int]:
        """The implicit GEMM's ``(M, N, K)``."""
        return (self.act[0] * prod(self.out), self.flt[0],
                self.act[-1] * prod(self.flt[1:-1]))

    def gemm_of(self, direction: str) -> tuple[int, int, int]:
        """The implicit GEMM's ``(M, N, K)`` of ``direction``: :attr:`gemm` for fprop;
        ``(N * prod(spatial), C, K * prod(kernel))`` for dgrad (the input's pixels by its
        channels; with strides above 1 each pixel reduces over only the taps whose
        window reaches it, so the work stays :attr:`flops`); ``(K, C * prod(kernel),
        N * prod(out))`` for wgrad (the filter, with a reduction over every output
        pixel)."""
        if direction == "dgrad":
            return (self.act[0] * prod(self.act[1:-1]), self.act[-1],
                    self.flt[0] * prod(self.flt[1:-1]))
        if direction == "wgrad":
            return (self.flt[0], self.act[-1] * prod(self.flt[1:-1]),
                    self.act[0] * prod(self.out))
        return self.gemm

    @property
    def flops(self) -> int:
        """``2 M N K`` (the same for the three directions)."""
        m, n, k = self.gemm
        return 2 * m * n * k

    @property
    def layout(self) -> str:
        """The tuning database's layout of the problem family: the window and how it
        moves (``"nhwc r3x3 s1x1 p1x1 d1x1"``); the sizes are ``(M, N, K)``."""
        names = {1: "nwc", 2: "nhwc", 3: "ndhwc"}[self.spatial]
        def join(v: Sequence[int]) -> str:
            return "x".join(map(str, v))
        return (f"{names} r{join(self.flt[1:-1])} s{join(self.stride)} p{join(self.pad)} "
                f"d{join(self.dilation)}")

    def issue(self, kernel: ConvKernel) -> str:
        """Why ``kernel`` cannot take this problem (``""`` when it can, as far as pyc_lab
        can tell before CUTLASS's own ``can_implement``)."""
        if self.spatial != kernel.spatial:
            return f"{self.spatial} spatial axes, the kernel has {kernel.spatial}"
        if kernel.hopper_refusal:
            return kernel.hopper_refusal
        c, k = self.act[-1], self.flt[0]
        if c % kernel.align or k % kernel.align:
            return (f"{c} input and {k} output channels; {kernel.dtype} kernels need "
                    f"multiples of {kernel.align} (16-byte TMA rows)")
        if any(v <= 0 for v in self.out):
            return f"the window does not fit (output {self.out})"
        if max(self.gemm[0], self.act[0] * prod(self.act[1:])) >= 2**31:
            return "more than 2^31 output or input pixels"
        if kernel.direction == "dgrad" and any(s != 1 for s in self.stride):
            return (f"stride {self.stride}: CUTLASS's Hopper dgrad takes unit strides "
                    "(the CUTLASS 2 family runs strided ones)")
        return ""

    def arrays(self) -> tuple[Any, ...]:
        """The five int arrays the C functions take."""
        return tuple((ctypes.c_int * len(v))(*v) for v in
                     (self.act, self.flt, self.pad, self.stride, self.dilation))


def conv_configs(geometry: ConvGeometry, kernel: ConvKernel, sm_count: int = 132
                 ) -> list[ConvConfig]:
    """The configurations worth building for a problem, best first by a cheap model.

    Tiles wider than the output channels rounded up to 64 are dropped (they compute
    padding); the rest are ranked by the fraction of the last wave's CTAs that do work
    and, among equals, by larger tiles (more reuse per byte); the 2-CTA clusters
    (multicast of the filter along M, of the activations along N) follow each tile.
    """
    m, n, _ = geometry.gemm_of(kernel.direction)
    k_tile = K_BYTES // ELEMENT_BYTES[kernel.dtype]
    widest = max(64, -(-n // 64) * 64)
    scored = []
    for tm, tn in TILES:
        if tn > widest:
            continue
        ctas = -(-m // tm) * -(-n // tn)
        waves = -(-ctas // sm_count)
        fill = ctas / (waves * sm_count)
        waste = (-(-n // tn) * tn - n) / (-(-n // tn) * tn)
        score = fill * (1 - waste) * (1.0 if ctas >= sm_count else 0.8) \
            + 0.02 * (tm * tn) / (128 * 256)
        for ci, (cm, cn) in enumerate(CLUSTERS):
            if -(-m // tm) % cm or -(-n // tn) % cn:
                continue
            scored.append((score - 0.01 * ci, ConvConfig((tm, tn, k_tile), (cm, cn))))
    scored.sort(key=lambda t: -t[0])
    return [cfg for _, cfg in scored]


def _declare_conv(lib: ctypes.CDLL) -> None:
    vp, ip, c_int = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int
    geo = [ip] * 5
    lib.pyc_conv_can_implement.argtypes = geo
    lib.pyc_conv_can_implement.restype = c_int
    lib.pyc_conv_workspace_size.argtypes = [*geo, c_int]
    lib.pyc_conv_workspace_size.restype = ctypes.c_ulonglong
    lib.pyc_conv_create.restype = vp
    lib.pyc_conv_destroy.argtypes = [vp]
    lib.pyc_conv_initialize.argtypes = [vp, *geo, vp, vp, vp, vp, vp, c_int, vp]
    lib.pyc_conv_initialize.restype = c_int
    lib.pyc_conv_run.argtypes = [vp, vp]
    lib.pyc_conv_run.restype = c_int
    lib.pyc_conv_has_bias.restype = c_int
    lib.pyc_conv_spatial.restype = c_int
    lib.pyc_conv_op.restype = c_int
    if hasattr(lib, "pyc_conv_has_residual"):  # CUTLASS 2 libraries
        lib.pyc_conv_has_residual.restype = c_int
        lib.pyc_conv_set_residual.argtypes = [vp, vp]
        lib.pyc_conv_set_residual.restype = None


@dataclass
class CutlassConv:
    """A built convolution kernel, launched on device pointers.

    ``conv.run(geometry, x, w, bias, y, stream)`` binds the problem and its pointers on
    the first call with them (TMA descriptors are made on the host then) and afterwards
    only launches; the pointers are raw device addresses (``int``), so CuPy arrays and
    torch tensors go through the same call. ``x`` is ``(N, *spatial, C)``, ``w``
    ``(K, *kernel, C)`` and ``y`` ``(N, *out, K)``, all contiguous in the kernel's dtype;
    ``bias`` a ``(K,)`` vector when the kernel has one. The geometry is always the
    forward problem's; a gradient kernel takes its own operands in those two pointer
    places and writes its result to the third (:meth:`ConvKernel.operands`:
    ``dy, w -> dx`` for dgrad, ``dy, x -> dw`` for wgrad).

    A family whose kernels address a tensor with 32-bit byte offsets
    (:attr:`max_tensor_bytes`) runs a forward or dgrad problem with a larger operand as
    several launches over slices of the batch (each image's result depends on that image
    alone); a wgrad, which reduces over the batch, is refused.
    """

    #: The most bytes one operand of a launch may hold (``None``: no limit of pyc_lab's).
    max_tensor_bytes: ClassVar[int | None] = None

    library: Path
    config: ConvConfig | None = None
    kernel: ConvKernel = field(default_factory=ConvKernel)
    sm_count: int = 0
    _lib: Any = field(default=None, repr=False)
    _handle: Any = field(default=None, repr=False)
    _bound: tuple | None = field(default=None, repr=False)
    _workspace: Any = field(default=None, repr=False)
    _problems: dict[ConvGeometry, tuple[tuple[Any, ...], bool]] = field(
        default_factory=dict, repr=False)
    _lock: Any = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self._lib = load_library(Path(self.library), _declare_conv)
        residual = bool(self._lib.pyc_conv_has_residual()) \
            if hasattr(self._lib, "pyc_conv_has_residual") else False
        if self._lib.pyc_conv_spatial() != self.kernel.spatial or \
                bool(self._lib.pyc_conv_has_bias()) != self.kernel.bias or \
                residual != self.kernel.residual or \
                self._lib.pyc_conv_op() != DIRECTIONS[self.kernel.direction]:
            raise PycLabError(f"{self.library} is not a {self.kernel.op} kernel")
        if not self.sm_count:
            from ...hardware.device import require_cupy

            cp = require_cupy("CutlassConv")
            self.sm_count = int(cp.cuda.Device().attributes["MultiProcessorCount"])
        self._handle = self._lib.pyc_conv_create()

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order
        lib, handle = getattr(self, "_lib", None), getattr(self, "_handle", None)
        if lib is not None and handle:
            lib.pyc_conv_destroy(handle)

    def _problem_of(self, geometry: ConvGeometry) -> tuple[tuple[Any, ...], int]:
        """The C arrays of ``geometry`` and its workspace pointer, checked and made once
        per problem (a call with new pointers only binds them)."""
        known = self._problems.get(geometry)
        if known is None:
            why = self._issue(geometry)
            if why:
                raise PycLabError(f"CUTLASS {self.kernel.op}: {why}")
            size = self.workspace_bytes(geometry)
            # one workspace, grown for a problem that needs more (a batch's slices run in
            # turn on one stream, so they may share it)
            if size and (self._workspace is None or self._workspace.nbytes < size):
                import cupy as cp

                self._workspace = cp.empty(int(size), dtype=cp.uint8)
            if len(self._problems) >= 8:  # a kernel meets a few problems: keep it bounded
                self._problems.clear()
            known = self._problems[geometry] = (geometry.arrays(), bool(size))
        arrays, needs_workspace = known
        return arrays, self._workspace.data.ptr if needs_workspace else 0

    def slices(self, geometry: ConvGeometry) -> list[tuple[int, ConvGeometry]]:
        """The launches of ``geometry``: ``(first image, the slice's geometry)`` each —
        the whole problem in one, unless an operand holds more than
        :attr:`max_tensor_bytes`.

        Raises
        ------
        PycLabError
            A wgrad over more (its reduction runs over the batch), or one image alone
            over the limit.
        """
        limit = self.max_tensor_bytes
        n = geometry.act[0]
        if limit is None or n <= 1:
            return [(0, geometry)]
        item = ELEMENT_BYTES[self.kernel.dtype]
        per_image = max(prod(shape[1:]) for shape in (geometry.act, geometry.out_shape)) * item
        if per_image * n <= limit:
            return [(0, geometry)]
        if self.kernel.direction == "wgrad" or per_image > limit:
            what = ("a wgrad reduces over the batch" if self.kernel.direction == "wgrad"
                    else "one image's tensor is over it")
            raise PycLabError(f"CUTLASS {self.kernel.op} {geometry}: an operand of more "
                              f"than {limit} bytes ({what}); pl.conv uses cuDNN for it")
        parts = -(-n // (limit // per_image))
        size = -(-n // parts)  # slices as equal as they can be: at most two geometries
        return [(first, replace(geometry, act=(min(size, n - first), *geometry.act[1:])))
                for first in range(0, n, size)]

    def workspace_bytes(self, geometry: ConvGeometry) -> int:
        """Bytes of device workspace the kernel needs for ``geometry`` (asked of the
        library on the host; nothing is allocated): its largest slice's
        (:meth:`slices`)."""
        try:
            parts = {g for _, g in self.slices(geometry)}
        except PycLabError:
            parts = {geometry}
        return max(int(self._lib.pyc_conv_workspace_size(*g.arrays(), self.sm_count))
                   for g in parts)

    def _issue(self, geometry: ConvGeometry) -> str:
        """Why the kernel cannot take ``geometry`` (``""`` when it can), by pyc_lab's
        checks; a kernel family with other constraints overrides this."""
        return geometry.issue(self.kernel)

    def can_implement(self, geometry: ConvGeometry) -> bool:
        """Whether the kernel takes the problem (pyc_lab's checks, then CUTLASS's)."""
        if self._issue(geometry):
            return False
        try:
            parts = {g for _, g in self.slices(geometry)}
        except PycLabError:
            return False
        return all(self._lib.pyc_conv_can_implement(*g.arrays()) == 0 for g in parts)

    def run(self, geometry: ConvGeometry, x: int, w: int, bias: int | None, y: int,
            stream: int, residual: int | None = None) -> None:
        """Compute ``y = act(conv(x, w) + bias [+ residual])`` on ``stream``
        (``residual``: a residual kernel's tensor of ``y``'s shape; it may be ``y``
        itself, each element read before it is written).

        Raises
        ------
        PycLabError
            A bias or residual missing or given where the kernel has none, a problem the
            kernel cannot take, or CUTLASS refusing to initialise or launch.
        """
        for name, given, has in (("bias", bias, self.kernel.bias),
                                 ("residual", residual, self.kernel.residual)):
            if (given is not None) != has:
                raise PycLabError(f"{self.kernel.op}: a {name} is "
                                  f"{'needed' if has else 'not taken'}")
        parts = self.slices(geometry)
        if len(parts) == 1:
            self._launch(geometry, x, w, bias, y, stream, residual)
            return
        item = ELEMENT_BYTES[self.kernel.dtype]
        first_op, _, result = self.kernel.operands(geometry)  # batch-major, both
        step_in = prod(first_op[1:]) * item
        step_out = prod(result[1:]) * item
        for first, part in parts:
            self._launch(part, x + first * step_in, w, bias, y + first * step_out, stream,
                         None if residual is None else residual + first * step_out)

    def _launch(self, geometry: ConvGeometry, x: int, w: int, bias: int | None, y: int,
                stream: int, residual: int | None = None) -> None:
        """One launch of the kernel on ``geometry`` (bound once per pointers)."""
        key = (geometry, x, w, bias, y, residual)
        with self._lock:
            if key != self._bound:
                arrays, workspace = self._problem_of(geometry)
                if self.kernel.residual:
                    self._lib.pyc_conv_set_residual(self._handle, residual)
                st = self._lib.pyc_conv_initialize(self._handle, *arrays, x, w, bias or 0,
                                                   y, workspace, self.sm_count, stream)
                if st != 0:
                    self._bound = None
                    name = self.config.id if self.config else self.library
                    raise PycLabError(f"CUTLASS {self.kernel.op} {name} refused the problem "
                                      f"{geometry} (status {st})")
                self._bound = key
            st = self._lib.pyc_conv_run(self._handle, stream)
        if st != 0:
            raise PycLabError(f"CUTLASS {self.kernel.op} launch failed (status {st})")
