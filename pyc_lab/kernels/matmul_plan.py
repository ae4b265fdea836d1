"""Matmul plans: the implementation chosen once for a problem, launched many times.

:func:`build_launch` decides, for validated operands (CuPy or NumPy arrays; torch
tensors are viewed as one of them first), what runs — the tuned CUTLASS kernel when the
never-slower rule lets it (:mod:`.matmul_route`), else the library path — and returns a
:class:`Launch` that holds no arrays: ``pl.matmul`` memoises one per problem signature.
:class:`MatmulPlan` is the object ``pl.matmul_plan`` returns: a launch bound to an
``out`` and a bias, whose call checks only that the operands have the shapes, strides
and dtypes it was made for.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from ..errors import PycLabError
from . import matmul_launch as launch
from .arrays import (
    cupy_of_torch,
    dtype_name,
    kind,
    numpy_of_torch,
    result_dtype,
    torch_of,
    torch_raw_stream,
    torch_stream,
)
from .gemm_replays import GraphReplays
from .lt_tuned import FAMILY as LT_FAMILY
from .matmul_inputs import result_shape
from .matmul_route import library_path
from .raced import RacedGemm

log = logging.getLogger(__name__)

__all__ = ["TUNED_DTYPES", "Direct", "Launch", "MatmulPlan", "build_launch", "direct_for",
           "operand_layout"]

#: Array dtypes with tuned kernels, and their kernel dtype (float32 -> "tf32" with tf32=True).
TUNED_DTYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}

#: ``tuned(m, n, k, dtype, layout, epilogue) -> (kernel or None, why, extra)``.
TunedLookup = Callable[..., tuple[Any, str, dict[str, Any]]]


def operand_layout(a: Any, b: Any) -> str:
    """``a``/``b``'s memory order in BLAS letters (``"tn"``...), or ``""`` if strided."""
    la = "t" if a.flags.c_contiguous else "n" if a.flags.f_contiguous else ""
    lb = "t" if b.flags.c_contiguous else "n" if b.flags.f_contiguous else ""
    return la + lb if la and lb else ""


class Direct:
    """A library GEMM of one fixed problem issued straight to cuBLAS or cuBLASLt
    (:mod:`.blas_direct`): a call passes three pointers and the caller's stream.

    Attributes
    ----------
    gemm
        The :class:`~.blas_direct.CublasGemm` or :class:`~.blas_direct.LtGemm`.
    shape, dtype
        The product's shape and dtype name (for a new output).
    device
        The CUDA device the problem was made on.
    extents
        Bytes spanned by ``a``, ``b`` and ``out`` (an ``out`` overlapping an operand
        goes to the array library, which copies).
    """

    __slots__ = ("_replays", "device", "dtype", "extents", "gemm", "shape")

    def __init__(self, gemm: Any, shape: tuple[int, ...], dtype: str, device: int,
                 extents: tuple[int, int, int]) -> None:
        self.gemm = gemm
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.extents = extents
        self._replays: GraphReplays | None = None

    @property
    def replays(self) -> GraphReplays:
        """The problem's CUDA-graph replays (:mod:`.gemm_replays`), made on first use and
        shared by ``pl.matmul`` calls with an ``out`` and the plans of the problem."""
        if self._replays is None:
            self._replays = GraphReplays(self.gemm, self.device)
        return self._replays

    def _overlaps(self, pa: int, pb: int, po: int) -> bool:
        ea, eb, eo = self.extents
        return (po < pa + ea and pa < po + eo) or (po < pb + eb and pb < po + eo)

    def cupy(self, a: Any, b: Any, out: Any, replays: GraphReplays | None = None) -> Any:
        """Run on CuPy arrays (into ``out`` or a new array) on CuPy's current stream;
        ``None`` (nothing run) when ``out`` overlaps an operand. With ``replays``
        (:attr:`replays`) the call goes through them (a new result at an earlier one's
        address replays too)."""
        import cupy as cp

        if cp.cuda.runtime.getDevice() != self.device:
            with cp.cuda.Device(self.device):
                return self.cupy(a, b, out, replays)
        pa, pb = a.data.ptr, b.data.ptr
        if out is None:  # the pool often hands back an earlier result's address
            out = cp.empty(self.shape, dtype=a.dtype)
        elif self._overlaps(pa, pb, out.data.ptr):
            return None
        run = self.gemm if replays is None else replays
        run(pa, pb, out.data.ptr, cp.cuda.get_current_stream().ptr)
        return out

    def torch(self, a: Any, b: Any, out: Any, replays: GraphReplays | None = None) -> Any:
        """Run on CUDA torch tensors (into ``out`` or a new tensor) on torch's current
        stream; ``None`` (nothing run) when ``out`` overlaps an operand. ``replays`` as
        for :meth:`cupy`."""
        import cupy as cp
        import torch

        if cp.cuda.runtime.getDevice() != self.device:
            with cp.cuda.Device(self.device):
                return self.torch(a, b, out, replays)
        pa, pb = a.data_ptr(), b.data_ptr()
        if out is None:
            out = torch.empty(self.shape, dtype=a.dtype, device=a.device)
        elif self._overlaps(pa, pb, out.data_ptr()):
            return None
        run = self.gemm if replays is None else replays
        run(pa, pb, out.data_ptr(), torch_raw_stream(self.device))
        return out


