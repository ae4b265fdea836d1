"""``pyc_lab.matmul``: a tuned CUTLASS kernel where it is known to be faster, else the
fastest library path; never slower than the library.

For CuPy arrays (and CUDA torch tensors, viewed through DLPack) the tuning database is
asked for this GPU, dtype, layout, epilogue and shape (exact shape, then the nearest
tuned bucket). A tuned kernel runs only when the never-slower rule of
:mod:`~pyc_lab.kernels.matmul_route` lets it (it beat the fastest library path this
process can call, measured in its own tuning run; a bucketed match by a margin, and its
kernel accepts the actual shape), and only when its kernel is in the kernel cache: a
call never builds (the tuner builds what it measures, :func:`prepare` the winners of a
database tuned elsewhere). Otherwise bias and relu/gelu go through cuBLASLt's fused
epilogue, bfloat16 through cuBLASLt (nvmath-python), everything else through cuBLAS
(``cupy.matmul``). NumPy arrays (and CPU torch tensors) use NumPy.

The hot path: the choice is memoised per problem signature (array types, shapes,
strides, dtypes, ``out``/bias signature, scales, activation, device), so a repeated call
costs a dictionary look-up and the launch; the tuning database is asked only when a
signature is first seen or the database changed — a tuning in this process at once (the
database's write :func:`~pyc_lab.kernels.tuning.database.generation`), a change of the
file by another process by its modification time, looked at no more than every
:data:`RECHECK_S` seconds. :data:`last_choice` keeps a reference to the last call's
choice and is read lazily. A library call whose addresses (``a``, ``b``, the result,
the stream) repeat replays a CUDA graph (:mod:`~pyc_lab.kernels.gemm_replays`); a
:class:`~pyc_lab.kernels.matmul_plan.MatmulPlan` (:func:`matmul_plan`) keeps the choice.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import PycLabError
from . import cutlass as cg
from .arrays import (
    cupy_of_torch,
    dtype_name,
    kind,
    numpy_of_torch,
    result_dtype,
    torch_of,
    torch_stream,
)
from .lt_algos import LtPick, is_lt_algo
from .matmul_fp8 import is_fp8, matmul_fp8
from .matmul_inputs import DTYPES, check_inputs, result_shape
from .matmul_plan import (
    TUNED_DTYPES,
    Launch,
    MatmulPlan,
    build_launch,
    capturable_launch,
    operand_layout,
)
from .matmul_route import CALLABLE, tuned_verdict
from .matmul_tuned import load_tuned
from .skinny import (
    SkinnyConfig,
    compile_kernels,
    is_skinny,
    skinny_issue,
)
from .tuning import database
from .tuning.keys import ProblemKey, device_key

__all__ = ["ACTIVATIONS", "DTYPES", "RECHECK_S", "TUNED_DTYPES", "MatmulPlan", "find_tuned",
           "forget", "last_choice", "matmul", "matmul_plan", "operand_layout", "prepare",
           "tuned_kernel", "winning_entry", "winning_kernel"]

log = logging.getLogger(__name__)

#: Activations ``matmul`` applies (gelu: the tanh approximation).
ACTIVATIONS = tuple(cg.ACTIVATIONS)

#: How often (seconds) the database file is looked at for changes made elsewhere.
RECHECK_S = 0.5

_KERNELS: dict[tuple, Any] = {}
_MEMO: dict[tuple, tuple[Any, str]] = {}
_WINNERS: dict[tuple, tuple[Any, str, dict[str, Any]]] = {}
_LAUNCHES: dict[tuple, Launch] = {}
_TORCH_LAUNCHES: dict[tuple, Launch] = {}
_LOCK = threading.Lock()
_STAMP: dict[str, Any] = {"at": -1e9, "stamp": None}


class _LastChoice(Mapping):
    """The most recent :func:`matmul` call's choice: ``{"impl", "reason", ...}``
    (``config``, ``epilogue``, ``match`` for a tuned kernel). A call only stores a
    reference; the mapping is read when looked at."""

    def __init__(self) -> None:
        self.launch: Launch | None = None

    def _data(self) -> dict[str, Any]:
        return {} if self.launch is None else self.launch.choice

    def __getitem__(self, key: str) -> Any:
        return self._data()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data())

    def __len__(self) -> int:
        return len(self._data())

    def __repr__(self) -> str:
        return repr(dict(self._data()))


#: The most recent call's choice: ``{"impl", "reason", ...}`` (read-only mapping).
last_choice = _LastChoice()


def forget() -> None:
    """Drop the memoised lookups, choices and loaded kernels (the next call looks again)."""
    with _LOCK:
        _MEMO.clear()
        _WINNERS.clear()
        _LAUNCHES.clear()
        _TORCH_LAUNCHES.clear()
        _KERNELS.clear()
        _STAMP.update(at=-1e9, stamp=None)


def db_stamp() -> tuple:
    """What the memo is valid for: this process's database writes, and the default
    database file's path and modification times (file and WAL), the latter looked at
    no more than every :data:`RECHECK_S` seconds."""
    now = time.monotonic()
    generation = database.generation()
    if now - _STAMP["at"] < RECHECK_S and _STAMP.get("generation") == generation:
        return _STAMP["full"]
    if _STAMP["stamp"] is None or now - _STAMP["at"] >= RECHECK_S:
        path = database.default_path()
        stamp: list[Any] = [str(path)]
        for p in (str(path), f"{path}-wal"):
            try:
                stamp.append(os.stat(p).st_mtime_ns)
            except OSError:
                stamp.append(None)
        _STAMP.update(at=now, stamp=tuple(stamp))
    full = (generation, *_STAMP["stamp"])
    _STAMP.update(generation=generation, full=full)
    return full


def _alignment_issue(m: int, n: int, k: int, layout: str, dtype: str) -> str:
    """Why no tuned kernel of any alignment the tuner builds (16 bytes, or the lower
    ones for extents that are not multiples of 8) can take the problem, or ``""``."""
    from .cutlass.config import problem_alignment

    align = problem_alignment(m, n, k, layout, dtype)
    return cg.problem_issue(m, n, k, layout, dtype, align) if align else (
        cg.problem_issue(m, n, k, layout, dtype) or "no kernel alignment fits the problem")


def find_tuned(m: int, n: int, k: int, dtype: str, layout: str,
               epilogue: cg.Epilogue | None = None) -> tuple[Any, str]:
    """The tuning database's best kernel for a problem on this GPU.

    Returns
    -------
    found, why
        A :class:`~pyc_lab.kernels.tuning.keys.LookupResult` (exact shape or nearest
        bucket) and ``"exact match (MxNxK)"``-style text, or ``None`` and why not.
    """
    epilogue = epilogue or cg.Epilogue()
    issue = _alignment_issue(m, n, k, layout, dtype)
    if issue and (epilogue.fused or skinny_issue(m, n, k, dtype, layout)):
        return None, issue  # neither a CUTLASS kernel nor the skinny GEMM takes it
    try:
        device, _cc, _sm = device_key()
        with database.TuningDB() as db:
            found = db.lookup(device, ProblemKey(epilogue.op, dtype, dtype, dtype, layout,
                                                 m, n, k))
    except Exception as exc:
        return None, f"tuning database: {exc}"
    what = f"{m}x{n}x{k} {dtype} {layout}" + (f" +{epilogue.name}" if epilogue.fused else "")
    if found is None:
        return None, f"no tuned kernel for {what} on this GPU"
    return found, f"{found.match} match ({'x'.join(map(str, found.problem_matched.shape))})"


def tuned_kernel(m: int, n: int, k: int, dtype: str, layout: str,
                 epilogue: cg.Epilogue | None = None) -> tuple[Any, str]:
    """The loaded tuned :class:`~pyc_lab.kernels.cutlass.CutlassGemm` for a problem, or
    ``None``.

    Memoised per problem until the tuning database changes. The kernel comes from the
    kernel cache (where the tuner put it); one that is not there is not built here —
    the reason says to run :func:`prepare`. This is the database's winner as it is (the
    compiler's lookup); :func:`winning_kernel` adds the never-slower rule that
    :func:`matmul` applies.

    Returns
    -------
    kernel, why
        The kernel and where it comes from, or ``None`` and why there is none.
    """
    epilogue = epilogue or cg.Epilogue()
    key = (m, n, k, dtype, layout, epilogue, db_stamp())
    hit = _MEMO.get(key)
    if hit is not None:
        return hit
    found, why = find_tuned(m, n, k, dtype, layout, epilogue)
    kernel = None
    if found is not None:
        try:
            kernel, why = _load(found, dtype, layout, epilogue, why, (m, n, k))
        except Exception as exc:  # a tuned entry must never break a matmul
            log.warning("tuned kernel for %dx%dx%d %s %s unusable: %s", m, n, k, dtype,
                        layout, exc)
            kernel, why = None, f"tuned kernel unusable ({type(exc).__name__}: {exc})"
    with _LOCK:
        if len(_MEMO) > 4096:
            _MEMO.clear()
        _MEMO[key] = (kernel, why)
    return kernel, why


def _load(found: Any, dtype: str, layout: str, epilogue: cg.Epilogue, why: str,
          shape: tuple[int, int, int]) -> tuple[Any, str]:
    """:func:`~.matmul_tuned.load_tuned` with this module's kernel cache."""
    return load_tuned(found, dtype, layout, epilogue, why, shape, _KERNELS, _LOCK)


