"""pyc_lab's CUTLASS 2 convolutions (Ampere-class): the family for what TMA cannot load.

The Hopper kernels of :mod:`.conv` read the activations with TMA's im2col mode, which
needs every channel row to be a multiple of 16 bytes: ``C`` a multiple of 8 half-precision
elements. A network's stem (``C = 3`` RGB pixels) and any layer with unaligned channels
has no TMA descriptor, so this family runs them: CUTLASS 2's implicit-GEMM forward
convolution (``cutlass::conv::kernel::DefaultConv2dFprop`` under
``cutlass::conv::device::ImplicitGemmConvolution``) with ``mma.sync`` tensor cores fed by
``cp.async`` multistage pipelines (or, with two stages, by register-staged loads), built
for ``cutlass::arch::Sm80`` and compiled for sm_90a (or sm_80 and up) like every other
CUTLASS kernel here. Its activation iterators load ``align`` elements per access, down to
one, and the ``few_channels`` / ``fixed_channels`` iterators fold the filter window into
the reduction so that a ``C`` of 3 does not spend a whole K tile per filter tap.

The source is fixed text, ``native/cutlass_conv_2x.cuh``, under ``#define`` s that
:func:`emit_conv2x_source` writes; it is built by the one nvcc path
(:func:`~pyc_lab.kernels.cutlass.nvcc.build_source`) into the hash-verified kernel cache,
and its ``extern "C"`` functions are those of the Hopper kernels, so
:class:`~pyc_lab.kernels.cutlass.conv.CutlassConv` loads and launches it;
:class:`CutlassConv2x` only swaps pyc_lab's pre-checks (channels a multiple of ``align``,
not of 8). The kernel is :class:`~pyc_lab.kernels.cutlass.conv.ConvKernel` (dtype, 1 or 2
spatial axes, bias, activation) plus the access widths, which depend on the problem's
channels rather than on the dtype: they are carried explicitly (``align`` for the
activations and filter, ``align_out`` for the output and bias). A configuration is
:class:`Conv2xConfig`: CTA and warp tiles, pipeline stages, iterator.

Constraints (CUTLASS's, checked by :meth:`Conv2xConfig.issue` before nvcc or
``can_implement``): ``align`` divides ``C``; ``fixed_channels`` needs ``C == align``;
more than two stages use ``cp.async``, which moves 4, 8 or 16 bytes, so one-element
accesses of a 16-bit type need two stages; ``align_out`` divides ``K``; ``groups == 1``.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from math import prod
from pathlib import Path
from typing import Any

from ...errors import PycLabError
from ...paths import native_source
from ..cache import KernelCache
from .config import ACTIVATIONS
from .conv import CONV_DTYPES, ELEMENT_BYTES, VECTOR_ELEMENTS, ConvGeometry, ConvKernel, CutlassConv
from .nvcc import BuildResult, build_parallel, build_source, cached_library

__all__ = ["ITERATORS", "Conv2xConfig", "CutlassConv2x", "build_conv2x", "build_conv2x_many",
           "cached_conv2x", "conv2x_align", "conv2x_configs", "conv2x_grad_configs",
           "conv2x_pad", "conv2x_widths", "emit_conv2x_source", "geometry_issue",
           "padded_geometry"]

#: The iterator algorithms (CUTLASS 2's ``cutlass::conv::IteratorAlgorithm``).
ITERATORS = {"analytic": "kAnalytic", "optimized": "kOptimized",
             "few_channels": "kFewChannels", "fixed_channels": "kFixedChannels"}
#: The K of one ``mma.sync``: m16n8k16 for 16-bit types, m16n8k8 for tf32.
_MMA_K = {"f16": 16, "bf16": 16, "tf32": 8, "f32": 8}
#: The MMA operator of a dtype other than CUTLASS's default (``OpMultiplyAdd``): float32
#: at its own accuracy runs three TF32 MMAs per product ("3xTF32", big and small parts).
_MATH = {"f32": "cutlass::arch::OpMultiplyAddFastF32"}
#: Shared memory a CTA may use: sm_80's opt-in maximum (163 KiB), so that a kernel built
#: here also fits an A100 (sm_90 allows 227 KiB).
_SMEM_BYTES = 163 * 1024
#: The K tile, in bytes of a row (32 half or 16 tf32 elements), as CUTLASS 2's own sm80
#: convolutions mostly use.
K_BYTES = 64



def conv2x_align(dtype: str, channels: int) -> int:
    """The widest access (elements, at most 16 bytes) that divides ``channels``.

    Parameters
    ----------
    dtype
        ``"f16"``, ``"bf16"``, ``"tf32"`` or ``"f32"``.
    channels
        The input channels ``C`` (or, for the epilogue's width, the output channels).

    Returns
    -------
    int
        8, 4, 2 or 1 (at most 4 for tf32 and f32): what the kernel's ``PYC_ALIGN`` should be for
        the fastest loads the problem allows.
    """
    return next(a for a in (8, 4, 2, 1) if a <= VECTOR_ELEMENTS[dtype] and channels % a == 0)


@dataclass(frozen=True)
class Conv2xConfig:
    """A CUTLASS 2 convolution configuration: CTA tile ``(M, N, K)``, warp tile
    ``(M, N, K)``, pipeline stages and activation iterator, and ``pad_to``: the channels
    the kernel reads, the input and filter zero-padded to them on each call (``0``: as
    given). Padding a stem's 3 channels to 4 buys 8-byte ``cp.async`` accesses and the
    fixed-channels iterator for a third more reduction work; it is a search dimension,
    since whether that pays depends on the problem. ``split_k`` cuts the reduction into
    that many slices, run by as many CTAs per output tile that add their parts in turn
    (serial split-K): a wgrad's reduction runs over every output pixel while its output,
    the filter, is a few tiles."""

    tile: tuple[int, int, int] = (128, 128, 32)
    warp: tuple[int, int, int] = (64, 64, 32)
    stages: int = 3
    iterator: str = "optimized"
    pad_to: int = 0
    split_k: int = 1

    @property
    def id(self) -> str:
        """``conv2x_t128x128x32_w64x64x32_s3_optimized`` (``..._c4`` with ``pad_to=4``,
        ``..._k8`` with ``split_k=8``): the tuning database's config id."""
        return (f"conv2x_t{'x'.join(map(str, self.tile))}_w{'x'.join(map(str, self.warp))}"
                f"_s{self.stages}_{self.iterator}" + (f"_c{self.pad_to}" if self.pad_to
                                                      else "")
                + (f"_k{self.split_k}" if self.split_k > 1 else ""))

    @property
    def reads_outside_window(self) -> bool:
        """Whether the kernel reads pixels outside the filter window: the few- and
        fixed-channels iterators fold the window into the reduction and round it up to
        the K tile, and CUTLASS masks those extra taps' filter values to zero but not
        their pixels (their ``valid()`` checks the image bounds only). A finite pixel
        adds ``0 * x = 0``; a NaN or infinite one turns an output NaN that must not be,
        so :func:`~pyc_lab.kernels.conv_cutlass.kernel_call` runs such a kernel inside
        :mod:`~pyc_lab.kernels.conv_guard`'s check and fix-up."""
        return self.iterator in ("few_channels", "fixed_channels")

    def channels(self, channels: int) -> int:
        """The channels the kernel reads for a problem with ``channels`` input channels."""
        return self.pad_to or channels

    @property
    def warps(self) -> int:
        """Warps per CTA (the CTA tile over the warp tile)."""
        return prod(t // w for t, w in zip(self.tile, self.warp, strict=True))

    def to_dict(self) -> dict[str, Any]:
        """The configuration as the tuning database stores it."""
        return {"tile": "x".join(map(str, self.tile)), "warp": "x".join(map(str, self.warp)),
                "stages": self.stages, "iterator": self.iterator, "pad_to": self.pad_to,
                "split_k": self.split_k}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Conv2xConfig:
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        PycLabError
            ``d`` is not such a configuration.
        """
        try:
            tile = tuple(int(v) for v in str(d["tile"]).split("x"))
            warp = tuple(int(v) for v in str(d["warp"]).split("x"))
            stages, iterator = int(d["stages"]), str(d["iterator"])
            pad_to = int(d.get("pad_to") or 0)
            split_k = 1 if d.get("split_k") is None else int(d["split_k"])
        except (KeyError, ValueError, TypeError) as exc:
            raise PycLabError(f"not a CUTLASS 2 convolution configuration: {d!r}") from exc
        if len(tile) != 3 or len(warp) != 3 or iterator not in ITERATORS or pad_to < 0 \
                or split_k < 1:
            raise PycLabError(f"not a CUTLASS 2 convolution configuration: {d!r}")
        return cls(tile, warp, stages, iterator, pad_to, split_k)  # type: ignore[arg-type]

    def build_issue(self, kernel: ConvKernel, align: int, align_out: int | None = None
                    ) -> str:
        """Why this configuration cannot be compiled for ``kernel`` with accesses of
        ``align`` elements (``""`` when it can): what nvcc would otherwise spend a minute
        or two to refuse."""
        if kernel.spatial not in (1, 2):
            return (f"CUTLASS 2 convolutions here take 1 or 2 spatial axes, not "
                    f"{kernel.spatial}")
        if self.iterator not in ITERATORS:
            return f"iterator {self.iterator!r} is not one of {sorted(ITERATORS)}"
        if kernel.direction != "fprop" and self.iterator not in ("analytic", "optimized"):
            return (f"the {self.iterator} iterator is a forward one; {kernel.direction} "
                    "takes analytic or optimized")
        if kernel.direction != "fprop" and self.pad_to:
            return f"channel padding is a forward matter, not {kernel.direction}'s"
        if self.split_k > 1 and kernel.direction != "wgrad":
            return "split-K is offered for wgrad (the long reduction) only"
        if kernel.residual and self.reads_outside_window:
            return (f"the {self.iterator} iterator reads pixels outside the window, whose "
                    "fix-up for NaN and infinity adds no residual; a residual kernel takes "
                    "analytic or optimized")
        size, vector = ELEMENT_BYTES[kernel.dtype], VECTOR_ELEMENTS[kernel.dtype]
        align_out = align_out or vector
        for name, a in (("align", align), ("align_out", align_out)):
            if a not in (1, 2, 4, 8) or a > vector:
                return (f"{name} {a}: an access is 1, 2, 4 or 8 {kernel.dtype} elements "
                        f"of at most 16 bytes")
        if any(v <= 0 for v in (*self.tile, *self.warp)) or \
                any(t % w for t, w in zip(self.tile, self.warp, strict=True)):
            return f"warp tile {self.warp} does not divide CTA tile {self.tile}"
        wm, wn, wk = self.warp
        if wm % 16 or wn % 8 or wk % _MMA_K[kernel.dtype]:
            return (f"warp tile {self.warp}: mma.sync needs M a multiple of 16, N of 8 and "
                    f"K of {_MMA_K[kernel.dtype]} for {kernel.dtype}")
        if not 1 <= self.warps <= 8:
            return f"{self.warps} warps per CTA; 1 to 8 are supported"
        if not 2 <= self.stages <= 8:
            return f"{self.stages} stages; 2 to 8 are supported"
        if self.stages > 2 and align * size < 4:
            return (f"{self.stages} stages load by cp.async (4, 8 or 16 bytes); accesses of "
                    f"{align * size} bytes ({align} {kernel.dtype}) need 2 stages")
        tm, tn, tk = self.tile
        smem = self.stages * (tm + tn) * tk * size
        if smem > _SMEM_BYTES:
            return f"{smem} bytes of shared memory; at most {_SMEM_BYTES}"
        return ""

    def issue(self, kernel: ConvKernel, channels: int, align: int | None = None,
              out_channels: int | None = None, align_out: int | None = None) -> str:
        """Why this configuration cannot run ``kernel`` on ``channels`` input channels
        (``""`` when it can, as far as pyc_lab can tell before CUTLASS's
        ``can_implement``).

        Parameters
        ----------
        kernel
            The dtype, spatial axes, bias and activation.
        channels
            The activations' ``C`` (before any ``pad_to``).
        align
            Elements per activation and filter access; the widest that divides the
            channels read (:func:`conv2x_align`) when not given.
        out_channels, align_out
            The filter's ``K`` and the epilogue's access width (16 bytes when not given),
            checked when ``out_channels`` is given.

        A gradient kernel's operands are the output gradient (``K`` channels) and the
        filter or the input (``C``), so ``align`` must divide both; its result (the
        input's or the filter's gradient) has ``C`` channels, which ``align_out`` must
        divide.
        """
        if kernel.direction != "fprop":
            align = align or conv2x_align(kernel.dtype, math.gcd(channels,
                                                                 out_channels or channels))
            why = self.build_issue(kernel, align, align_out)
            if why:
                return why
            align_out = align_out or VECTOR_ELEMENTS[kernel.dtype]
            if channels <= 0 or channels % align or (out_channels or channels) % align:
                return (f"{channels} input and {out_channels} output channels are not "
                        f"multiples of align {align}")
            if channels % align_out:
                return (f"{channels} input channels (the gradient's) are not a multiple of "
                        f"align_out {align_out}")
            return ""
        if self.pad_to and self.pad_to <= channels:
            return f"pad_to {self.pad_to} does not widen {channels} input channels"
        channels = self.channels(channels)
        align = align or conv2x_align(kernel.dtype, channels)
        why = self.build_issue(kernel, align, align_out)
        if why:
            return why
        if channels <= 0 or channels % align:
            return f"{channels} input channels are not a multiple of align {align}"
        if self.iterator == "fixed_channels" and channels != align:
            return (f"the fixed_channels iterator needs C == align; C is {channels}, align "
                    f"{align}")
        align_out = align_out or VECTOR_ELEMENTS[kernel.dtype]
        if out_channels is not None and out_channels % align_out:
            return (f"{out_channels} output channels are not a multiple of align_out "
                    f"{align_out}")
        return ""


def conv2x_pad(dtype: str, channels: int) -> int:
    """The channels to zero-pad a problem's input to (``0``: none): the next power of two
    for fewer channels than one 16-byte access holds, when that is not ``channels``
    itself. A power of two is an access width, so the padded problem loads with wider
    ``cp.async`` accesses and may take the fixed-channels iterator.

    Parameters
    ----------
    dtype
        ``"f16"``, ``"bf16"``, ``"tf32"`` or ``"f32"``.
    channels
        The activations' ``C``.
    """
    if channels <= 0 or channels >= VECTOR_ELEMENTS[dtype] or not channels & (channels - 1):
        return 0
    return 1 << channels.bit_length()


def conv2x_configs(kernel: ConvKernel, channels: int, out_channels: int | None = None
                   ) -> list[Conv2xConfig]:
    """A short ranked list of configurations worth building for ``channels`` inputs.

    Few channels (less than 16 bytes of them per pixel, the stem's case) take the
    ``fixed_channels`` iterator first when the channels read are an access width, then
    ``few_channels`` (both fold the filter window into the reduction), on tiles of 64
    output channels (a stem's ``K``); wider channels take the ``optimized`` iterator
    (precomputed masks, the fastest of CUTLASS 2's). Channels that are not a power of two
    are offered padded (:func:`conv2x_pad`) first — wider accesses — and then as they
    are. Accesses narrower than 4 bytes cannot use ``cp.async`` and run with two stages.
    Configurations :meth:`Conv2xConfig.issue` refuses are left out.

    Parameters
    ----------
    kernel
        The dtype, spatial axes, bias and activation.
    channels
        The activations' ``C``.
    out_channels
        The filter's ``K``, when known: tiles wider than it rounded up to 64 are dropped,
        and the epilogue's access width is the widest that divides it.
    """
    size = ELEMENT_BYTES[kernel.dtype]
    tk = K_BYTES // size
    widest = max(64, -(-out_channels // 64) * 64) if out_channels else None
    align_out = conv2x_align(kernel.dtype, out_channels) if out_channels else None
    configs = []
    for pad_to in dict.fromkeys((conv2x_pad(kernel.dtype, channels), 0)):
        read = pad_to or channels
        align = conv2x_align(kernel.dtype, read)
        deep = (3, 4) if align * size >= 4 else (2,)
        if read < VECTOR_ELEMENTS[kernel.dtype]:
            iterators = (("fixed_channels",) if read == align else ()) + ("few_channels",)
            shapes = (((128, 64), (64, 32)), ((64, 64), (32, 32)), ((128, 128), (64, 64)))
        else:
            iterators = ("optimized",)
            shapes = (((128, 128), (64, 64)), ((128, 64), (64, 32)), ((64, 64), (32, 32)),
                      ((256, 128), (64, 64)))
        for iterator in iterators:
            for (tm, tn), (wm, wn) in shapes:
                if widest is not None and tn > widest:
                    continue
                for stages in deep:
                    cfg = Conv2xConfig((tm, tn, tk), (wm, wn, tk), stages, iterator, pad_to)
                    if not cfg.issue(kernel, channels, align, out_channels, align_out):
                        configs.append(cfg)
    return configs


def conv2x_grad_configs(kernel: ConvKernel, geometry: ConvGeometry, sm_count: int = 132
                        ) -> list[Conv2xConfig]:
    """A ranked list of gradient configurations (``kernel.direction`` dgrad or wgrad) for
    the forward problem ``geometry``.

    Both take the ``optimized`` iterator (``analytic`` is its slower twin) on the tiles of
    wide channels; a dgrad runs CUTLASS's strided kernel, so any stride is taken. A
    wgrad's GEMM is the filter (``K`` by ``C * prod(kernel)``, often fewer tiles than the
    GPU has SMs) reduced over every output pixel, so each tile is offered with the
    serial split-K that brings its CTAs to about one wave (a power of two, at most 32,
    each slice at least 16 K tiles deep) and with half of that. Ranked by how well the
    CTAs fill the last wave times the share of each tile that is not padding, larger
    tiles first among equals.

    Parameters
    ----------
    kernel
        The gradient's kernel: dtype, spatial axes, ``direction`` ``"dgrad"`` or
        ``"wgrad"``.
    geometry
        The forward problem (its channels set the access widths, its sizes the splits).
    sm_count
        The GPU's SMs.

    Returns
    -------
    list of Conv2xConfig
        The configurations :meth:`Conv2xConfig.issue` accepts, best first.
    """
    size = ELEMENT_BYTES[kernel.dtype]
    tk = K_BYTES // size
    c, k = geometry.act[-1], geometry.flt[0]
    align, align_out = conv2x_align(kernel.dtype, math.gcd(c, k)), conv2x_align(kernel.dtype, c)
    m, n, depth = geometry.gemm_of(kernel.direction)
    deep = (3, 4) if align * size >= 4 else (2,)
    shapes = (((128, 128), (64, 64)), ((128, 64), (64, 32)), ((64, 64), (32, 32)),
              ((256, 128), (64, 64)))
    scored = []
    for (tm, tn), (wm, wn) in shapes:
        ctas = -(-m // tm) * -(-n // tn)
        splits = [1]
        if kernel.direction == "wgrad" and ctas < sm_count:
            most = 1 << (max(1, min(32, depth // (16 * tk))).bit_length() - 1)
            full = min(most, 1 << max(0, (-(-sm_count // ctas) - 1).bit_length()))
            splits = sorted({full, max(1, full // 2)}, reverse=True)
        used = (m / (-(-m // tm) * tm)) * (n / (-(-n // tn) * tn))  # not tile padding
        for split in splits:
            grid = ctas * split
            waves = -(-grid // sm_count)
            score = grid / (waves * sm_count) * used + 0.02 * (tm * tn) / (128 * 128)
            for stages in deep:
                cfg = Conv2xConfig((tm, tn, tk), (wm, wn, tk), stages, "optimized", 0, split)
                if not cfg.issue(kernel, c, align, k, align_out):
                    scored.append((score - 0.001 * stages, cfg))
    scored.sort(key=lambda t: -t[0])
    return [cfg for _, cfg in scored]


def emit_conv2x_source(config: Conv2xConfig, kernel: ConvKernel, align: int,
                       align_out: int | None = None) -> str:
    """The complete CUDA C++ of one CUTLASS 2 convolution and its ``extern "C"`` wrapper.

    Parameters
    ----------
    config
        Tiles, stages and iterator.
    kernel
        The dtype, spatial axes, bias and activation.
    align
        Elements per activation and filter access (must divide the problems' ``C``).
    align_out
        Elements per output and bias access (must divide ``K``); 16 bytes when not given.

    Raises
    ------
    PycLabError
        The configuration cannot be compiled (:meth:`Conv2xConfig.build_issue`).
    """
    align_out = align_out or VECTOR_ELEMENTS[kernel.dtype]
    why = config.build_issue(kernel, align, align_out)
    if why:
        raise PycLabError(f"CUTLASS 2 convolution {config.id}: {why}")
    act = ACTIVATIONS[kernel.activation] if kernel.activation else \
        "cutlass::epilogue::thread::Identity"
    defines = {**kernel.defines, "PYC_SPLIT_K": config.split_k,
               "PYC_ELEMENT": CONV_DTYPES[kernel.dtype], "PYC_ALIGN": align,
               "PYC_ALIGN_OUT": align_out, "PYC_SPATIAL": kernel.spatial,
               **{f"PYC_TILE_{a}": v for a, v in zip("MNK", config.tile, strict=True)},
               **{f"PYC_WARP_{a}": v for a, v in zip("MNK", config.warp, strict=True)},
               "PYC_STAGES": config.stages,
               "PYC_ITERATOR": f"cutlass::conv::IteratorAlgorithm::{ITERATORS[config.iterator]}",
               "PYC_BIAS": int(kernel.bias), "PYC_RESIDUAL": int(kernel.residual),
               "PYC_ACT": act,
               **({"PYC_MATH": _MATH[kernel.dtype]} if kernel.dtype in _MATH else {})}
    # the library does not depend on pad_to (the caller pads): one build serves both
    head = (f"// pyc_lab CUTLASS 2 convolution {kernel.op} {kernel.dtype} align {align}/"
            f"{align_out}: {replace(config, pad_to=0).id}\n")
    return head + "".join(f"#define {k} {v}\n" for k, v in defines.items()) + \
        native_source("cutlass_conv_2x.cuh")


def build_conv2x(config: Conv2xConfig, kernel: ConvKernel, align: int, cc: int = 90,
                 cache: KernelCache | None = None, timeout_s: float = 900.0,
                 align_out: int | None = None) -> BuildResult:
    """Build one CUTLASS 2 convolution into the kernel cache (or take it from there).

    The one nvcc path of every CUTLASS kernel (:func:`~.nvcc.build_source`: sm_90a for
    ``cc >= 90``, else ``sm_<cc>``); the kernels are Sm80 code, so ``cc`` must be 80 or
    more. A failure, a configuration that cannot compile included, is a result carrying
    the reason, never a raise.
    """
    if cc < 80:
        return BuildResult(config, "", None, "compile_error", 0.0,
                           f"CUTLASS 2 convolutions need sm_80 or newer; this is sm_{cc}")
    try:
        source = emit_conv2x_source(config, kernel, align, align_out)
    except PycLabError as exc:
        return BuildResult(config, "", None, "compile_error", 0.0, str(exc))
    return build_source(config, source, cc, cache, timeout_s,
                        meta={"config": config.to_dict(), "op": kernel.op,
                              "dtype": kernel.dtype, "family": "cutlass2x", "align": align,
                              "align_out": align_out or VECTOR_ELEMENTS[kernel.dtype]})


def geometry_issue(geometry: ConvGeometry) -> str:
    """Why no configuration of this family can take ``geometry`` whatever its channels
    (``""`` when one may): the kernels have 1 or 2 spatial axes, and the window must fit.
    Channel counts are each configuration's matter (:meth:`Conv2xConfig.issue`)."""
    if geometry.spatial not in (1, 2):
        return f"CUTLASS 2 convolutions here take 1 or 2 spatial axes, not {geometry.spatial}"
    if any(v <= 0 for v in geometry.out):
        return f"the window does not fit (output {geometry.out})"
    return ""


def conv2x_widths(config: Conv2xConfig, kernel: ConvKernel, channels: int,
                  out_channels: int) -> tuple[int, int]:
    """``(align, align_out)``: the access widths a problem with ``channels`` inputs and
    ``out_channels`` outputs is built with under ``config`` (the widest that divide the
    channels read and ``out_channels``; for a gradient kernel, the widest that divides
    both channel counts and the widest that divides ``channels``, its result's)."""
    if kernel.direction != "fprop":
        return (conv2x_align(kernel.dtype, math.gcd(channels, out_channels)),
                conv2x_align(kernel.dtype, channels))
    return (conv2x_align(kernel.dtype, config.channels(channels)),
            conv2x_align(kernel.dtype, out_channels))


def cached_conv2x(config: Conv2xConfig, kernel: ConvKernel, align: int, cc: int = 90,
                  cache: KernelCache | None = None, align_out: int | None = None
                  ) -> Path | None:
    """The kernel's library if it is in the kernel cache, else ``None``; never builds
    (what a first call of ``pl.conv`` may afford)."""
    if cc < 80 or config.build_issue(kernel, align, align_out):
        return None
    return cached_library(emit_conv2x_source(config, kernel, align, align_out), cc, cache)


def build_conv2x_many(configs: Sequence[Conv2xConfig], kernel: ConvKernel, channels: int,
                      out_channels: int, cc: int = 90, workers: int | None = None,
                      cache: KernelCache | None = None,
                      on_done: Callable[[BuildResult], None] | None = None
                      ) -> dict[Conv2xConfig, cf.Future]:
    """Start building ``configs`` for a problem with ``channels`` inputs and
    ``out_channels`` outputs (:func:`conv2x_widths`) on ``workers`` threads; a future
    per configuration, in the order given."""
    def one(cfg: Conv2xConfig) -> BuildResult:
        align, align_out = conv2x_widths(cfg, kernel, channels, out_channels)
        return build_conv2x(cfg, kernel, align, cc, cache, align_out=align_out)

    return build_parallel(configs, one, workers, on_done, "pyc-nvcc-conv2x")


def padded_geometry(geometry: ConvGeometry, channels: int) -> ConvGeometry:
    """``geometry`` with its input channels widened to ``channels`` (the zero-padded
    input and filter a ``pad_to`` configuration reads)."""
    return replace(geometry, act=(*geometry.act[:-1], channels),
                   flt=(*geometry.flt[:-1], channels))


@dataclass
class CutlassConv2x(CutlassConv):
    """A built CUTLASS 2 convolution, launched as :class:`~.conv.CutlassConv` launches the
    Hopper ones (same ``extern "C"`` functions, same ``run``), with the pre-checks of this
    family: ``C`` a multiple of ``align`` and ``K`` of ``align_out`` (the widths the
    library was built with), not TMA's multiples of 8. Its geometry is the one the
    kernel reads: a ``pad_to`` configuration's padded channels
    (:func:`padded_geometry`). Its iterators address a tensor with 32-bit byte offsets:
    a batch whose activations or output hold more runs in slices
    (:meth:`~.conv.CutlassConv.slices`).
    """

    max_tensor_bytes = 2**31 - 1

    align: int = 1
    align_out: int = 0

    def _issue(self, geometry: ConvGeometry) -> str:
        if geometry.spatial != self.kernel.spatial:
            return f"{geometry.spatial} spatial axes, the kernel has {self.kernel.spatial}"
        c, k = geometry.act[-1], geometry.flt[0]
        align_out = self.align_out or VECTOR_ELEMENTS[self.kernel.dtype]
        if isinstance(self.config, Conv2xConfig):  # the geometry is what the kernel reads
            why = replace(self.config, pad_to=0).issue(self.kernel, c, self.align, k,
                                                       align_out)
            if why:
                return why
        elif c % self.align or k % align_out:
            return (f"{c} input and {k} output channels; the kernel needs multiples of "
                    f"{self.align} and {align_out}")
        if self.kernel.direction == "dgrad" and any(d != 1 for d in geometry.dilation):
            return f"dilation {geometry.dilation}: CUTLASS's strided dgrad takes none"
        return geometry_issue(geometry)
