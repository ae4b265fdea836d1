"""``pyc_lab.matmul``: the tuned CUTLASS kernel for the shape when there is one, else cuBLAS.

For CuPy arrays the tuning database is asked for this GPU, dtype, layout, epilogue and
shape (exact shape, then the nearest tuned bucket); a winner whose kernel is in the kernel
cache and accepts the problem runs, bias and activation inside its epilogue when it was
tuned with them (``autotune_gemm(..., bias=True, activation="gelu")``). A call never
builds a kernel: the tuner builds the candidates it measures, and :func:`prepare` builds
the winners of a database tuned on another machine (a minute of ``nvcc`` each).
Otherwise a bias and/or relu/gelu go through cuBLASLt's fused epilogue
(:class:`~pyc_lab.kernels.cublaslt.FusedGemm`), anything else through cuBLAS
(``cupy.matmul``) and a CuPy epilogue. NumPy arrays use NumPy. Every call's choice and
reason is kept in :data:`last_choice`.

The lookup is memoised per process and problem; a tuning in this process is seen at
once (the database's write :func:`~pyc_lab.kernels.tuning.database.generation`), a
change of the database file by another process (a notebook tuning beside this one) by
the file's modification time, looked at no more than every :data:`RECHECK_S` seconds
(stating the file costs more than a GEMM launch).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import numpy as np

from ..errors import PycLabError
from . import cutlass as cg
from .tuning import database
from .tuning.keys import ProblemKey, device_key

__all__ = ["ACTIVATIONS", "DTYPES", "RECHECK_S", "TUNED_DTYPES", "find_tuned", "forget",
           "last_choice", "matmul", "operand_layout", "prepare", "tuned_kernel"]

log = logging.getLogger(__name__)

#: Activations ``matmul`` applies (gelu: the tanh approximation).
ACTIVATIONS = tuple(cg.ACTIVATIONS)

#: The most recent call's choice: ``{"impl", "reason", "config", "match"}``.
last_choice: dict[str, Any] = {}

#: How often (seconds) the database file is looked at for changes made elsewhere.
RECHECK_S = 0.5

_KERNELS: dict[tuple, Any] = {}
_MEMO: dict[tuple, tuple[Any, str]] = {}
_LOCK = threading.Lock()
_STAMP: dict[str, Any] = {"at": -1e9, "stamp": None}
#: Array dtypes with tuned kernels, and their kernel dtype (float32 -> "tf32" with tf32=True).
TUNED_DTYPES = {"float16": "f16", "float32": "f32"}
#: The element types ``matmul`` computes in; mixed operands promote as NumPy promotes them
#: (float16 @ float32 is float32). Integers, booleans, complex and object arrays are
#: refused: the GEMM kernels, the epilogues and cuBLAS are real floating point.
DTYPES = ("float16", "float32", "float64")


def _record(impl: str, reason: str, **extra: Any) -> None:
    last_choice.clear()
    last_choice.update({"impl": impl, "reason": reason, **extra})
    log.debug("matmul: %s (%s)", impl, reason)


def forget() -> None:
    """Drop the memoised lookups and loaded kernels (the next call looks again)."""
    with _LOCK:
        _MEMO.clear()
        _KERNELS.clear()
        _STAMP.update(at=-1e9, stamp=None)


def _db_stamp() -> tuple:
    """What the memo is valid for: this process's database writes, and the default
    database file's path and modification times (file and WAL), the latter looked at
    no more than every :data:`RECHECK_S` seconds."""
    now = time.monotonic()
    if _STAMP["stamp"] is None or now - _STAMP["at"] >= RECHECK_S:
        path = database.default_path()
        stamp: list[Any] = [str(path)]
        for p in (str(path), f"{path}-wal"):
            try:
                stamp.append(os.stat(p).st_mtime_ns)
            except OSError:
                stamp.append(None)
        _STAMP.update(at=now, stamp=tuple(stamp))
    return (database.generation(), *_STAMP["stamp"])


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
    issue = cg.problem_issue(m, n, k, layout, dtype)
    if issue:
        return None, issue
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
    the reason says to run :func:`prepare`.

    Returns
    -------
    kernel, why
        The kernel and where it comes from, or ``None`` and why there is none.
    """
    epilogue = epilogue or cg.Epilogue()
    key = (m, n, k, dtype, layout, epilogue, _db_stamp())
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
    try:
        cfg = cg.GemmConfig.from_dict(found.measurement.config)
        _device, cc, sm_count = device_key()
    except Exception as exc:
        return None, f"tuned entry unusable: {exc}"
    key = (cfg, dtype, layout, epilogue, cc)
    with _LOCK:
        kernel = _KERNELS.get(key)
        if kernel is None:
            res = cg.cached(cfg, dtype, layout, cc, epilogue=epilogue)
            if res is None:
                return None, (f"tuned kernel {cfg.id} is not built on this machine; "
                              "pyc_lab.kernels.prepare() builds it")
            kernel = _KERNELS[key] = cg.CutlassGemm(res.library, cfg, dtype, layout, sm_count,
                                                    epilogue)
    if not kernel.can_implement(*shape):
        return None, f"tuned kernel {cfg.id} cannot take {'x'.join(map(str, shape))}"
    return kernel, why


