"""GEMMs whose operands are not 16-byte aligned, run on aligned, zero-padded copies.

cuBLAS and cuBLASLt run their Hopper kernels (TMA loads, warpgroup MMA) only when every
matrix's contiguous extent and leading dimension are multiples of 16 bytes; otherwise
they take kernels several times slower, and so does ``torch.matmul``, which calls them.
On the H200 (``benchmarks/exp_padded_gemm.py``, results in
``benchmarks/results/h200/padded-gemm.json``) a bfloat16 LM head of 32001 outputs at
2048 tokens took 5.2 ms and the same product with its extents rounded up to multiples
of 8 elements 0.66 ms; rounding up only the leading dimensions, the extents unchanged,
did not help: the extents themselves must be aligned.

:func:`pad_plan` works out from shapes and strides alone what to round up and copy:

- an extent is rounded up to a multiple of ``V = 16 / itemsize`` elements when it is the
  contiguous extent of an operand or of the product: ``N`` always (the product is
  row-major), ``K`` when ``a`` is row-major or ``b`` column-major, ``M`` when ``a`` is
  column-major;
- an operand is copied into zero-padded scratch when its padded shape differs from its
  shape or its leading dimension is not a multiple of ``V``. Zeros in both operands'
  padded ``K`` leave every sum unchanged (the zeros meet zeros, never a NaN or an
  infinity); the product's padded rows and columns are computed and dropped;
- a column-major ``b`` (``a @ w.T``: a linear layer's weights) whose only fault is an
  unaligned ``N`` is not copied, since at decode time the weights are most of the bytes:
  its first ``N - N % V`` rows are the aligned body of the GEMM, read in place, and its
  last ``N % V`` rows are copied into a ``V``-row tail that a second GEMM multiplies;
- the product goes to aligned scratch and is copied out when its columns are padded or
  its leading dimension is unaligned.

The copies are the kernels of ``native/pad_copy.cuh`` (16-byte stores, NVRTC-compiled
once per device and element size). :class:`PaddedGemm` runs a plan with the library GEMM
(:class:`~.blas_direct.CublasGemm` or :class:`~.blas_direct.LtGemm`) on scratch memory
kept per device and stream (:func:`~.blas_direct.scratch`). ``pl.matmul`` holds it
beside the direct library call in a :class:`~.raced.RacedGemm`: the first call times
both on the caller's operands and keeps the padded GEMM only when it is at least
:data:`MARGIN` faster and the direct call takes at least :data:`MIN_MS` (below that, the
copies' launches cost more host time than the GPU time they save); inside a CUDA-graph
capture the direct call runs, so that no graph records the shared scratch memory.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from ..errors import PycLabError
from ..paths import native_source
from . import arrays, blas_direct
from .blas_layout import describe, matrix_form
from .nvrtc import compile_module

__all__ = ["MARGIN", "MIN_MS", "VEC_BYTES", "Copy", "PadPlan", "PaddedGemm", "Part", "Unpad",
           "pad_plan"]

log = logging.getLogger(__name__)

#: The alignment the libraries' fast kernels need, in bytes.
VEC_BYTES = 16
#: How much faster than the direct call the padded GEMM must measure to be kept.
MARGIN = 0.05
#: The direct call's GPU milliseconds below which the padded GEMM is never kept.
MIN_MS = 0.05
#: Threads per block of the copy kernels.
THREADS = 256
#: The unsigned type that carries an element of each size as raw bits.
ELEMENT_TYPES = {2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
#: Scratch regions start at multiples of this many bytes.
_ALIGN_SCRATCH = 256

_FUNCTIONS: dict[tuple[int, str], tuple[Any, Any, Any]] = {}
_LOCK = threading.Lock()

#: Where a matrix of a plan lives: ``("a" | "b" | "out", element offset)`` into the
#: caller's arrays, or ``("scratch", byte offset)``.
Ref = tuple[str, int]


@dataclass(frozen=True)
class Copy:
    """One padding copy into scratch: ``lines`` lines of ``length`` elements of the
    operand ``source`` (starting ``offset`` elements in, line stride ``ld``) into
    ``dst_lines`` lines of ``dst_length`` elements at byte ``at`` of the scratch (line
    stride ``dst_length``), zeros beyond the source."""

    source: str
    offset: int
    ld: int
    lines: int
    length: int
    dst_lines: int
    dst_length: int
    at: int


@dataclass(frozen=True)
class Part:
    """One library GEMM of a plan: row-major ``out = a @ b`` with these shapes and
    element strides, each matrix found at its :data:`Ref`."""

    a: Ref
    a_shape: tuple[int, int]
    a_strides: tuple[int, int]
    b: Ref
    b_shape: tuple[int, int]
    b_strides: tuple[int, int]
    out: Ref
    out_strides: tuple[int, int]


@dataclass(frozen=True)
class Unpad:
    """The product's copy out of scratch: ``lines`` rows of ``length`` elements at byte
    ``at`` (row stride ``ld``) into the caller's ``out`` (row stride ``out_ld``)."""

    at: int
    ld: int
    lines: int
    length: int
    out_ld: int