def _callable_libraries() -> tuple[str, ...]:
    """The library paths this process can call (cuBLASLt only with nvmath-python)."""
    from . import cublaslt

    return CALLABLE if cublaslt.status()[0] else tuple(c for c in CALLABLE if c != "cublaslt")


def winning_kernel(m: int, n: int, k: int, dtype: str, layout: str,
                   epilogue: cg.Epilogue | None = None) -> tuple[Any, str, dict[str, Any]]:
    """The tuned kernel for a problem if the never-slower rule lets it run, else ``None``.

    The tuning database's winner (exact shape, else the nearest bucket) runs only when
    it beat the fastest library path this process can call, timed in the same tuning
    run (:func:`~pyc_lab.kernels.matmul_route.tuned_verdict`; a bucket match by
    :data:`~pyc_lab.kernels.matmul_route.BUCKET_MARGIN`), its kernel is in the kernel
    cache and it accepts the actual shape. Memoised per problem until the database
    changes.

    Returns
    -------
    kernel, why, extra
        The kernel (or ``None``), the reason ("tuned kernel 0.412 ms lost to cuBLAS
        0.398 ms in its tuning run"), and ``{"match": ...}`` when an entry was found.
    """
    epilogue = epilogue or cg.Epilogue()
    key = (m, n, k, dtype, layout, epilogue, db_stamp())
    hit = _WINNERS.get(key)
    if hit is not None:
        return hit
    result = _winning(m, n, k, dtype, layout, epilogue)
    with _LOCK:
        if len(_WINNERS) > 4096:
            _WINNERS.clear()
        _WINNERS[key] = result
    return result