def prepare(*, dtype: str | None = None, workers: int | None = None,
            cache: Any = None) -> Any:
    """Build every tuned winner for this GPU that the kernel cache lacks.

    A tuning database made on another machine (``pyc-lab db import``) names kernels
    this machine has never built; :func:`matmul` does not build on a call (a build takes
    about a minute), so run this once after importing.

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
        ``"built"`` or ``"compile_error"``) and message.

    Raises
    ------
    PycLabError
        Without a GPU (the winners are looked up for this GPU's key).
    """
    import pandas as pd

    device, cc, _sm = device_key()
    wanted: dict[tuple, dict[str, Any]] = {}
    with database.TuningDB() as db:
        for rec in db.measurements(device=device):
            p = rec.problem
            if not rec.is_winner or not p.op.startswith("gemm"):
                continue
            if dtype is not None and p.dtype_a != dtype:
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
    rows = []
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


def operand_layout(a: Any, b: Any) -> str:
    """``a``/``b``'s memory order in BLAS letters (``"tn"``...), or ``""`` if strided."""
    la = "t" if a.flags.c_contiguous else "n" if a.flags.f_contiguous else ""
    lb = "t" if b.flags.c_contiguous else "n" if b.flags.f_contiguous else ""
    return la + lb if la and lb else ""


def _tuned(a: Any, b: Any, epilogue: cg.Epilogue, tf32: bool) -> tuple[Any, str]:
    """The tuned kernel for ``a @ b`` with ``epilogue``, or ``(None, why not)``."""
    dtype = TUNED_DTYPES.get(a.dtype.name)
    if dtype == "f32" and tf32:
        dtype = "tf32"
    if dtype is None or b.dtype != a.dtype:
        return None, (f"dtypes {a.dtype.name} @ {b.dtype.name}: tuned kernels take float16 "
                      "or float32 pairs")
    if a.ndim != 2 or b.ndim != 2:
        return None, "batched: tuned kernels are 2-D"
    layout = operand_layout(a, b)
    if not layout:
        return None, "a strided operand (neither C- nor F-contiguous)"
    return tuned_kernel(a.shape[0], b.shape[1], a.shape[1], dtype, layout, epilogue)


