"""One GEMM problem issued straight to cuBLAS or cuBLASLt, for a few microseconds of host time.

``cupy.matmul`` re-derives the whole call from its arguments each time (15-20 us of
host time on the H200) and nvmath-python's ``Matmul.execute`` checks and re-binds its
operands (40-50 us). When a problem's shapes, strides and dtypes are fixed — a memoised
``pl.matmul`` signature or a matmul plan — all of that is known in advance:
:class:`CublasGemm` and :class:`LtGemm` hold the column-major description
(:mod:`.blas_layout`), the library handle, the scales and (for cuBLASLt) the chosen
algorithm, and a call passes only three pointers and a stream to the library through
nvmath-python's low-level bindings.

:class:`CublasGemm` makes exactly the call ``cupy.matmul`` makes (``cublasGemmEx`` or its
strided-batched form, float32 accumulation, ``CUBLAS_GEMM_DEFAULT_TENSOR_OP``), so the
same kernel runs. :class:`LtGemm` asks cuBLASLt's heuristic once per pointer-alignment
class (with the alignments as preferences, like nvmath-python's planner) and runs its
first algorithm. Both run on the caller's stream with a workspace owned per device and
stream (:func:`workspace`, grown to what a chosen algorithm needs), allocated outside any
graph capture, so a call allocates nothing and can be captured into a CUDA graph once
the stream has run it once.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import PycLabError
from . import arrays
from .blas_layout import OP_N, OP_T, BlasGemm

__all__ = ["CUDA_DTYPES", "OPERAND_DTYPES", "WORKSPACE_BYTES", "CublasGemm", "LtGemm",
           "alignment", "private_workspace", "race", "scratch", "workspace"]

log = logging.getLogger(__name__)

#: CUDA data-type codes (``cudaDataType``) of the dtypes issued directly.
CUDA_DTYPES = {"float16": 2, "bfloat16": 14, "float32": 0, "float64": 1}
#: Operand dtypes cuBLASLt takes here: those, and Hopper's two FP8 formats.
OPERAND_DTYPES = {**CUDA_DTYPES, "float8_e4m3fn": 28, "float8_e5m2": 29}
#: cuBLAS compute types: float32 accumulation, its TF32 tensor-core form, float64.
COMPUTE_32F, COMPUTE_32F_FAST_TF32, COMPUTE_64F = 68, 77, 70
#: ``CUBLAS_GEMM_DEFAULT_TENSOR_OP`` (what CuPy passes) and ``CUBLAS_GEMM_DEFAULT``.
ALGO_TENSOR_OP, ALGO_DEFAULT = 99, -1
#: The least workspace each (device, stream) gets: cuBLAS's recommendation for Hopper.
WORKSPACE_BYTES = 32 << 20
#: The most workspace cuBLASLt's heuristic may ask for (the stream's workspace grows to
#: what the chosen algorithm needs): a small limit steers it away from the algorithms
#: nvmath-python's planner (whose limit is most of the device) finds for large GEMMs.
MAX_LT_WORKSPACE = 1 << 30
#: For large problems the heuristic is also asked with this much workspace allowed (as
#: nvmath-python's planner allows most of the device), for :data:`WIDE_CANDIDATES` more
#: candidates: its picks there were the fastest on some large bfloat16 GEMMs of the
#: matmul sweep on the H200 (3 % ahead of both libraries' defaults at 16384x5120x13824).
WIDE_LT_WORKSPACE = 4 << 30
WIDE_CANDIDATES = 3
#: From this many floating-point operations up, cuBLASLt's first :data:`CANDIDATES`
#: algorithms are timed on the first call and the fastest kept (its heuristic's first
#: choice can be a few per cent slower on large GEMMs; measuring costs a dozen runs once).
MEASURE_FLOP = 2.0 ** 36
CANDIDATES = 6
#: A measured candidate replaces the heuristic's first only when this much faster.
MEASURE_MARGIN = 0.02
#: Bytes written before each measured run to evict the operands from L2 (H200: 50 MiB).
FLUSH_BYTES = 128 << 20
#: Streams with a workspace kept per device (the oldest is synchronised and freed).
MAX_STREAMS = 16

_LOCK = threading.Lock()
_WORKSPACES: OrderedDict[tuple[int, int], Any] = OrderedDict()
_SCRATCH: OrderedDict[tuple[int, int], Any] = OrderedDict()
_CUBLAS: dict[int, Any] = {}
_LT: dict[int, int] = {}


def alignment(ptr: int) -> int:
    """The largest power of two up to 256 dividing ``ptr`` (256 for null)."""
    return min(256, ptr & -ptr) if ptr else 256


def _device() -> int:
    import cupy as cp

    return cp.cuda.runtime.getDevice()


def _capturing(stream: int) -> bool:
    import cupy as cp

    return cp.cuda.runtime.streamIsCapturing(stream) != 0


def workspace(device: int, stream: int, need: int = 0) -> tuple[int, int]:
    """The workspace ``(pointer, bytes)`` for GEMMs on ``stream`` of ``device``, at least
    :data:`WORKSPACE_BYTES` and ``need`` bytes.

    Made (or grown, after the stream has finished what it queued on the old one) on first
    use of a stream or of a larger need — never during a stream capture: a
    :class:`~pyc_lab.errors.PycLabError` asks for one uncaptured call first. At most
    :data:`MAX_STREAMS` are kept; the oldest is freed after its device is synchronised
    (not its stream: that stream may have been destroyed since, and synchronising a
    destroyed stream crashes the process instead of raising).
    """
    return _stream_memory(_WORKSPACES, device, stream, max(WORKSPACE_BYTES, need),
                          "a GEMM's first call on this stream")


_shared_workspace = workspace


def scratch(device: int, stream: int, need: int) -> tuple[int, int]:
    """Scratch memory ``(pointer, bytes)`` of at least ``need`` bytes for work queued on
    ``stream`` of ``device`` (the aligned copies of :mod:`.padded`), kept per device and
    stream like :func:`workspace` and under the same rules: work on one stream runs in
    order, so each call may reuse the memory the previous one used."""
    return _stream_memory(_SCRATCH, device, stream, need,
                          "a padded GEMM's first call on this stream")


def _stream_memory(table: OrderedDict[tuple[int, int], Any], device: int, stream: int,
                   need: int, what: str) -> tuple[int, int]:
    """The entry of ``table`` for ``(device, stream)``, made or grown to ``need`` bytes
    (see :func:`workspace`)."""
    key = (device, stream)
    mem = table.get(key)
    if mem is not None and mem.size >= need:
        return mem.ptr, mem.size
    import cupy as cp

    if _capturing(stream):
        raise PycLabError(f"{what} is being captured into a CUDA graph, and its memory "
                          "cannot be allocated then; run it once on the stream before "
                          "capturing")
    with _LOCK:
        old = table.pop(key, None)
        if old is not None:
            _synchronise(device, stream)
        while len(table) >= MAX_STREAMS:
            (dev, _other), _mem = table.popitem(last=False)
            _synchronise_device(dev)
        mem = table[key] = cp.cuda.Memory(max(need, 1))
    return mem.ptr, mem.size


def _synchronise_device(device: int) -> None:
    """Wait for everything queued on ``device`` (before an evicted workspace is freed)."""
    import cupy as cp

    with cp.cuda.Device(device):
        cp.cuda.runtime.deviceSynchronize()


def _synchronise(device: int, stream: int) -> None:
    """Wait for ``stream`` (before its workspace is replaced by a larger one: the stream
    is the caller's, alive)."""
    import cupy as cp

    try:
        with cp.cuda.Device(device):
            arrays.cupy_stream(stream, device).synchronize()
    except Exception as exc:
        log.debug("synchronising stream %#x before freeing its workspace: %s", stream, exc)


def private_workspace(nbytes: int = WORKSPACE_BYTES) -> Any:
    """A cuBLAS workspace owned by the caller, outside the shared table, with this
    device's cuBLAS handle made now.

    A CUDA graph that records direct cuBLAS calls keeps their workspace pointer, so the
    program holding the graph must own that workspace for as long as it may be replayed:
    the shared table (:func:`workspace`) frees the oldest of more than
    :data:`MAX_STREAMS` streams, and a program's capture stream is its own. Neither the
    handle nor the workspace may be made during a capture, so both are made here, before.

    Returns
    -------
    cupy.cuda.Memory
        Pass ``(mem.ptr, mem.size)`` as the ``workspace`` of :meth:`CublasGemm.__call__`.
    """
    import cupy as cp

    _cublas(_device())
    return cp.cuda.Memory(max(WORKSPACE_BYTES, int(nbytes)))


class _Cublas:
    """A cuBLAS handle of one device and the stream and workspace it is set to."""

    def __init__(self) -> None:
        from nvmath.bindings import cublas

        self.lib = cublas
        self.handle = cublas.create()
        self.bound: tuple[int, int, int] = (-1, 0, 0)

    def on(self, device: int, stream: int, own: tuple[int, int] | None = None) -> int:
        ws, size = own if own is not None else workspace(device, stream)
        if (stream, ws, size) != self.bound:
            self.lib.set_stream(self.handle, stream)
            self.lib.set_workspace(self.handle, ws, size)
            self.bound = (stream, ws, size)
        return self.handle


def _cublas(device: int) -> _Cublas:
    h = _CUBLAS.get(device)
    if h is None:
        with _LOCK:
            h = _CUBLAS.get(device) or _Cublas()
            _CUBLAS[device] = h
    return h


def _scales(alpha: float, beta: float, compute: int) -> tuple[np.ndarray, np.ndarray]:
    dt = np.float64 if compute == COMPUTE_64F else np.float32
    return np.array([alpha], dtype=dt), np.array([beta], dtype=dt)


def _compute_type(dtype: str, tf32: bool) -> int:
    if dtype == "float64":
        return COMPUTE_64F
    if dtype == "float32" and tf32:
        return COMPUTE_32F_FAST_TF32
    return COMPUTE_32F


class CublasGemm:
    """``out = alpha * a @ b + beta * out`` for one fixed problem, as ``cupy.matmul``
    would issue it to cuBLAS, minus the per-call derivation.

    Parameters
    ----------
    gemm
        The column-major description (:func:`.blas_layout.describe`).
    dtype
        Operands' and output's dtype name (one of :data:`CUDA_DTYPES`).
    alpha, beta
        Scales (``beta`` reads the old ``out``).
    tf32
        float32 products on TF32 tensor cores.
    """

    impl = "cublas"

    def __init__(self, gemm: BlasGemm, dtype: str, alpha: float = 1.0, beta: float = 0.0,
                 tf32: bool = False) -> None:
        if dtype not in CUDA_DTYPES:
            raise PycLabError(f"CublasGemm: dtype {dtype} is not one of {sorted(CUDA_DTYPES)}")
        self.gemm = gemm
        self.dtype = dtype
        self.compute = _compute_type(dtype, tf32)
        self._alpha, self._beta = _scales(alpha, beta, self.compute)
        self._pa, self._pb = self._alpha.ctypes.data, self._beta.ctypes.data
        self._type = CUDA_DTYPES[dtype]
        self._algo = ALGO_DEFAULT if dtype == "float64" else ALGO_TENSOR_OP

    def __call__(self, a_ptr: int, b_ptr: int, out_ptr: int, stream: int,
                 workspace: tuple[int, int] | None = None) -> None:
        """Launch on ``stream`` (a ``cudaStream_t``) of the current device; no sync.

        ``workspace`` ``(pointer, bytes)``: one the caller owns
        (:func:`private_workspace`) instead of the stream's entry in the shared table.
        """
        g, t = self.gemm, self._type
        device = _device()
        h = _cublas(device)
        handle = h.on(device, stream, workspace)
        if g.batch == 1:
            h.lib.gemm_ex(handle, g.op_a, g.op_b, g.m, g.n, g.k, self._pa,
                          b_ptr, t, g.lda, a_ptr, t, g.ldb, self._pb, out_ptr, t, g.ldc,
                          self.compute, self._algo)
        else:
            h.lib.gemm_strided_batched_ex(
                handle, g.op_a, g.op_b, g.m, g.n, g.k, self._pa,
                b_ptr, t, g.lda, g.stride_a, a_ptr, t, g.ldb, g.stride_b, self._pb,
                out_ptr, t, g.ldc, g.stride_c, g.batch, self.compute, self._algo)


def _lt_handle(device: int) -> int:
    h = _LT.get(device)
    if h is None:
        from nvmath.bindings import cublasLt

        with _LOCK:
            h = _LT.get(device) or cublasLt.create()
            _LT[device] = h
    return h


def _set(setter: Any, obj: int, attr: Any, dtype_of: Any, value: Any) -> None:
    buf = np.array(value, dtype=dtype_of(attr))
    setter(obj, attr, buf.ctypes.data, buf.nbytes)


def race(runs: list[Callable[[], Any]], stream: int, rounds: int = 5) -> list[float]:
    """Median milliseconds of each of ``runs`` on ``stream``: interleaved rounds after a
    warm-up round, the L2 cache flushed before every run (a layer's operands arrive from
    memory in a model); infinity for a run that raises (it is not run again). A spin
    kernel sized from the quickest host time of each run so far is queued ahead of its
    start event (:func:`~pyc_lab.profiling.timing.spin_ahead`), so that the interval is
    the run's GPU time — what a CUDA graph replays — and not the host's time to issue it
    (a library path of several Python-side launches would otherwise lose by its host
    time, more on a slower host).

    The never-slower choices between library calls are made with it: a cuBLASLt
    candidate against the others (:class:`LtGemm`), the direct FP8 call against
    ``torch._scaled_mm`` (:mod:`.matmul_fp8`).
    """
    import time

    import cupy as cp

    from ..profiling.timing import spin_ahead
    from .arrays import cupy_stream

    rt = cp.cuda.runtime
    flush = cp.cuda.Memory(FLUSH_BYTES)
    spin_stream = cupy_stream(stream, cp.cuda.Device().id)
    events = [(rt.eventCreate(), rt.eventCreate()) for _ in runs]
    times: list[list[float]] = [[] for _ in runs]
    refused = [False] * len(runs)
    host_s = [0.0] * len(runs)  # each run's quickest time to issue so far
    try:
        for r in range(rounds + 1):
            ran = []
            for i, fn in enumerate(runs):
                if refused[i]:
                    continue
                start, end = events[i]
                rt.memsetAsync(flush.ptr, r, FLUSH_BYTES, stream)
                if r:
                    spin_ahead(cp, host_s[i], spin_stream)
                rt.eventRecord(start, stream)
                t0 = time.perf_counter()
                try:
                    fn()
                except Exception as exc:  # a candidate that cannot run is not chosen
                    log.debug("candidate %d refused: %s", i, exc)
                    refused[i] = True
                    continue
                took = time.perf_counter() - t0
                host_s[i] = took if not r else min(host_s[i], took)
                rt.eventRecord(end, stream)
                ran.append(i)
            rt.streamSynchronize(stream)
            if r:  # the first round warms up
                for i in ran:
                    times[i].append(rt.eventElapsedTime(*events[i]))
    finally:
        for start, end in events:
            rt.eventDestroy(start)
            rt.eventDestroy(end)
    return [float("inf") if refused[i] or not t else sorted(t)[len(t) // 2]
            for i, t in enumerate(times)]


class _Form:
    """One cuBLASLt description of the product: a matmul descriptor, the layouts of its
    ``A``, ``B`` and ``C``/``D``, and whether ``A`` is the operand ``b`` (the
    column-major ``out^T = b^T a^T``) or ``a`` (the row-major ``out = a @ b`` as given)."""

    __slots__ = ("b_first", "desc", "layouts")

    def __init__(self, desc: int, layouts: tuple[int, int, int], b_first: bool) -> None:
        self.desc = desc
        self.layouts = layouts
        self.b_first = b_first

    def pointers(self, a_ptr: int, b_ptr: int) -> tuple[int, int]:
        return (b_ptr, a_ptr) if self.b_first else (a_ptr, b_ptr)


class LtGemm:
    """``out = alpha * a @ b + beta * out`` for one fixed problem through cuBLASLt.

    The descriptors are made once; the algorithm is chosen once per alignment class of
    the three pointers (with the alignments and the workspace as preferences):
    cuBLASLt's heuristic first choice, or for large problems (:data:`MEASURE_FLOP`) the
    fastest of the first few measured on the first call's operands. Same parameters as
    :class:`CublasGemm`, and

    row_orders
        Describe transposed operands as row-ordered layouts read as they are, rather
        than column-ordered ones with a transposing op (the same product), and for large
        problems also measure the product described as given (``A = a``, ``B = b``, all
        row-ordered). cuBLASLt's heuristic ranks algorithms differently for each
        description; row orders are what nvmath-python's planner describes (over the
        bfloat16 problems of ``benchmarks/bench_matmul_sweep.py`` on the H200 the worst
        ran at 0.96x the best library with transposing ops, 0.98x with row orders).
        FP8 kernels take only the transposing form (``row_orders=False``).
    setting
        A kept heuristic pick (:class:`~.lt_algos.LtPick`, measured fastest by the
        tuner) to run instead of the heuristic's first choice, on the description it
        was picked for. An alignment class it does not take, or another cuBLASLt
        version, falls back to the heuristic's choice.
    """

    impl = "cublaslt"

    def __init__(self, gemm: BlasGemm, dtype: str, alpha: float = 1.0, beta: float = 0.0,
                 tf32: bool = False, *,
                 operand_dtypes: tuple[str, str] | None = None,
                 row_orders: bool = True, setting: Any = None) -> None:
        from nvmath.bindings import cublasLt as lt

        da, db = operand_dtypes or (dtype, dtype)
        if dtype not in CUDA_DTYPES or da not in OPERAND_DTYPES or db not in OPERAND_DTYPES:
            raise PycLabError(f"LtGemm: {da} @ {db} operands and a {dtype} result are not "
                              f"among {sorted(OPERAND_DTYPES)} -> {sorted(CUDA_DTYPES)}")
        self.lt = lt
        self.gemm = gemm
        self.dtype = dtype
        self.compute = _compute_type(dtype, tf32)
        self._alpha, self._beta = _scales(alpha, beta, self.compute)
        self._pa, self._pb = self._alpha.ctypes.data, self._beta.ctypes.data
        self._types = (CUDA_DTYPES[dtype], OPERAND_DTYPES[da], OPERAND_DTYPES[db])
        g = gemm
        t, t_a, t_b = self._types
        if row_orders:  # out^T = b^T a^T, transposes as row orders
            first = self._form((OP_N, OP_N), (
                self._layout(t_b, g.rows_a, g.cols_a, g.lda, g.stride_a, g.op_a == OP_T),
                self._layout(t_a, g.rows_b, g.cols_b, g.ldb, g.stride_b, g.op_b == OP_T),
                self._layout(t, g.m, g.n, g.ldc, g.stride_c, False)), b_first=True)
            # out = a @ b as given: an operand stored untransposed for cuBLAS (op N) is
            # row-major in the row-major problem, a transposed one column-major
            given = self._form((OP_N, OP_N), (
                self._layout(t_a, g.rows_b, g.cols_b, g.ldb, g.stride_b, g.op_b == OP_N),
                self._layout(t_b, g.rows_a, g.cols_a, g.lda, g.stride_a, g.op_a == OP_N),
                self._layout(t, g.m, g.n, g.ldc, g.stride_c, True)), b_first=False)
            self._forms = (first, given)
        else:
            self._forms = (self._form((g.op_a, g.op_b), (
                self._layout(t_b, g.rows_a, g.cols_a, g.lda, g.stride_a, False),
                self._layout(t_a, g.rows_b, g.cols_b, g.ldb, g.stride_b, False),
                self._layout(t, g.m, g.n, g.ldc, g.stride_c, False)), b_first=True),)
        self.setting = setting
        self._scale_ptrs = (0, 0)
        self._need = 0
        weakref.finalize(self, _destroy, lt, [(f.desc, f.layouts) for f in self._forms])
        #: Per alignment class: the form and heuristic result (its algorithm struct first).
        self._algos: dict[tuple[int, int, int], tuple[_Form, np.ndarray]] = {}
        #: The algorithm ids chosen, per alignment class (for explanations).
        self.algorithms: dict[tuple[int, int, int], int] = {}
        #: For the classes that were measured: ``{"ms": per candidate (the first form's
        #: candidates in heuristic order, the other's, then the wide-workspace ones),
        #: "confirmation_ms": [first, chosen] when a second race was run, "chosen":
        #: index}``.
        self.measured: dict[tuple[int, int, int], dict[str, Any]] = {}

    def _form(self, ops: tuple[int, int], layouts: tuple[int, int, int],
              b_first: bool) -> _Form:
        lt = self.lt
        scale = 1 if self.compute == COMPUTE_64F else 0  # CUDA_R_64F / CUDA_R_32F
        desc = lt.matmul_desc_create(self.compute, scale)
        attr, get = lt.MatmulDescAttribute, lt.get_matmul_desc_attribute_dtype
        _set(lt.matmul_desc_set_attribute, desc, attr.TRANSA, get, ops[0])
        _set(lt.matmul_desc_set_attribute, desc, attr.TRANSB, get, ops[1])
        return _Form(desc, layouts, b_first)

    def _layout(self, t: int, rows: int, cols: int, ld: int, stride: int,
                row_ordered: bool) -> int:
        """A column-ordered ``rows x cols`` matrix; or, ``row_ordered``, the same memory
        read as its row-ordered ``cols x rows`` transpose (no transposing op needed)."""
        lt = self.lt
        attr = lt.MatrixLayoutAttribute
        if row_ordered:
            layout = lt.matrix_layout_create(t, cols, rows, ld)
            _set(lt.matrix_layout_set_attribute, layout, attr.ORDER,
                 lt.get_matrix_layout_attribute_dtype, int(lt.Order.ROW))
        else:
            layout = lt.matrix_layout_create(t, rows, cols, ld)
        if self.gemm.batch > 1:
            _set(lt.matrix_layout_set_attribute, layout, attr.BATCH_COUNT,
                 lt.get_matrix_layout_attribute_dtype, self.gemm.batch)
            _set(lt.matrix_layout_set_attribute, layout, attr.STRIDED_BATCH_OFFSET,
                 lt.get_matrix_layout_attribute_dtype, stride)
        return layout

    def _candidates(self, form: _Form, key: tuple[int, int, int], handle: int,
                    requested: int, max_workspace: int = MAX_LT_WORKSPACE) -> np.ndarray:
        """cuBLASLt's heuristic results (best first) for a form and alignment class."""
        lt = self.lt
        pref = lt.matmul_preference_create()
        try:
            attr = lt.MatmulPreferenceAttribute
            get = lt.get_matmul_preference_attribute_dtype
            _set(lt.matmul_preference_set_attribute, pref, attr.MAX_WORKSPACE_BYTES, get,
                 max_workspace)
            align_a, align_b = form.pointers(key[0], key[1])
            for which, align in zip(("A", "B", "C", "D"), (align_a, align_b, key[2], key[2]),
                                    strict=True):
                _set(lt.matmul_preference_set_attribute, pref,
                     getattr(attr, f"MIN_ALIGNMENT_{which}_BYTES"), get, align)
            results = np.zeros(requested, dtype=lt.matmul_heuristic_result_dtype)
            count = np.zeros(1, dtype=np.int32)
            la, lb, lc = form.layouts
            lt.matmul_algo_get_heuristic(handle, form.desc, la, lb, lc, lc, pref,
                                         requested, results.ctypes.data, count.ctypes.data)
        except Exception as exc:  # this description is refused: no candidates from it
            log.debug("cuBLASLt heuristic refused a description: %s", exc)
            return results[:0]
        finally:
            lt.matmul_preference_destroy(pref)
        return results[:int(count[0])]

    def _algo(self, key: tuple[int, int, int], handle: int, ptrs: tuple[int, int, int],
              device: int, stream: int) -> tuple[_Form, np.ndarray]:
        """The form and algorithm for an alignment class: the heuristic's first, or for
        a large problem the fastest measured on the call's own operands, kept only when
        it beats the first by :data:`MEASURE_MARGIN` twice: in the race of all
        candidates, then again in a race of its own against the first (the fastest of a
        dozen noisy timings is biased low: on the H200 one such pick measured 3 % slower
        than the heuristic's in a later sweep). Never when ``beta`` reads ``out``, nor
        during a stream capture."""
        if self.setting is not None:
            fixed = self._fixed(handle, key)
            if fixed is not None:
                return fixed
        g = self.gemm
        big = 2.0 * g.m * g.n * g.k * g.batch >= MEASURE_FLOP
        measure = big and not self._beta[0] and not _capturing(stream)
        pool = self.picks(key, handle, CANDIDATES if measure else 1, all_forms=measure)
        if not pool:
            raise PycLabError(f"cuBLASLt has no algorithm for this {self.dtype} GEMM "
                              f"({self.gemm}); use cupy.matmul for it")
        chosen = 0
        if measure and len(pool) > 1:
            need = max(int(r["workspace_size"][0]) for _, r in pool)
            ws, size = workspace(device, stream, max(self._need, need))
            times = self._race(pool, ptrs, ws, size, handle, stream)
            best = min(range(len(times)), key=times.__getitem__)
            again: list[float] = []
            if best and times[best] <= times[0] * (1.0 - MEASURE_MARGIN):
                again = self._race([pool[0], pool[best]], ptrs, ws, size, handle, stream)
                if again[1] <= again[0] * (1.0 - MEASURE_MARGIN):
                    chosen = best
            self.measured[key] = {"ms": times, "confirmation_ms": again, "chosen": chosen}
        form, result = pool[chosen]
        result = result.copy()
        self.algorithms[key] = self._algo_id(result)
        self._need = max(self._need, int(result["workspace_size"][0]))
        return form, result  # the algorithm struct is the result's first member

    def picks(self, key: tuple[int, int, int], handle: int, per_form: int,
              max_workspace: int = MAX_LT_WORKSPACE,
              all_forms: bool = True) -> list[tuple[_Form, np.ndarray]]:
        """The heuristic's first ``per_form`` picks (their records) for each description
        of the product, with ``max_workspace`` bytes allowed, best first; with
        ``all_forms`` also :data:`WIDE_CANDIDATES` picks of the first description with a
        wide workspace that are not already among them. Without ``all_forms``, the first
        description's only.

        Parameters
        ----------
        key
            The pointer-alignment class ``(a, b, out)`` in bytes.
        handle
            The cuBLASLt handle.
        per_form
            Picks asked for per description.
        max_workspace
            Workspace the picks of each description may need.
        all_forms
            Every description and the wide-workspace picks, or the first description's.
        """
        forms = self._forms if all_forms else self._forms[:1]
        pool = [(form, results[i:i + 1]) for form in forms
                for results in [self._candidates(form, key, handle, per_form, max_workspace)]
                for i in range(len(results))]
        if all_forms:  # the wide-workspace picks not already among them
            seen = {(id(f), r["algo"].tobytes()) for f, r in pool}
            form = self._forms[0]
            wide = self._candidates(form, key, handle, WIDE_CANDIDATES, WIDE_LT_WORKSPACE)
            pool += [(form, wide[i:i + 1]) for i in range(len(wide))
                     if (id(form), wide[i:i + 1]["algo"].tobytes()) not in seen]
        return pool

    def _fixed(self, handle: int, key: tuple[int, int, int]) -> tuple[_Form, np.ndarray] | None:
        """:attr:`setting`'s description and algorithm, or ``None`` (logged) where
        cuBLASLt refuses it for this problem and alignment, or is another version."""
        from . import lt_algos

        pick = self.setting
        if pick.form >= len(self._forms) or pick.version != int(self.lt.get_version()):
            log.info("the tuned cuBLASLt pick %s was made by cuBLASLt %d for description "
                     "%d; its heuristic chooses here", pick.id, pick.version, pick.form)
            return None
        form = self._forms[pick.form]
        try:
            algo = pick.struct(self.lt)
            rec = lt_algos.check(self.lt, handle, form.desc, form.layouts, algo,
                                 MAX_LT_WORKSPACE)
            if rec is not None and not lt_algos.aligned(self.lt, algo,
                                                        (*form.pointers(key[0], key[1]), key[2])):
                rec = None
        except Exception as exc:
            rec = None
            log.debug("cuBLASLt pick %s: %s", pick.id, exc)
        if rec is None:
            log.info("cuBLASLt refuses the tuned pick %s for %s; its heuristic chooses",
                     pick.id, self.gemm)
            return None
        self.algorithms[key] = pick.algo_id
        self._need = max(self._need, int(rec["workspace_size"][0]))
        return form, rec

    def _race(self, pool: list[tuple[_Form, np.ndarray]], ptrs: tuple[int, int, int],
              ws: int, size: int, handle: int, stream: int, rounds: int = 5) -> list[float]:
        """:func:`race` over the candidates, each run on the call's own operands."""
        a_ptr, b_ptr, out_ptr = ptrs

        def run(form: _Form, result: np.ndarray) -> Callable[[], None]:
            p_a, p_b = form.pointers(a_ptr, b_ptr)
            la, lb, lc = form.layouts
            return lambda: self.lt.matmul(handle, form.desc, self._pa, p_a, la, p_b, lb,
                                          self._pb, out_ptr, lc, out_ptr, lc,
                                          result.ctypes.data, ws, size, stream)

        return race([run(form, result) for form, result in pool], stream, rounds)

    def _algo_id(self, results: np.ndarray) -> int:
        lt = self.lt
        try:
            attr = lt.MatmulAlgoConfigAttribute.ID
            buf = np.zeros(1, dtype=lt.get_matmul_algo_config_attribute_dtype(attr))
            written = np.zeros(1, dtype=np.uint64)
            lt.matmul_algo_config_get_attribute(results.ctypes.data, attr, buf.ctypes.data,
                                                buf.nbytes, written.ctypes.data)
            return int(buf[0])
        except Exception as exc:  # only for explanations
            log.debug("reading a cuBLASLt algorithm id: %s", exc)
            return -1

    def set_scales(self, a_scale: int, b_scale: int) -> None:
        """Device pointers of the float32 scales dequantising ``a`` and ``b`` (FP8
        operands: ``out = (scale_a * a) @ (scale_b * b)``)."""
        if (a_scale, b_scale) == self._scale_ptrs:
            return
        lt, attr = self.lt, self.lt.MatmulDescAttribute
        get = lt.get_matmul_desc_attribute_dtype
        for form in self._forms:
            s_a, s_b = form.pointers(a_scale, b_scale)  # cuBLASLt's A and B
            _set(lt.matmul_desc_set_attribute, form.desc, attr.A_SCALE_POINTER, get, s_a)
            _set(lt.matmul_desc_set_attribute, form.desc, attr.B_SCALE_POINTER, get, s_b)
        self._scale_ptrs = (a_scale, b_scale)

    @property
    def workspace_need(self) -> int:
        """Bytes of workspace the algorithms chosen so far need (0 before the first call)."""
        return self._need

    def __call__(self, a_ptr: int, b_ptr: int, out_ptr: int, stream: int,
                 workspace: tuple[int, int] | None = None) -> None:
        """Launch on ``stream`` (a ``cudaStream_t``) of the current device; no sync.

        ``workspace`` ``(pointer, bytes)``: one the caller owns, of at least
        :attr:`workspace_need` bytes (a CUDA graph's), instead of the stream's entry in
        the shared table; the algorithm must have been chosen by an earlier call with
        operands of the same alignments.
        """
        device = _device()
        handle = _lt_handle(device)
        key = (alignment(a_ptr), alignment(b_ptr), alignment(out_ptr))
        chosen = self._algos.get(key)
        if chosen is None:
            chosen = self._algos[key] = self._algo(key, handle, (a_ptr, b_ptr, out_ptr),
                                                   device, stream)
        form, algo = chosen
        ws, size = workspace if workspace is not None else _shared_workspace(
            device, stream, self._need)
        p_a, p_b = form.pointers(a_ptr, b_ptr)
        la, lb, lc = form.layouts
        self.lt.matmul(handle, form.desc, self._pa, p_a, la, p_b, lb, self._pb,
                       out_ptr, lc, out_ptr, lc, algo.ctypes.data, ws, size, stream)


def _destroy(lt: Any, forms: list[tuple[int, tuple[int, ...]]]) -> None:
    """Free an :class:`LtGemm`'s descriptors (at collection, or at exit while the
    library is still loaded); a failure is ignored, there is nothing left to do."""
    try:
        for desc, layouts in forms:
            for layout in layouts:
                lt.matrix_layout_destroy(layout)
            lt.matmul_desc_destroy(desc)
    except Exception:  # a failed free at exit has no one to report to
        pass