def winning_entry(m: int, n: int, k: int, dtype: str, layout: str,
                  epilogue: cg.Epilogue | None = None) -> tuple[Any, str, dict[str, Any]]:
    """The tuning database's entry for a problem if the never-slower rule lets it run.

    The rule alone, without loading the kernel: the compiler's policy asks it when it
    decides, :func:`winning_kernel` when it launches.

    Returns
    -------
    found, why, extra
        The :class:`~pyc_lab.kernels.tuning.keys.LookupResult` (or ``None``), the verdict
        ("exact match (MxNxK): tuned kernel 0.391 ms beat cuBLAS 0.398 ms in its tuning
        run"), and ``{"match": ...}`` when an entry was found.
    """
    found, why = find_tuned(m, n, k, dtype, layout, epilogue)
    if found is None:
        return None, why, {}
    try:
        device, _cc, _sm = device_key()
        with database.TuningDB() as db:
            baselines = db.baselines(device, found.problem_matched,
                                     run_id=found.measurement.run_id)
    except Exception as exc:
        return None, f"tuning database: {exc}", {}
    matched = "x".join(map(str, found.problem_matched.shape))
    extra = {"match": f"{found.match} ({matched})"}
    wins, verdict = tuned_verdict(found.measurement.time_ms, found.match, baselines,
                                  _callable_libraries())
    if not wins:
        return None, verdict, extra
    return found, f"{found.match} match ({matched}): {verdict}", extra