def matmul(a: Any, b: Any, *, out: Any = None, alpha: float = 1.0, beta: float = 0.0,
           bias: Any = None, activation: str | None = None, tf32: bool = False) -> Any:
    """``activation(alpha * a @ b + beta * out + bias)``, with the fastest kernel known.

    Parameters
    ----------
    a, b
        2-D arrays (M x K and K x N) of float16, float32 or float64, both NumPy (run on
        the CPU) or both CuPy (run on the GPU); mixed dtypes promote as NumPy promotes
        them.
    out
        Optional output (M x N, C-contiguous); with ``beta != 0`` its old value is added.
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

    Returns
    -------
    array
        ``out`` (or a new array). :data:`last_choice` says which implementation ran and why.

    Raises
    ------
    PycLabError
        For operands that do not multiply, dtypes outside :data:`DTYPES` (integer,
        boolean, complex, object), operands on different devices, a bias of the wrong
        length or dtype, an ``out`` of the wrong shape or dtype, or a non-real scale.
    """
    bias = _check_inputs(a, b, out, alpha, beta, bias, activation)
    is_cupy = _is_cupy(a)
    if not is_cupy:
        y = alpha * np.matmul(a, b)
        if beta and out is not None:
            y = y + beta * out
        y = _epilogue(np, y, bias, activation)
        _record("numpy", "NumPy arrays run on the CPU")
        if out is not None:
            out[...] = y
            return out
        return y.astype(np.result_type(a, b), copy=False)
    import cupy as cp

    if a.dtype != b.dtype:  # NumPy's promotion, so that every path below sees one dtype
        dtype = np.result_type(a.dtype, b.dtype)
        a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
    if bias is not None and not _is_cupy(bias):
        bias = cp.asarray(bias)
    epilogue = cg.Epilogue(bias is not None, activation)
    kernel, why = _tuned(a, b, epilogue, tf32)
    if kernel is not None:
        bias_c = None
        if bias is not None:
            bias_c = bias.reshape(-1)
            if bias_c.dtype != a.dtype or not bias_c.flags.c_contiguous:
                bias_c = cp.ascontiguousarray(bias_c, dtype=a.dtype)
            if bias_c.shape != (b.shape[1],):
                raise PycLabError(f"matmul: bias of shape {tuple(bias.shape)} for an output "
                                  f"of {b.shape[1]} columns (give one value per column)")
        target = out
        if out is None or not out.flags.c_contiguous or out.dtype != a.dtype:
            target = cp.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
            if beta and out is not None:
                target[...] = out
            elif out is None:
                beta = 0.0
        kernel(a, b, target, alpha=alpha, beta=beta, bias=bias_c)
        _record("cutlass", why, config=kernel.config.id if kernel.config else None,
                epilogue=epilogue.name)
        if out is not None and target is not out:
            out[...] = target
            return out
        return target
    if epilogue.fused:
        return _fused(cp, a, b, out, alpha, beta, bias, activation, why)
    y = cp.matmul(a, b)
    if alpha != 1.0:
        y *= alpha
    if beta and out is not None:
        y += beta * out
    _record("cublas", why)
    if out is not None:
        out[...] = y
        return out
    return y


def _is_cupy(x: Any) -> bool:
    return type(x).__module__.startswith("cupy")


def _dtype_issue(x: Any, name: str) -> str:
    """Why ``x``'s dtype is not one :func:`matmul` computes in (``""`` when it is)."""
    dtype = np.dtype(x.dtype)
    if dtype.name in DTYPES:
        return ""
    return (f"matmul: {name} has dtype {dtype}; pl.matmul computes in {', '.join(DTYPES)} "
            f"(mixed ones promote as in NumPy); cast it, e.g. {name}.astype(np.float32)")


