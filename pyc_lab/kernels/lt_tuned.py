"""A tuned cuBLASLt pick run like a tuned kernel: :class:`TunedLt`.

The tuner measures cuBLASLt's heuristic picks (:mod:`.tuning.lt_candidates`) beside its
own kernels; a pick that won is stored in the tuning database and :func:`pyc_lab.matmul`
loads it as a :class:`TunedLt` — the same object the tuner timed — which issues the GEMM
through :class:`~.blas_direct.LtGemm` with that pick (the direct call: three pointers
and a stream). The pick is checked against each problem and pointer alignment on its
first call, and where cuBLASLt refuses it (or is another version) the heuristic's choice
runs instead (logged).
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import PycLabError
from .lt_algos import LtPick
from .matmul_launch import plain_call_stream

__all__ = ["DTYPES", "FAMILY", "TunedLt"]

#: What :func:`pyc_lab.matmul` reports as the implementation of a tuned pick.
FAMILY = "cublaslt-tuned"
#: Kernel dtypes and their cuBLASLt dtype; and the array dtype names they take (bfloat16
#: bits may be held as 16-bit integers, as the tuner's operands are).
DTYPES = {"f16": "float16", "bf16": "bfloat16"}
_ARRAYS = {"f16": ("float16",), "bf16": ("bfloat16", "int16", "uint16")}
#: Problems (shapes, strides, scales) whose :class:`~.blas_direct.LtGemm` is kept.
_MAX_GEMMS = 64


class TunedLt:
    """``out = alpha * a @ b + beta * out`` through cuBLASLt with one kept pick.

    Parameters
    ----------
    config
        The :class:`~.lt_algos.LtPick`.
    dtype
        ``"f16"`` or ``"bf16"``.

    Raises
    ------
    PycLabError
        For another dtype.
    """

    family = FAMILY

    def __init__(self, config: LtPick, dtype: str) -> None:
        if dtype not in DTYPES:
            raise PycLabError(f"TunedLt: dtype {dtype!r} is not one of {sorted(DTYPES)}")
        self.config = config
        self.dtype = dtype
        self._gemms: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TunedLt({self.config.id}, {self.dtype})"

    def can_implement(self, m: int, n: int, k: int) -> bool:
        """Every non-empty problem (a pick cuBLASLt refuses falls back at the call)."""
        return min(m, n, k) > 0

    def gemm(self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0) -> Any:
        """The :class:`~.blas_direct.LtGemm` of these operands' shapes and strides with
        the pick (made once per problem)."""
        from .blas_direct import LtGemm
        from .blas_layout import describe

        want = DTYPES[self.dtype]
        if any(x.dtype.name not in _ARRAYS[self.dtype] for x in (a, b, out)):
            raise PycLabError(f"TunedLt built for {self.dtype} got "
                              f"{sorted({x.dtype.name for x in (a, b, out)})} arrays")
        size = a.dtype.itemsize
        strides = [tuple(s // size for s in x.strides) for x in (a, b, out)]
        key = (a.shape, b.shape, out.shape, *strides, float(alpha), float(beta))
        g = self._gemms.get(key)
        if g is None:
            desc = describe(tuple(a.shape), strides[0], tuple(b.shape), strides[1],
                            strides[2])
            if isinstance(desc, str):
                raise PycLabError(f"TunedLt {self.config.id}: {desc}")
            g = LtGemm(desc, want, alpha, beta, setting=self.config)
            with self._lock:
                if len(self._gemms) >= _MAX_GEMMS:
                    self._gemms.clear()
                self._gemms[key] = g
        return g

    def __call__(self, a: Any, b: Any, out: Any, c: Any = None, alpha: float = 1.0,
                 beta: float = 0.0, stream: Any = None, bias: Any = None) -> Any:
        """``out = alpha * a @ b + beta * out`` on ``stream`` (the current one).

        Raises
        ------
        PycLabError
            For a bias, a ``c`` other than ``out``, or operands that are not BLAS
            matrices of the setting's dtype.
        """
        s = plain_call_stream("TunedLt", out, c, bias, stream)
        self.gemm(a, b, out, alpha, beta)(a.data.ptr, b.data.ptr, out.data.ptr, s.ptr)
        return out