@dataclass(frozen=True)
class PadPlan:
    """What :class:`PaddedGemm` does for one problem (see :func:`pad_plan`).

    Attributes
    ----------
    m, n, k
        The problem.
    m_pad, n_pad, k_pad
        The extents the library GEMM runs.
    itemsize
        Bytes per element.
    copies, parts, unpad
        The copies into scratch, the GEMMs, the copy out (``None``: the GEMM writes
        ``out``).
    scratch_bytes
        Scratch memory the plan uses.
    why
        What was unaligned, in words.
    """

    m: int
    n: int
    k: int
    m_pad: int
    n_pad: int
    k_pad: int
    itemsize: int
    copies: tuple[Copy, ...]
    parts: tuple[Part, ...]
    unpad: Unpad | None
    scratch_bytes: int
    why: str


def _up(x: int, v: int) -> int:
    return -(-x // v) * v


def pad_plan(a_shape: tuple[int, ...], a_strides: tuple[int, ...],
             b_shape: tuple[int, ...], b_strides: tuple[int, ...],
             out_strides: tuple[int, ...], itemsize: int) -> PadPlan | None:
    """The padding plan of a 2-D row-major ``out = a @ b``, or ``None`` where there is
    nothing to pad (every contiguous extent and leading dimension a multiple of 16 bytes)
    or no plan (batched, empty, not BLAS matrices, an element size without a copy
    kernel).

    Parameters
    ----------
    a_shape, a_strides, b_shape, b_strides
        ``a`` (M x K) and ``b`` (K x N), strides in elements.
    out_strides
        The product's strides in elements (its rows unit-stride).
    itemsize
        Bytes per element (2, 4 or 8).
    """
    if len(a_shape) != 2 or len(b_shape) != 2 or len(out_strides) != 2 \
            or itemsize not in ELEMENT_TYPES:
        return None
    m, k = a_shape
    k_b, n = b_shape
    if k != k_b or min(m, n, k) < 1 or (out_strides[1] != 1 and n > 1):
        return None
    form_a = matrix_form(m, k, a_strides[0], a_strides[1])
    form_b = matrix_form(k, n, b_strides[0], b_strides[1])
    if isinstance(form_a, str) or isinstance(form_b, str):
        return None
    (a_row, lda), (b_row, ldb) = form_a, form_b
    ldo = out_strides[0] if m > 1 else n
    v = VEC_BYTES // itemsize
    m_pad = _up(m, v) if not a_row else m
    k_pad = _up(k, v) if a_row or not b_row else k
    n_pad = _up(n, v)
    # operands as lines: (lines, length) as they are and as the GEMM reads them
    a_lines, a_len, a_plines, a_plen = (m, k, m_pad, k_pad) if a_row else (k, m, k_pad, m_pad)
    b_lines, b_len, b_plines, b_plen = (k, n, k_pad, n_pad) if b_row else (n, k, n_pad, k_pad)
    copy_a = (a_plines, a_plen) != (a_lines, a_len) or lda % v != 0
    tail = not b_row and n_pad != n and k_pad == k and ldb % v == 0
    copy_b = not tail and ((b_plines, b_plen) != (b_lines, b_len) or ldb % v != 0)
    copy_out = n_pad != n or m_pad != m or (m > 1 and ldo % v != 0)
    if not (copy_a or copy_b or copy_out):
        return None
    used = 0

    def take(nbytes: int) -> int:
        nonlocal used
        at = used
        used += _up(nbytes, _ALIGN_SCRATCH)
        return at

    copies: list[Copy] = []
    a_ref: Ref = ("a", 0)
    a_str = (a_strides[0], a_strides[1])
    if copy_a:
        at = take(a_plines * a_plen * itemsize)
        copies.append(Copy("a", 0, lda, a_lines, a_len, a_plines, a_plen, at))
        a_ref, a_str = ("scratch", at), ((a_plen, 1) if a_row else (1, a_plen))
    b_ref: Ref = ("b", 0)
    b_str = (b_strides[0], b_strides[1])
    if copy_b:
        at = take(b_plines * b_plen * itemsize)
        copies.append(Copy("b", 0, ldb, b_lines, b_len, b_plines, b_plen, at))
        b_ref, b_str = ("scratch", at), ((b_plen, 1) if b_row else (1, b_plen))
    out_ref: Ref = ("out", 0)
    out_str = (ldo, 1)
    unpad = None
    if copy_out:
        at = take(m_pad * n_pad * itemsize)
        out_ref, out_str = ("scratch", at), (n_pad, 1)
        unpad = Unpad(at, n_pad, m, n, ldo)
    a_part = (a_ref, (m_pad, k_pad), a_str)
    if tail:
        body = n - n % v
        t_at = take(v * k * itemsize)
        copies.append(Copy("b", body * ldb, ldb, n - body, k, v, k, t_at))
        parts = [] if body == 0 else [Part(*a_part, b_ref, (k, body), b_str, out_ref, out_str)]
        parts.append(Part(*a_part, ("scratch", t_at), (k, v), (1, k),
                          ("scratch", out_ref[1] + body * itemsize), out_str))
    else:
        parts = [Part(*a_part, b_ref, (k_pad, n_pad), b_str, out_ref, out_str)]
    faults = [f"{name} {x} not a multiple of {v}" for name, x, padded in
              (("M", m, m_pad), ("N", n, n_pad), ("K", k, k_pad)) if padded != x]
    faults += [f"{name}'s leading dimension {ld} not a multiple of {v}" for name, ld, bad in
               (("a", lda, lda % v != 0), ("b", ldb, ldb % v != 0),
                ("out", ldo, m > 1 and ldo % v != 0)) if bad]
    return PadPlan(m, n, k, m_pad, n_pad, k_pad, itemsize, tuple(copies), tuple(parts),
                   unpad, max(used, _ALIGN_SCRATCH), "; ".join(faults))


def _functions(device: int, element: str) -> tuple[Any, Any, Any]:
    """The pad, unpad and flat-unpad kernels for one element type on ``device``."""
    key = (device, element)
    fns = _FUNCTIONS.get(key)
    if fns is None:
        names = [f"pyc_pad_lines<{element}>", f"pyc_unpad_lines<{element}>",
                 f"pyc_unpad_flat<{element}>"]
        with _LOCK:
            try:
                module = compile_module(native_source("pad_copy.cuh"), ("-std=c++17",),
                                        names, "the padding copies")
                fns = tuple(module.get_function(name) for name in names)
            except Exception as exc:
                raise PycLabError(f"the padding copies did not compile (NVRTC: "
                                  f"{type(exc).__name__}: {exc})"[:500]) from exc
            _FUNCTIONS[key] = fns  # type: ignore[assignment]
    return fns  # type: ignore[return-value]


def _stream(device: int, ptr: int) -> Any:
    """A CuPy stream object over a ``cudaStream_t`` (memoised)."""
    return arrays.cupy_stream(ptr, device)


def _threads(length: int, v: int) -> int:
    """Threads a block for lines of ``length`` elements: enough for one pass, in warps."""
    return min(THREADS, max(32, _up(-(-length // v), 32)))


class PaddedGemm:
    """One :class:`PadPlan` run with a library GEMM: copies, GEMM(s), copy out.

    Parameters
    ----------
    plan
        From :func:`pad_plan`.
    dtype
        The operands' and product's dtype name (one of
        :data:`~.blas_direct.CUDA_DTYPES`).
    impl
        ``"cublas"`` or ``"cublaslt"``: the library that runs the aligned GEMMs.
    alpha
        Scale of the product (``beta`` is 0: the product's old value is not read).

    Raises
    ------
    PycLabError
        For a part the library cannot describe (not expected for a plan's parts).
    """

    #: A graph must not record it: its copies live in scratch shared per stream.
    capturable = False

    def __init__(self, plan: PadPlan, dtype: str, impl: str, alpha: float = 1.0) -> None:
        make = blas_direct.CublasGemm if impl == "cublas" else blas_direct.LtGemm
        gemms = []
        for part in plan.parts:
            g = describe(part.a_shape, part.a_strides, part.b_shape, part.b_strides,
                         part.out_strides)
            if isinstance(g, str):
                raise PycLabError(f"padded GEMM {plan.m}x{plan.n}x{plan.k}: {g}")
            gemms.append(make(g, dtype, alpha, 0.0))
        self.plan = plan
        self.dtype = dtype
        self.impl = impl
        self._gemms = tuple(zip(plan.parts, gemms, strict=True))
        self._element = ELEMENT_TYPES[plan.itemsize]
        self._v = VEC_BYTES // plan.itemsize

    def __call__(self, a_ptr: int, b_ptr: int, out_ptr: int, stream: int) -> None:
        """Launch on ``stream`` (a ``cudaStream_t``) of the current device; no sync."""
        import cupy as cp
        import numpy as np

        device = cp.cuda.runtime.getDevice()
        plan, v = self.plan, self._v
        base, _size = blas_direct.scratch(device, stream, plan.scratch_bytes)
        pad, unpad_lines, unpad_flat = _functions(device, self._element)
        s = _stream(device, stream)
        ptrs = {"a": a_ptr, "b": b_ptr, "out": out_ptr}

        def where(ref: Ref) -> int:
            return base + ref[1] if ref[0] == "scratch" else ptrs[ref[0]] + ref[1] * plan.itemsize

        for c in plan.copies:
            threads = _threads(c.dst_length, v)
            grid = (max(1, min(-(-c.dst_length // (v * threads)), 65535)),
                    max(1, min(c.dst_lines, 65535)))
            pad(grid, (threads,), (np.uint64(ptrs[c.source] + c.offset * plan.itemsize),
                                   np.int64(c.ld), np.int32(c.lines), np.int32(c.length),
                                   np.uint64(base + c.at), np.int64(c.dst_length),
                                   np.int32(c.dst_lines), np.int32(c.dst_length)), stream=s)
        for part, gemm in self._gemms:
            gemm(where(part.a), where(part.b), where(part.out), stream)
        u = plan.unpad
        if u is None:
            return
        if (u.out_ld == u.length or u.lines == 1) and out_ptr % VEC_BYTES == 0:
            vectors = -(-(u.lines * u.length) // v)
            blocks = max(1, min(-(-vectors // THREADS), 1 << 16))
            unpad_flat((blocks,), (THREADS,), (np.uint64(base + u.at), np.int64(u.ld),
                                               np.uint64(out_ptr), np.int32(u.lines),
                                               np.int32(u.length)), stream=s)
        else:
            threads = _threads(u.length, v)
            grid = (max(1, min(-(-u.length // (v * threads)), 65535)),
                    max(1, min(u.lines, 65535)))
            unpad_lines(grid, (threads,), (np.uint64(base + u.at), np.int64(u.ld),
                                           np.uint64(out_ptr), np.int64(u.out_ld),
                                           np.int32(u.lines), np.int32(u.length)), stream=s)