def _result_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of ``np.matmul`` of operands shaped ``a`` and ``b`` (checked to multiply)."""
    batch = np.broadcast_shapes(a[:-2], b[:-2])
    rows = a[-2:-1]
    cols = b[-1:] if len(b) >= 2 else ()
    return (*batch, *rows, *cols)


def _check_inputs(a: Any, b: Any, out: Any, alpha: Any, beta: Any, bias: Any,
                  activation: str | None) -> Any:
    """Refuse what :func:`matmul` cannot compute correctly, with one clear error each.

    Returns the bias as a vector of one value per output column (``None`` when none),
    so that no path can broadcast it another way.
    """
    if activation is not None and activation not in ACTIVATIONS:
        raise PycLabError(f"matmul activation must be None or one of {ACTIVATIONS}, got "
                          f"{activation!r}")
    for name, x in (("a", a), ("b", b)):
        if not hasattr(x, "dtype") or not hasattr(x, "shape") or getattr(x, "ndim", 0) < 1:
            raise PycLabError(f"matmul takes arrays with at least one dimension; {name} is "
                              f"{type(x).__name__}")
    if _is_cupy(a) != _is_cupy(b):
        raise PycLabError(f"matmul: a is a {'CuPy' if _is_cupy(a) else 'NumPy'} array and b "
                          f"a {'CuPy' if _is_cupy(b) else 'NumPy'} one; give both on the "
                          "same device (cupy.asarray or .get())")
    for name, x in (("a", a), ("b", b)):
        issue = _dtype_issue(x, name)
        if issue:
            raise PycLabError(issue)
    if a.shape[-1] != b.shape[0 if b.ndim == 1 else -2]:
        raise PycLabError(f"matmul: a {tuple(a.shape)} and b {tuple(b.shape)} do not "
                          "multiply (inner dimensions differ)")
    try:
        shape = _result_shape(tuple(a.shape), tuple(b.shape))
    except ValueError:
        raise PycLabError(f"matmul: the batch dimensions of a {tuple(a.shape)} and b "
                          f"{tuple(b.shape)} do not broadcast") from None
    result = np.result_type(a.dtype, b.dtype)
    for name, value in (("alpha", alpha), ("beta", beta)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(
                value, (int, float, np.integer, np.floating)):
            raise PycLabError(f"matmul {name} must be a real number, got {value!r}")
    if out is not None:
        if not hasattr(out, "dtype") or tuple(getattr(out, "shape", ())) != shape or \
                _is_cupy(out) != _is_cupy(a):
            raise PycLabError(f"matmul: out must be a {'CuPy' if _is_cupy(a) else 'NumPy'} "
                              f"array of shape {shape} (the product's), got "
                              f"{type(out).__name__} {tuple(getattr(out, 'shape', ()))}")
        if np.dtype(out.dtype).name not in DTYPES or \
                not np.can_cast(result, out.dtype, casting="same_kind"):
            raise PycLabError(f"matmul: out has dtype {out.dtype}; the product is {result}, "
                              f"so out must be one of {', '.join(DTYPES)}")
    if bias is None:
        return None
    return _check_bias(a, b, bias, result)


def _check_bias(a: Any, b: Any, bias: Any, result: np.dtype) -> Any:
    """``bias`` as one value per output column, or a clear error."""
    if _is_cupy(bias) and not _is_cupy(a):
        raise PycLabError("matmul: bias is a CuPy array but a and b are NumPy arrays; give "
                          "a NumPy bias (bias.get())")
    if not hasattr(bias, "dtype") or not hasattr(bias, "reshape"):
        bias = np.asarray(bias)
    columns = b.shape[-1] if b.ndim >= 2 else None
    if columns is None:
        raise PycLabError("matmul: a bias needs b with at least two dimensions (one value "
                          "per output column); b is a vector")
    dtype = np.dtype(bias.dtype)
    if dtype.kind not in "biuf" or not np.can_cast(dtype, result, casting="same_kind"):
        raise PycLabError(f"matmul: bias has dtype {dtype}, which cannot be added to a "
                          f"{result} product without changing its kind; give a real "
                          f"floating bias, e.g. bias.astype(np.{result})")
    shape = tuple(bias.shape)
    if not shape or shape[-1] != columns or int(np.prod(shape)) != columns:
        raise PycLabError(f"matmul: bias of shape {shape} for an output of {columns} "
                          f"columns; give one value per column, shape ({columns},)")
    return bias.reshape(-1)


def _epilogue(xp: Any, y: Any, bias: Any, activation: str | None) -> Any:
    """Bias and activation with NumPy or CuPy (``xp``)."""
    if bias is not None:
        y = y + bias
    if activation == "relu":
        y = xp.maximum(y, 0)
    elif activation == "gelu":
        y = 0.5 * y * (1 + xp.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    elif activation == "silu":
        y = y / (1 + xp.exp(-y))
    return y


def _fused(cp: Any, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any,
           activation: str | None, why_cutlass: str) -> Any:
    from . import cublaslt

    why = cublaslt.why_not(tuple(a.shape), tuple(b.shape), a.dtype, b.dtype, a.dtype,
                           tuple(bias.shape) if bias is not None else None,
                           bias.dtype if bias is not None else None, activation)
    if not why and alpha == 1.0 and not (beta and out is not None):
        target = out if out is not None and out.flags.c_contiguous else \
            cp.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
        key = ("lt", bias is not None, activation)
        with _LOCK:
            gemm = _KERNELS.get(key)
            if gemm is None:
                gemm = _KERNELS[key] = cublaslt.FusedGemm(activation, bias is not None)
        gemm(a, b, target, None if bias is None else cp.ascontiguousarray(bias).reshape(-1))
        _record("cublaslt", f"bias/activation in cuBLASLt's epilogue "
                            f"({cublaslt.EPILOGUES[(bias is not None, activation)]}); "
                            f"not CUTLASS: {why_cutlass}")
        if out is not None and target is not out:
            out[...] = target
            return out
        return target
    y = alpha * cp.matmul(a, b)
    if beta and out is not None:
        y = y + beta * out
    y = _epilogue(cp, y, bias, activation)
    _record("cublas", f"cuBLAS and CuPy for the epilogue ({why or 'alpha/beta given'}); "
                      f"not CUTLASS: {why_cutlass}")
    if out is not None:
        out[...] = y
        return out
    return y.astype(a.dtype, copy=False)
