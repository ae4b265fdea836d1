"""cuBLASLt GEMMs with the bias and activation applied inside the GEMM (nvmath-python).

``cupy.matmul`` calls cuBLAS, which writes the product to memory; a bias add and an
activation then read it back and write it again. cuBLASLt can apply them in the GEMM's
epilogue, on the float32 accumulator, before the single store. nvmath-python
(``nvmath.linalg.advanced.Matmul``) is NVIDIA's Python interface to it: a stateful
object planned once (heuristic or measured algorithm choice) and executed many times.

cuBLASLt is column-major and its bias vector runs along the result's rows, so the
row-major problem ``out = act(a @ b + bias)`` with ``bias`` of length ``N`` is run as
``out.T = act(b.T @ a.T + bias)``: the operands are transposed *views* (no copies), and
the result is written in place into ``out.T``, a view of the caller's C-contiguous
``out`` (a memory-planned buffer, say).

Epilogues: bias, relu, gelu (the tanh approximation, which is what cuBLASLt computes and
what :func:`pyc_lab.compiler.functions.gelu` means), relu + bias and gelu + bias, for
2-D float16, bfloat16 and float32 operands of one dtype. Everything else stays with
``cupy.matmul`` plus a generated epilogue kernel; :func:`why_not` says why.

:class:`LtMatmul` is the plain GEMM (no epilogue) through the same library, 2-D or
batched (3-D operands, or a 3-D ``a`` with a 2-D ``b``, in one cuBLASLt call): the
bfloat16 path of :func:`pyc_lab.matmul`; :func:`why_not_plain` says when it cannot run.

Nothing here touches a GPU until a :class:`FusedGemm` is first called.
"""

from __future__ import annotations

import importlib.util
import logging
from functools import lru_cache
from typing import Any

import numpy as np

from ..errors import PycLabError

__all__ = ["ACTIVATIONS", "DTYPES", "EPILOGUES", "FusedGemm", "LtMatmul", "status", "why_not",
           "why_not_plain"]

log = logging.getLogger(__name__)

#: (has bias, activation) -> the cuBLASLt epilogue (``nvmath...MatmulEpilog`` member).
EPILOGUES = {
    (True, None): "BIAS",
    (True, "relu"): "RELU_BIAS",
    (True, "gelu"): "GELU_BIAS",
    (False, "relu"): "RELU",
    (False, "gelu"): "GELU",
}
#: Activations cuBLASLt applies in its epilogue.
ACTIVATIONS = ("relu", "gelu")
#: Operand dtypes taken through cuBLASLt here.
DTYPES = ("float16", "bfloat16", "float32")


@lru_cache(maxsize=1)
def status() -> tuple[bool, str]:
    """Whether nvmath-python is installed: ``(True, "nvmath-python X")`` or
    ``(False, reason)``. Cheap: nothing is imported."""
    if importlib.util.find_spec("nvmath") is None:
        return False, "nvmath-python is not installed (pip install 'pyc-lab[gpu]')"
    try:
        from importlib.metadata import version

        return True, f"nvmath-python {version('nvmath-python')}"
    except Exception:
        return True, "nvmath-python"


def why_not(a_shape: tuple[int, ...], b_shape: tuple[int, ...], a_dtype: Any, b_dtype: Any,
            out_dtype: Any, bias_shape: tuple[int, ...] | None, bias_dtype: Any,
            activation: str | None) -> str:
    """Why ``act(a @ b + bias)`` cannot run as one cuBLASLt GEMM here, or ``""``.

    Parameters
    ----------
    a_shape, b_shape
        Operand shapes as multiplied (after any transposes).
    a_dtype, b_dtype, out_dtype
        Operand and result dtypes.
    bias_shape, bias_dtype
        The bias (``None`` for no bias).
    activation
        ``None``, ``"relu"``, ``"gelu"`` or another name (refused).
    """
    ok, reason = status()
    if not ok:
        return reason
    if activation is not None and activation not in ACTIVATIONS:
        return f"cuBLASLt has no {activation} epilogue (it has {', '.join(ACTIVATIONS)})"
    if bias_shape is None and activation is None:
        return "no epilogue to fuse"
    if len(a_shape) != 2 or len(b_shape) != 2:
        return "batched matmul: the cuBLASLt path here takes 2-D operands"
    dts = {np.dtype(a_dtype).name, np.dtype(b_dtype).name, np.dtype(out_dtype).name}
    if bias_shape is not None:
        dts.add(np.dtype(bias_dtype).name)
    if len(dts) != 1 or next(iter(dts)) not in DTYPES:
        return (f"dtypes {sorted(dts)}: the cuBLASLt path takes one dtype, "
                f"{' or '.join(DTYPES)}, for operands, bias and result")
    m, k = a_shape
    k2, n = b_shape
    if k != k2:
        return f"inner dimensions differ ({k} and {k2})"
    if min(m, n, k) == 0:
        return "an empty matrix"
    if bias_shape is not None and (not bias_shape or bias_shape[-1] != n
                                   or any(d != 1 for d in bias_shape[:-1])):
        return f"bias of shape {tuple(bias_shape)} is not a row vector of length {n}"
    return ""