def _winning(m: int, n: int, k: int, dtype: str, layout: str,
             epilogue: cg.Epilogue) -> tuple[Any, str, dict[str, Any]]:
    found, why, extra = winning_entry(m, n, k, dtype, layout, epilogue)
    if found is None:
        return None, why, extra
    try:
        kernel, why = _load(found, dtype, layout, epilogue, why, (m, n, k))
    except Exception as exc:  # a tuned entry must never break a matmul
        log.warning("tuned kernel for %dx%dx%d %s %s unusable: %s", m, n, k, dtype, layout,
                    exc)
        return None, f"tuned kernel unusable ({type(exc).__name__}: {exc})", extra
    return kernel, why, extra


def prepare(*, dtype: str | None = None, workers: int | None = None,
            cache: Any = None) -> Any:
    """Build every tuned winner for this GPU that the kernel cache lacks.

    A tuning database made on another machine (``pyc-lab db import``) names kernels
    this machine has never built; :func:`matmul` does not build on a call (a build takes
    about a minute), so run this once after importing. Skinny GEMM winners are compiled
    with NVRTC here (seconds; CuPy keeps the binaries on disk), so that their first call
    compiles nothing either; cuBLASLt setting winners need nothing (``"ready"``).

    Parameters
    ----------
    dtype
        Only winners of this kernel dtype (``"f16"``, ...); all by default.
    workers
        Parallel ``nvcc`` builds (default: the CPU count).
    cache
        The kernel cache (the user's by default).

    Returns
    -------
    pandas.DataFrame
        One row per winner: op, dtype, layout, shape, config, status (``"cached"``,
        ``"built"``, ``"compiled"`` for a skinny GEMM, or ``"compile_error"``) and
        message.

    Raises
    ------
    PycLabError
        Without a GPU (the winners are looked up for this GPU's key).
    """
    import pandas as pd

    device, cc, _sm = device_key()
    wanted: dict[tuple, dict[str, Any]] = {}
    rows = []
    with database.TuningDB() as db:
        for rec in db.measurements(device=device):
            p = rec.problem
            if not rec.is_winner or not p.op.startswith("gemm"):
                continue
            if dtype is not None and p.dtype_a != dtype:
                continue
            if is_skinny(rec.measurement.config):
                rows.append(_prepare_skinny(rec))
                continue
            if is_lt_algo(rec.measurement.config):  # a library setting: nothing to build
                rows.append({"op": p.op, "dtype": p.dtype_a, "layout": p.layout,
                             "shape": "x".join(map(str, p.shape)),
                             "config": LtPick.from_dict(rec.measurement.config).id,
                             "status": "ready", "message": ""})
                continue
            try:
                cfg = cg.GemmConfig.from_dict(rec.measurement.config)
                epi = cg.Epilogue.from_op(p.op)
            except PycLabError as exc:
                log.info("prepare: %s is not a CUTLASS winner (%s)", rec.measurement.config, exc)
                continue
            wanted[(cfg, p.dtype_a, p.layout, epi)] = {
                "op": p.op, "dtype": p.dtype_a, "layout": p.layout,
                "shape": "x".join(map(str, p.shape)), "config": cfg.id}
    by_build: dict[tuple, list[tuple]] = {}
    for key in wanted:
        cfg, kdtype, layout, epi = key
        by_build.setdefault((kdtype, layout, epi), []).append(key)
    for (kdtype, layout, epi), keys in by_build.items():
        futures = cg.build_many([k[0] for k in keys], kdtype, layout, cc, workers, cache,
                                epilogue=epi)
        for key in keys:
            res = futures[key[0]].result()
            rows.append({**wanted[key], "status": res.status, "message": res.message[:200]})
    forget()
    return pd.DataFrame(rows, columns=["op", "dtype", "layout", "shape", "config", "status",
                                       "message"])




def _prepare_skinny(rec: Any) -> dict[str, Any]:
    """Compile one skinny GEMM winner for its row count: a :func:`prepare` row."""
    p = rec.problem
    row = {"op": p.op, "dtype": p.dtype_a, "layout": p.layout,
           "shape": "x".join(map(str, p.shape)), "config": "?", "status": "compiled",
           "message": ""}
    try:
        cfg = SkinnyConfig.from_dict(rec.measurement.config)
        row["config"] = cfg.id
        failed = compile_kernels(p.dtype_a, p.shape[0], [cfg])
    except PycLabError as exc:
        failed = {row["config"]: str(exc)}
    if failed:
        row.update(status="compile_error", message=next(iter(failed.values()))[:200])
    return row