def _extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> int:
    """Bytes from an array's first element to the end of its last (non-negative strides)."""
    return sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) * itemsize + itemsize


def _elements(x: Any) -> tuple[int, ...] | None:
    """A CuPy array's strides in elements (``None`` if one is not a whole element)."""
    size = x.dtype.itemsize
    st = tuple(s // size for s in x.strides)
    return st if all(s * size == t for s, t in zip(st, x.strides, strict=True)) else None


def direct_for(a: Any, b: Any, out: Any, impl: str, alpha: float, beta: float,
               result: str, race: bool = False, *, tf32: bool = False,
               setting: Any = None) -> Direct | None:
    """The :class:`Direct` form of a plain library GEMM on CuPy arrays, or ``None`` where
    it has none (nvmath-python missing, dtypes that differ, operands that are not BLAS
    matrices); the array-library launch runs those.

    With ``race`` (not with ``beta``), the call is a :class:`~.raced.RacedGemm` where a
    second way may be faster, decided on the first call: for a 2-D problem whose extents
    or leading dimensions are not 16-byte aligned, the GEMM on aligned, zero-padded
    copies (:mod:`.padded`); for a large float16/bfloat16 problem, the other library.
    ``tf32``: float32 products on TF32 tensor cores. ``setting``: a tuned cuBLASLt
    pick (:class:`~.lt_algos.LtPick`) for ``impl="cublaslt"``; it is not
    raced (the tuner measured it against both libraries).
    """
    from . import blas_direct, blas_layout, cublaslt

    if impl not in ("cublas", "cublaslt") or not cublaslt.status()[0]:
        return None
    da, db = dtype_name(a.dtype), dtype_name(b.dtype)
    if da != db or da != result or result not in blas_direct.CUDA_DTYPES:
        return None
    shape = result_shape(tuple(a.shape), tuple(b.shape))
    if out is not None and (dtype_name(out.dtype) != result or tuple(out.shape) != shape):
        return None
    sa, sb = _elements(a), _elements(b)
    if out is None:
        so: tuple[int, ...] | None = tuple(
            int(math.prod(shape[i + 1:])) for i in range(len(shape)))
    else:
        so = _elements(out)
    if sa is None or sb is None or so is None:
        return None
    gemm = blas_layout.describe(tuple(a.shape), sa, tuple(b.shape), sb, so)
    if isinstance(gemm, str):
        return None
    make = blas_direct.CublasGemm if impl == "cublas" else blas_direct.LtGemm
    scale_c = beta if out is not None else 0.0
    try:
        g = (blas_direct.LtGemm(gemm, result, alpha, scale_c, tf32, setting=setting)
             if setting is not None else make(gemm, result, alpha, scale_c, tf32))
    except Exception as exc:  # a library that cannot be loaded: the array path runs
        log.info("no direct %s call for this GEMM: %s", impl, exc)
        return None
    size = a.dtype.itemsize
    if race and setting is None and (out is None or not beta):
        g = _raced(g, gemm, a, b, (sa, sb, so), impl, alpha, result)
    extents = (_extent(tuple(a.shape), sa, size), _extent(tuple(b.shape), sb, size),
               _extent(shape, so, size))
    return Direct(g, shape, result, a.device.id, extents)


def _raced(g: Any, gemm: Any, a: Any, b: Any, strides: tuple, impl: str, alpha: float,
           result: str) -> Any:
    """``g``, or a :class:`~.raced.RacedGemm` of ``g`` and a challenger (see
    :func:`direct_for`)."""
    from . import blas_direct, padded

    sa, sb, so = strides
    try:
        plan = padded.pad_plan(tuple(a.shape), sa, tuple(b.shape), sb, so, a.dtype.itemsize)
        if plan is not None:
            return RacedGemm(g, padded.PaddedGemm(plan, result, impl, alpha), name="padded",
                             margin=padded.MARGIN, min_ms=padded.MIN_MS,
                             detail=f"{plan.why}; the GEMM on aligned copies "
                                    f"({plan.m_pad}x{plan.n_pad}x{plan.k_pad}) took")
        flop = 2.0 * gemm.m * gemm.n * gemm.k * gemm.batch
        if result in ("float16", "bfloat16") and flop >= blas_direct.MEASURE_FLOP:
            other = blas_direct.CublasGemm if impl == "cublaslt" else blas_direct.LtGemm
            what = ("cuBLAS (cublasGemmEx, as cupy.matmul issues it)" if impl == "cublaslt"
                    else "cuBLASLt's measured algorithm")
            return RacedGemm(g, other(gemm, result, alpha, 0.0), name="library",
                             margin=blas_direct.MEASURE_MARGIN, detail=f"{what} took")
    except Exception as exc:  # no second way: the library call alone
        log.info("no challenger for this GEMM: %s", exc)
    return g


class Launch:
    """What runs for one problem signature: ``run(a, b, out, bias)`` and why.

    Attributes
    ----------
    run
        The launcher (:mod:`.matmul_launch`).
    choice
        ``{"impl", "reason", ...}``: the implementation and why (a tuned kernel adds
        ``config``, ``epilogue`` and ``match``).
    stamp
        The tuning-database stamp the choice was made under (``None`` when the database
        was not asked: NumPy, float64, batched...).
    direct
        The same library GEMM as a :class:`Direct` call (plain GEMMs whose operands are
        BLAS matrices), which ``pl.matmul`` and plans run instead of ``run``; or ``None``.
    """

    __slots__ = ("choice", "direct", "run", "stamp")

    def __init__(self, run: Callable[..., Any], choice: dict[str, Any],
                 stamp: Any = None, direct: Direct | None = None) -> None:
        self.run = run
        self.choice = choice
        self.stamp = stamp
        self.direct = direct


def _fold(a: Any, b: Any) -> tuple[int, int] | None:
    """``(B*M, K)`` when a C-contiguous 3-D ``a`` times a 2-D ``b`` is one 2-D GEMM."""
    if a.ndim == 3 and b.ndim == 2 and a.flags.c_contiguous:
        return (a.shape[0] * a.shape[1], a.shape[2])
    return None


def build_launch(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any,
                 activation: str | None, tf32: bool, tuned: TunedLookup,
                 stamp: Callable[[], Any], epilogue_of: Callable[..., Any]) -> Launch:
    """Choose what runs ``activation(alpha * a @ b + beta * out + bias)``.

    Parameters
    ----------
    a, b, out, alpha, beta, bias, activation, tf32
        Validated arguments of :func:`pyc_lab.matmul` (CuPy or NumPy arrays).
    tuned
        The tuned-kernel lookup (the never-slower rule applied), called only for CuPy
        operands of one dtype with tuned kernels, 2-D (or folded) and in a BLAS layout.
    stamp
        The tuning database's current stamp (kept with a choice that asked it).
    epilogue_of
        ``epilogue_of(has_bias, activation)``: the CUTLASS epilogue key.
    """
    da, db = dtype_name(a.dtype), dtype_name(b.dtype)
    result = result_dtype(da, db)
    shape = result_shape(tuple(a.shape), tuple(b.shape))
    if kind(a) == "numpy":
        return Launch(launch.numpy_runner(result, alpha, beta, activation),
                      {"impl": "numpy", "reason": "NumPy arrays run on the CPU"})
    from . import cublaslt

    if 0 in shape or a.shape[-1] == 0 or a.ndim == 1 or b.ndim == 1 or a.ndim > 3 \
            or b.ndim > 3:
        return Launch(launch.cublas_runner(result, shape, alpha, beta, activation),
                      {"impl": "cublas", "reason": "cuBLAS (cupy.matmul): vector, empty "
                                                   "or many-batch operands"})
    fold = _fold(a, b)
    a2 = fold if fold else tuple(a.shape)
    plain = alpha == 1.0 and not (beta and out is not None)
    epi = epilogue_of(bias is not None, activation)
    why_tuned = ""
    extra: dict[str, Any] = {}
    stamp_now = None
    kdtype = TUNED_DTYPES.get(da)
    if kdtype == "f32" and tf32:
        kdtype = "tf32"
    out_ok = out is None or dtype_name(out.dtype) == result
    if kdtype is None or db != da:
        why_tuned = f"dtypes {da} @ {db}: tuned kernels take one of {sorted(TUNED_DTYPES)}"
    elif len(a2) != 2 or b.ndim != 2:
        why_tuned = "batched: tuned kernels are 2-D"
    elif not out_ok:
        why_tuned = f"out of dtype {dtype_name(out.dtype)}"
    else:
        layout = operand_layout(a, b)
        if not layout:
            why_tuned = "a strided operand (neither C- nor F-contiguous)"
        else:
            stamp_now = stamp()
            kernel, why_tuned, extra = tuned(a2[0], b.shape[1], a2[1], kdtype, layout, epi)
            if kernel is not None:
                run = launch.cutlass_runner(kernel, result, shape, fold, alpha, beta)
                config = kernel.config.id if getattr(kernel, "config", None) else None
                impl = getattr(kernel, "family", "cutlass")  # "skinny" for pyc_lab's own
                # a tuned cuBLASLt setting is a library call: issued directly like one
                direct = (direct_for(a, b, out, "cublaslt", alpha, beta, result,
                                     setting=kernel.config)
                          if impl == LT_FAMILY and bias is None else None)
                return Launch(run, {"impl": impl, "reason": why_tuned, "config": config,
                                    "epilogue": epi.name, **extra}, stamp_now, direct)
    # the library path
    fused_why = plain_why = None
    if bias is not None or activation is not None:
        fused_why = "alpha/beta given" if not plain else cublaslt.why_not(
            a2, tuple(b.shape), da, db, result, None if bias is None else tuple(bias.shape),
            None if bias is None else bias.dtype, activation)
    elif not plain:
        plain_why = "alpha/beta given"
    elif not out_ok:
        plain_why = f"out of dtype {dtype_name(out.dtype)}"
    elif da != db:
        plain_why = f"mixed dtypes {da} @ {db}"
    else:
        plain_why = cublaslt.why_not_plain(a2, tuple(b.shape), da)
    batched = len(a2) == 3 or b.ndim == 3
    impl, why = library_path(result, fused_why, plain_why or "", batched)
    if impl == "cublaslt" and fused_why == "":
        gemm = cublaslt.FusedGemm(activation, bias is not None)
        run = launch.fused_runner(gemm, result, shape, fold)
        why = (f"bias/activation in cuBLASLt's epilogue "
               f"({cublaslt.EPILOGUES[(bias is not None, activation)]})")
    elif impl == "cublaslt":
        run = launch.lt_runner(cublaslt.LtMatmul(), result, shape, fold)
    else:
        run = launch.cublas_runner(result, shape, alpha, beta, activation)
    direct = None
    if bias is None and activation is None and not (impl == "cublaslt" and not plain):
        direct = direct_for(a, b, out, impl, alpha, beta, result, race=True)
    reason = f"{why_tuned}; {why}" if why_tuned else why
    choice = {"impl": impl, "reason": reason, **extra}
    if direct is not None and isinstance(direct.gemm, RacedGemm):
        choice[direct.gemm.name] = "to be measured on the first call"
        direct.gemm.choice = choice
    return Launch(run, choice, stamp_now, direct)


def capturable_launch(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any,
                      activation: str | None, chosen: Launch) -> Launch:
    """``chosen``, or where it runs cuBLAS through CuPy, the same GEMM through cuBLASLt.

    CuPy refuses cuBLAS calls while a stream is being captured into a CUDA graph; a
    cuBLAS GEMM issued directly (:class:`Direct`, with a workspace of its own) and a
    plain cuBLASLt GEMM can be captured, and so can CUTLASS and cuBLASLt choices.

    Raises
    ------
    PycLabError
        When the GEMM needs CuPy's cuBLAS path (an epilogue cuBLASLt cannot fuse,
        alpha/beta, mixed dtypes, no nvmath-python, ...): what was wrong and what to do.
    """
    if chosen.choice["impl"] != "cublas":
        return chosen
    if chosen.direct is not None:
        return Launch(chosen.run, {**chosen.choice, "reason": chosen.choice["reason"]
                                   + "; cuBLAS called directly with a workspace of its own, "
                                   "so the call can be captured"},
                      chosen.stamp, chosen.direct)
    from . import cublaslt

    da, db = dtype_name(a.dtype), dtype_name(b.dtype)
    fold = _fold(a, b)
    a2 = fold if fold else tuple(a.shape)
    result = result_dtype(da, db)
    why = ""
    if bias is not None or activation is not None:
        why = "a bias or activation cuBLASLt cannot fuse here"
    elif alpha != 1.0 or (beta and out is not None):
        why = "alpha/beta given"
    elif da != db:
        why = f"mixed dtypes {da} @ {db}"
    elif out is not None and dtype_name(out.dtype) != result:
        why = f"out of dtype {dtype_name(out.dtype)}"
    else:
        why = cublaslt.why_not_plain(a2, tuple(b.shape), da)
    if why:
        raise PycLabError(f"matmul_plan(capturable=True): this GEMM runs cuBLAS through "
                          f"CuPy, which CuPy does not allow inside a CUDA-graph capture, "
                          f"and cuBLASLt cannot take it ({why}); leave capturable off, or "
                          "compute the epilogue outside the captured plan")
    shape = result_shape(tuple(a.shape), tuple(b.shape))
    return Launch(launch.lt_runner(cublaslt.LtMatmul(), result, shape, fold),
                  {"impl": "cublaslt", "reason": "capturable=True: cuBLASLt through "
                   "nvmath-python (CuPy refuses cuBLAS calls inside a stream capture); "
                   f"otherwise {chosen.choice['reason']}"})


class MatmulPlan:
    """``activation(alpha * a @ b + beta * out + bias)`` chosen once, run many times.

    Made by :func:`pyc_lab.matmul_plan`. A call checks only that ``a`` and ``b`` have the
    shapes, strides and dtypes the plan was made for, then launches the chosen kernel:
    with the plan's (or the call's) ``out`` it writes there, allocates nothing and does
    not synchronise, so it can be captured in a CUDA graph (a first, uncaptured call
    sets up cuBLASLt's workspace and a CUTLASS kernel's binding). A direct library call
    into an ``out`` whose addresses (``a``, ``b``, ``out`` and the stream) repeat is
    replayed from a CUDA graph of its own (:mod:`.gemm_replays`).

    Attributes
    ----------
    choice : dict
        ``{"impl", "reason", ...}``: what runs and why.
    kind : str
        ``"cupy"``, ``"numpy"`` or ``"torch"``: the operands it takes and returns.
    replays : GraphReplays or None
        The problem's graph replays, shared with ``pl.matmul`` calls into an ``out``
        (``None`` when it has no direct library call, or was made with
        ``graphs=False``).
    """

    def __init__(self, launch_: Launch, array_kind: str, signature: tuple, out: Any,
                 bias: Any, shape: tuple[int, ...], dtype: str,
                 torch_signature: tuple | None = None, graphs: bool = True) -> None:
        self._launch = launch_
        self.kind = array_kind
        self._sig = signature
        self._tsig = torch_signature
        self._direct = launch_.direct if bias is None else None
        self.replays = (self._direct.replays
                        if graphs and self._direct is not None else None)
        self.out = out
        self.bias = bias
        self.shape = shape
        self.dtype = dtype

    @property
    def choice(self) -> dict[str, Any]:
        """What runs and why (``impl``, ``reason``; ``config``, ``match`` for CUTLASS)."""
        return dict(self._launch.choice)

    def explain(self) -> str:
        """One paragraph: the problem, the implementation and why."""
        c = self._launch.choice
        extra = "".join(f"\n  {k}: {v}" for k, v in c.items() if k not in ("impl", "reason"))
        r = self.replays
        if r is not None:
            extra += (f"\n  graphs: a call repeating its addresses replays a CUDA graph "
                      f"({r.captures} captured, {r.graphs} held)"
                      + (f"; {r.refused}" if r.refused else ""))
        return (f"matmul plan for {self.kind} operands -> {self.shape} {self.dtype}\n"
                f"  runs: {c['impl']}\n  why: {c['reason']}{extra}")

    def __repr__(self) -> str:
        return (f"MatmulPlan({self.kind}, {'x'.join(map(str, self.shape))} {self.dtype}, "
                f"impl={self._launch.choice['impl']!r})")

    def _check(self, a: Any, b: Any) -> None:
        if (a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype) != self._sig:
            shp, _st, dt, shp_b, _st_b, dt_b = self._sig
            raise PycLabError(f"this matmul plan was made for a {tuple(shp)} {dt} and b "
                              f"{tuple(shp_b)} {dt_b} with their strides; got a "
                              f"{tuple(a.shape)} {a.dtype}, b {tuple(b.shape)} {b.dtype} "
                              "(or other strides): make a plan for them "
                              "(pl.matmul_plan(a, b, ...))")

    def __call__(self, a: Any, b: Any, *, out: Any = None, bias: Any = None) -> Any:
        """Run the plan on ``a`` and ``b`` (into ``out``, else the plan's ``out``, else a
        new array), with ``bias`` (else the plan's)."""
        out = self.out if out is None else out
        direct = self._direct
        if direct is not None and bias is None:
            if self.kind == "cupy":
                self._check(a, b)
                y = direct.cupy(a, b, out, self.replays)
            elif (a.shape, a.stride(), a.dtype, a.device, a.requires_grad, b.shape,
                  b.stride(), b.dtype, b.device, b.requires_grad) == self._tsig:
                y = direct.torch(a, b, out, self.replays)
            else:
                y = None
            if y is not None:
                return y
        bias = self.bias if bias is None else bias
        if self.kind != "torch":
            self._check(a, b)
            try:
                return self._launch.run(a, b, out, bias)
            except NotImplementedError as exc:
                if "capture" not in str(exc):
                    raise
                raise PycLabError("this matmul plan runs cuBLAS through CuPy, which CuPy "
                                  "does not allow inside a CUDA-graph capture; make the "
                                  "plan with pl.matmul_plan(..., capturable=True) (cuBLASLt "
                                  "through nvmath-python)") from exc
        if not a.is_cuda:
            a2, b2 = numpy_of_torch(a), numpy_of_torch(b)
            self._check(a2, b2)
            o2 = None if out is None else numpy_of_torch(out)
            b_ = None if bias is None else (numpy_of_torch(bias) if kind(bias) == "torch"
                                             else bias)
            y = self._launch.run(a2, b2, o2, b_)
            return out if out is not None else torch_of(y)
        import cupy as cp

        with cp.cuda.Device(a.device.index), torch_stream(a.device.index):
            a2, b2 = cupy_of_torch(a), cupy_of_torch(b)
            self._check(a2, b2)
            o2 = None if out is None else cupy_of_torch(out)
            b_ = None if bias is None else (cupy_of_torch(bias) if kind(bias) == "torch"
                                             else bias)
            y = self._launch.run(a2, b2, o2, b_)
            return out if out is not None else torch_of(y)