_NVMATH_LOG = logging.getLogger(__name__ + ".nvmath")


class FusedGemm:
    """``out = act(a @ b + bias)`` as one cuBLASLt GEMM, planned once and re-run.

    Parameters
    ----------
    activation
        ``None``, ``"relu"`` or ``"gelu"`` (tanh approximation).
    has_bias
        Whether calls pass a bias (a row vector of length ``N``).
    autotune
        Measure cuBLASLt's candidate algorithms at the first call and keep the fastest
        (``nvmath`` ``Matmul.autotune``), instead of taking the heuristic's first.

    Notes
    -----
    A plan is made per alignment class of the four pointers (cuBLASLt chooses
    algorithms knowing the alignment); operands are re-bound only when a pointer changes.
    Calls run on CuPy's current stream and do not synchronise.
    """

    def __init__(self, activation: str | None = None, has_bias: bool = True,
                 autotune: bool = False) -> None:
        if (has_bias, activation) not in EPILOGUES:
            raise PycLabError(f"FusedGemm: no cuBLASLt epilogue for bias={has_bias}, "
                              f"activation={activation!r}; use relu, gelu and/or a bias")
        self.activation = activation
        self.has_bias = has_bias
        self.autotune = autotune
        self.epilogue = EPILOGUES[(has_bias, activation)]
        self._plans: dict[tuple[int, ...], Any] = {}
        self._bound: dict[tuple[int, ...], tuple[int, ...]] = {}
        #: The algorithm cuBLASLt runs, per alignment class (for explain()).
        self.algorithms: dict[tuple[int, ...], str] = {}
        self.autotune_s = 0.0

    def _plan(self, key: tuple[int, ...], a: Any, b: Any, out: Any, bias: Any) -> Any:
        import time

        from nvmath.linalg.advanced import Matmul, MatmulEpilog

        mm = Matmul(b.T, a.T, c=out.T, beta=0.0,
                    options={"inplace": True, "logger": _NVMATH_LOG})
        inputs = {"bias": bias} if self.has_bias else None
        mm.plan(epilog=getattr(MatmulEpilog, self.epilogue), epilog_inputs=inputs)
        if self.autotune:
            t0 = time.perf_counter()
            mm.autotune(iterations=5)
            self.autotune_s += time.perf_counter() - t0
        try:
            self.algorithms[key] = str(mm.algorithms[0].algorithm_id)
        except Exception:
            self.algorithms[key] = "?"
        return mm

    def __call__(self, a: Any, b: Any, out: Any, bias: Any = None) -> Any:
        """Compute into ``out`` (C-contiguous, ``a.shape[0] x b.shape[1]``); returns ``out``.

        ``a`` and ``b`` are 2-D CuPy arrays of any strides (transposed views are fine);
        ``bias`` is a contiguous vector of length ``N`` when the GEMM has one.
        """
        if self.has_bias and bias is None:
            raise PycLabError("FusedGemm: this GEMM was made with a bias; pass bias=")
        if not out.flags.c_contiguous:
            raise PycLabError("FusedGemm: out must be C-contiguous")
        arrays = (a, b, out) + ((bias,) if self.has_bias else ())
        ptrs = tuple(x.data.ptr for x in arrays)
        key = tuple(p % 16 for p in ptrs)
        mm = self._plans.get(key)
        if mm is None:
            mm = self._plans[key] = self._plan(key, a, b, out, bias)
            self._bound[key] = ptrs
        elif self._bound[key] != ptrs:
            mm.reset_operands(a=b.T, b=a.T, c=out.T,
                              epilog_inputs={"bias": bias} if self.has_bias else None)
            self._bound[key] = ptrs
        mm.execute()
        return out

    def free(self) -> None:
        """Release the cuBLASLt plans and their workspaces."""
        _free_plans(self._plans, self._bound)