def _tuned(m: int, n: int, k: int, dtype: str, layout: str,
           epilogue: cg.Epilogue) -> tuple[Any, str, dict[str, Any]]:
    return winning_kernel(m, n, k, dtype, layout, epilogue)


def _launch_for(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any,
                activation: str | None, tf32: bool, key: tuple | None) -> Launch:
    """The memoised :class:`Launch` for validated arrays (made on a miss)."""
    if key is not None:
        hit = _LAUNCHES.get(key)
        if hit is not None and (hit.stamp is None or hit.stamp == db_stamp()):
            return hit
    made = build_launch(a, b, out, alpha, beta, bias, activation, tf32, _tuned, db_stamp,
                        cg.Epilogue)
    if key is not None:
        with _LOCK:
            if len(_LAUNCHES) > 4096:
                _LAUNCHES.clear()
            _LAUNCHES[key] = made
    return made


def _signature(a: Any, b: Any, out: Any, alpha: Any, beta: Any, bias: Any,
               activation: Any, tf32: Any) -> tuple:
    """The memo key of a call on CuPy or NumPy arrays (AttributeError for non-arrays)."""
    return (type(a), a.shape, a.strides, a.dtype, type(b), b.shape, b.strides, b.dtype,
            None if out is None else (type(out), out.shape, out.strides, out.dtype),
            None if bias is None else (type(bias), bias.shape, bias.dtype),
            alpha, beta, activation, tf32,
            a.device.id if type(a).__module__.startswith("cupy") else None)


def _call(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any,
          activation: str | None, tf32: bool) -> Any:
    """pl.matmul on CuPy or NumPy arrays: the memoised launch, checked on a miss."""
    try:
        key: tuple | None = _signature(a, b, out, alpha, beta, bias, activation, tf32)
        launch = _LAUNCHES.get(key)
    except (AttributeError, TypeError):  # not arrays, or unhashable scales: the checks say
        key = launch = None
    if launch is None or (launch.stamp is not None and launch.stamp != db_stamp()):
        bias = check_inputs(a, b, out, alpha, beta, bias, activation, ACTIVATIONS)
        if bias is not None and kind(a) == "cupy" and kind(bias) != "cupy":
            import cupy as cp

            bias = cp.asarray(bias)
        launch = _launch_for(a, b, out, alpha, beta, bias, activation, tf32, key)
    elif bias is not None:
        if type(bias) is not type(a) and kind(a) == "cupy":
            import cupy as cp

            bias = cp.asarray(bias)
        if bias.ndim != 1:
            bias = bias.reshape(-1)
    last_choice.launch = launch
    if (direct := launch.direct) is not None and bias is None:
        y = direct.cupy(a, b, out, direct.replays)
        if y is not None:
            return y
    return launch.run(a, b, out, bias)


def _torch_signature(a: Any, b: Any, out: Any, alpha: Any, beta: Any, tf32: Any) -> tuple:
    """The memo key of a call on torch tensors without bias or activation."""
    return (a.shape, a.stride(), a.dtype, a.device, a.requires_grad,
            b.shape, b.stride(), b.dtype, b.device, b.requires_grad,
            None if out is None else (out.shape, out.stride(), out.dtype, out.device),
            alpha, beta, tf32)


def matmul(a: Any, b: Any, *, out: Any = None, alpha: float = 1.0, beta: float = 0.0,
           bias: Any = None, activation: str | None = None, tf32: bool = False,
           scale_a: Any = None, scale_b: Any = None, out_dtype: str | None = None) -> Any:
    """``activation(alpha * a @ b + beta * out + bias)``, never slower than the library.

    Parameters
    ----------
    a, b
        Arrays of float16, bfloat16, float32 or float64, both NumPy (run on the CPU),
        both CuPy, or both torch tensors (CUDA ones run on the GPU on torch's current
        stream, viewed through DLPack without a copy; CPU ones through NumPy). 2-D, or
        batched: ``(B, M, K) @ (B, K, N)`` or ``(B, M, K) @ (K, N)`` in one library call.
        Transposed views (``w.T``) are taken as they are, without a copy. Mixed dtypes
        promote as NumPy promotes them (bfloat16 with float16 or float32: float32).
    out
        Optional output of the product's shape (same array kind); with ``beta != 0`` its
        old value is added. A C-contiguous ``out`` of the product's dtype is written
        directly.
    alpha, beta
        Scales of the product and of ``out``'s old value.
    bias
        Optional row vector of length N (shape ``(N,)`` or ``(1, N)``) added after the
        product; its dtype must cast to the product's within its kind.
    activation
        ``None``, ``"relu"``, ``"gelu"`` (tanh approximation) or ``"silu"``.
    tf32
        For float32 CuPy arrays: allow a kernel tuned for TF32 tensor cores (10-bit
        mantissa products) instead of exact float32 ones (like torch's ``allow_tf32``).
    scale_a, scale_b, out_dtype
        For float8 torch tensors (``float8_e4m3fn``/``float8_e5m2``, Hopper's FP8 tensor
        cores through cuBLASLt): the per-tensor dequantisation scales (floats or
        one-element float32 tensors) and the result dtype (default bfloat16); ``out =
        (scale_a * a) @ (scale_b * b)``. See :func:`~.matmul_fp8.matmul_fp8` for the
        layout FP8 kernels take. Not used with other dtypes.

    Returns
    -------
    array
        ``out`` (or a new array of the operands' kind: a torch tensor for torch
        operands). :data:`last_choice` says which implementation ran and why.

    Raises
    ------
    PycLabError
        For operands that do not multiply, dtypes outside :data:`DTYPES` (integer,
        boolean, complex, object), operands of different kinds or devices, a bias of the
        wrong length or dtype, an ``out`` of the wrong shape or dtype, a non-real scale,
        or a torch tensor that requires grad.

    Notes
    -----
    Which implementation runs (the never-slower rule): :mod:`pyc_lab.kernels.matmul_route`.
    For a loop over same-shaped operands, :func:`matmul_plan` skips even the look-up.
    """
    if scale_a is not None or scale_b is not None or out_dtype is not None \
            or is_fp8(a) or is_fp8(b):
        if alpha != 1.0 or beta or bias is not None or activation is not None:
            raise PycLabError("matmul: float8 operands take scale_a, scale_b, out and "
                              "out_dtype only (fold alpha into a scale; no bias, "
                              "activation or beta)")
        return matmul_fp8(a, b, scale_a=scale_a, scale_b=scale_b, out=out,
                          out_dtype=out_dtype or "bfloat16")
    if type(a).__module__.startswith("torch"):
        return _torch_call(a, b, out, alpha, beta, bias, activation, tf32)
    return _call(a, b, out, alpha, beta, bias, activation, tf32)


def _torch_call(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any,
                activation: str | None, tf32: bool) -> Any:
    """pl.matmul on torch tensors: viewed as CuPy (CUDA) or NumPy (CPU) arrays."""
    key: tuple | None = None
    if bias is None and activation is None:
        try:
            key = _torch_signature(a, b, out, alpha, beta, tf32)
            hit = _TORCH_LAUNCHES.get(key)
        except (AttributeError, TypeError):  # b or out not a tensor, unhashable scales
            key = hit = None
        if hit is not None and (hit.stamp is None or hit.stamp == db_stamp()):
            last_choice.launch = hit
            direct = hit.direct
            y = direct.torch(a, b, out, direct.replays)
            if y is not None:
                return y
    if kind(b) != "torch":
        raise PycLabError(f"matmul: a is a torch tensor and b a {type(b).__name__}; give "
                          "both as torch tensors")
    if not a.is_cuda or not b.is_cuda:
        if a.is_cuda != b.is_cuda:
            raise PycLabError("matmul: a and b are torch tensors on different devices "
                              f"({a.device} and {b.device}); move one (.to(...))")
        conv = numpy_of_torch
        y = _call(conv(a), conv(b), None if out is None else conv(out), alpha, beta,
                  conv(bias) if kind(bias) == "torch" else bias, activation, tf32)
        return out if out is not None else torch_of(y)
    import cupy as cp

    with cp.cuda.Device(a.device.index), torch_stream(a.device.index):
        conv = cupy_of_torch
        y = _call(conv(a), conv(b), None if out is None else conv(out), alpha, beta,
                  conv(bias) if kind(bias) == "torch" else bias, activation, tf32)
    made = last_choice.launch
    if key is not None and made is not None and made.direct is not None:
        with _LOCK:
            if len(_TORCH_LAUNCHES) > 4096:
                _TORCH_LAUNCHES.clear()
            _TORCH_LAUNCHES[key] = made
    return out if out is not None else torch_of(y)