def why_not_plain(a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtype: str) -> str:
    """Why ``a @ b`` cannot run as one plain cuBLASLt GEMM (:class:`LtMatmul`), or ``""``.

    Parameters
    ----------
    a_shape, b_shape
        Operand shapes: 2-D, or 3-D ``a`` with 2-D or 3-D ``b`` (one batch).
    dtype
        The dtype name of both operands and the result.
    """
    ok, reason = status()
    if not ok:
        return reason
    if dtype not in DTYPES:
        return f"dtype {dtype}: the cuBLASLt path here takes {', '.join(DTYPES)}"
    if not 2 <= len(a_shape) <= 3 or not 2 <= len(b_shape) <= 3:
        return "operands of more than one batch dimension"
    if len(b_shape) == 3 and (len(a_shape) != 3 or a_shape[0] != b_shape[0]):
        return "b has a batch a does not share"
    if min(*a_shape, *b_shape) == 0:
        return "an empty matrix"
    return ""


def _mt(x: Any) -> Any:
    """The matrix transpose of a 2-D or batched array (a view)."""
    return x.swapaxes(-1, -2)


class LtMatmul:
    """``out = a @ b`` as one cuBLASLt GEMM (batched for 3-D operands), planned once per
    problem and pointer alignment, re-bound when a pointer changes.

    The row-major problem runs as ``out^T = b^T @ a^T`` on transposed views (no copies),
    written in place into the caller's C-contiguous ``out``. Calls run on CuPy's current
    stream, allocate nothing after the first (the workspace is kept) and do not
    synchronise. nvmath's plan keeps a reference to the last operands it ran on (until
    the next call re-binds them, or :meth:`free`).
    """

    def __init__(self) -> None:
        self._plans: dict[tuple, Any] = {}
        self._bound: dict[tuple, tuple[int, ...]] = {}
        #: The algorithm cuBLASLt runs, per alignment class (for explain()).
        self.algorithms: dict[tuple, str] = {}

    def _plan(self, key: tuple, a: Any, b: Any, out: Any) -> Any:
        from nvmath.linalg.advanced import Matmul

        mm = Matmul(_mt(b), _mt(a), c=_mt(out), beta=0.0,
                    options={"inplace": True, "logger": _NVMATH_LOG})
        mm.plan()
        try:
            self.algorithms[key] = str(mm.algorithms[0].algorithm_id)
        except Exception:
            self.algorithms[key] = "?"
        return mm

    def __call__(self, a: Any, b: Any, out: Any) -> Any:
        """Compute ``a @ b`` into ``out`` (C-contiguous, the product's shape and dtype)."""
        ptrs = (a.data.ptr, b.data.ptr, out.data.ptr)
        key = (a.shape, a.strides, b.shape, b.strides, *(p % 16 for p in ptrs))
        mm = self._plans.get(key)
        if mm is None:
            if not out.flags.c_contiguous:
                raise PycLabError("LtMatmul: out must be C-contiguous")
            mm = self._plans[key] = self._plan(key, a, b, out)
            self._bound[key] = ptrs
        elif self._bound[key] != ptrs:
            mm.reset_operands(a=_mt(b), b=_mt(a), c=_mt(out))
            self._bound[key] = ptrs
        mm.execute()
        return out

    def free(self) -> None:
        """Release the cuBLASLt plans and their workspaces."""
        _free_plans(self._plans, self._bound)


def _free_plans(plans: dict[tuple, Any], bound: dict[tuple, Any]) -> None:
    """Free nvmath plans (a failure is logged, never raised) and forget their bindings."""
    for mm in plans.values():
        try:
            mm.free()
        except Exception as exc:
            log.debug("freeing a cuBLASLt plan: %s", exc)
    plans.clear()
    bound.clear()