def matmul_plan(a: Any, b: Any, *, bias: Any = None, activation: str | None = None,
                out: Any = None, alpha: float = 1.0, beta: float = 0.0,
                tf32: bool = False, capturable: bool = False,
                graphs: bool = True) -> MatmulPlan:
    """Choose once what computes ``activation(alpha * a @ b + beta * out + bias)`` for
    operands like ``a`` and ``b``, and return it as a plan to call many times.

    Parameters
    ----------
    a, b, bias, activation, out, alpha, beta, tf32
        As for :func:`matmul`; ``a`` and ``b`` fix the shapes, strides and dtypes the
        plan takes, ``out`` and ``bias`` are the defaults of its calls.
    capturable
        The plan will be captured into a CUDA graph: where the choice is cuBLAS through
        CuPy (which CuPy refuses during a capture), run the same GEMM through cuBLASLt
        (nvmath-python) instead; a :class:`~pyc_lab.errors.PycLabError` where cuBLASLt
        cannot take it. CUTLASS and cuBLASLt choices are capturable as they are.
    graphs
        Replay a direct library call from a CUDA graph when a call repeats an earlier
        one's addresses (:mod:`~.gemm_replays`); ``False`` calls the library each time.

    Returns
    -------
    MatmulPlan
        ``plan(a, b)`` runs the chosen kernel with only the shapes, strides and dtypes
        checked; ``plan.choice`` and ``plan.explain()`` say what runs and why. With an
        ``out`` a call allocates nothing and does not synchronise (CUDA-graph
        capturable, after one uncaptured call); NumPy operands run with NumPy.

    Raises
    ------
    PycLabError
        As :func:`matmul`.
    """
    if kind(a) == "torch":
        if kind(b) != "torch":
            raise PycLabError("matmul_plan: give a and b both as torch tensors")
        if a.is_cuda:
            import cupy as cp

            with cp.cuda.Device(a.device.index), torch_stream(a.device.index):
                inner = matmul_plan(cupy_of_torch(a), cupy_of_torch(b),
                                    bias=cupy_of_torch(bias) if kind(bias) == "torch" else bias,
                                    activation=activation,
                                    out=None if out is None else cupy_of_torch(out),
                                    alpha=alpha, beta=beta, tf32=tf32,
                                    capturable=capturable, graphs=graphs)
        else:
            inner = matmul_plan(numpy_of_torch(a), numpy_of_torch(b),
                                bias=numpy_of_torch(bias) if kind(bias) == "torch" else bias,
                                activation=activation,
                                out=None if out is None else numpy_of_torch(out),
                                alpha=alpha, beta=beta, tf32=tf32)
        tsig = (a.shape, a.stride(), a.dtype, a.device, a.requires_grad,
                b.shape, b.stride(), b.dtype, b.device, b.requires_grad)
        return MatmulPlan(inner._launch, "torch", inner._sig, out, bias, inner.shape,
                          inner.dtype, tsig if a.is_cuda else None, graphs=graphs)
    bias = check_inputs(a, b, out, alpha, beta, bias, activation, ACTIVATIONS)
    if bias is not None and kind(a) == "cupy" and kind(bias) != "cupy":
        import cupy as cp

        bias = cp.asarray(bias)
    try:
        key: tuple | None = _signature(a, b, out, alpha, beta, bias, activation, tf32)
        hash(key)
    except TypeError:  # e.g. a scale of an unhashable number type
        key = None
    launch = _launch_for(a, b, out, alpha, beta, bias, activation, tf32, key)
    if capturable and kind(a) == "cupy":
        launch = capturable_launch(a, b, out, alpha, beta, bias, activation, launch)
    sig = (a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype)
    return MatmulPlan(launch, kind(a), sig, out, bias, result_shape(tuple(a.shape),
                                                                    tuple(b.shape)),
                      result_dtype(dtype_name(a.dtype), dtype_name(b.dtype)), graphs=graphs)
