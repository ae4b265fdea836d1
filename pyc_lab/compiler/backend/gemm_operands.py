"""A matmul node's operands as the library multiplies them, and the library call.

:func:`gemm_operands` applies a node's transposes as views; :func:`batched_operands`
folds a batched float matmul into the 3-D form :func:`pyc_lab.matmul` takes as one
strided-batched GEMM; :func:`library_product` is the 2-D product by ``pl.matmul``'s
library rule. Shared by the GEMM steps (:mod:`.steps`) and the lowering.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Node

__all__ = ["batched_gemm", "batched_operands", "gemm_operands", "library_product"]


def gemm_operands(node: Node, values: dict[int, Any]) -> tuple[Any, Any]:
    """A matmul node's two operands as multiplied: views with its transposes applied."""
    a, b = values[node.inputs[0]], values[node.inputs[1]]
    if node.attrs.get("transpose_a") and a.ndim >= 2:
        a = a.swapaxes(-1, -2)
    if node.attrs.get("transpose_b") and b.ndim >= 2:
        b = b.swapaxes(-1, -2)
    return a, b


def batched_gemm(a_shape: tuple[int, ...], a_dtype: Any, b_shape: tuple[int, ...],
                 b_dtype: Any) -> bool:
    """Whether a matmul of these operands runs as one batch of GEMMs through
    :func:`pyc_lab.matmul` (see :func:`batched_operands`)."""
    return (len(a_shape) > 2 and len(b_shape) >= 2 and np.dtype(a_dtype) == np.dtype(b_dtype)
            and np.dtype(a_dtype).kind == "f"
            and (len(b_shape) == 2 or tuple(b_shape[:-2]) == tuple(a_shape[:-2])))


def batched_operands(a: Any, b: Any) -> tuple[Any, Any, tuple[int, ...]] | None:
    """A batched float matmul's operands as 3-D ``(B, M, K) @ (B, K, N)`` (or ``@ (K, N)``)
    views for :func:`pyc_lab.matmul`, and the product's shape; None for a 2-D problem,
    broadcast batch dimensions, integers or mixed dtypes (``cupy.matmul`` runs those).

    ``cupy.matmul`` computes a batch of float16/bfloat16 GEMMs in float32 copies (14x
    slower than one strided-batched GEMM on the H200 for attention's ``q @ k^T``:
    benchmarks/results/h200/attention-rotary.json); ``pl.matmul`` issues one.
    """
    if not batched_gemm(a.shape, a.dtype, b.shape, b.dtype):
        return None
    batch = tuple(a.shape[:-2])
    count = int(np.prod(batch, dtype=np.int64))
    if count == 0:
        return None
    a3 = a.reshape(count, *a.shape[-2:])
    b3 = b.reshape(count, *b.shape[-2:]) if b.ndim > 2 else b
    return a3, b3, (*batch, a.shape[-2], b.shape[-1])


#: Operand dtypes whose 2-D product goes through :func:`pyc_lab.matmul`.
_LIBRARY_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})


def library_product(cp: Any, a: Any, b: Any, out: Any = None) -> Any:
    """``a @ b`` by the library, into ``out`` or a new array.

    Two CuPy matrices of one float dtype go through :func:`pyc_lab.matmul`: its library path
    for the problem — cuBLASLt for bfloat16 (CuPy's bfloat16 matmul is the slower path),
    cuBLAS and cuBLASLt's measured candidates raced at the first call for a large
    float16 problem, the tuned winner where the tuning database has one — issued
    straight to the library at about half of ``cupy.matmul``'s host time, by the
    never-slower rule of :mod:`pyc_lab.kernels.matmul_route`. Anything else (integers,
    mixed dtypes, vectors and stacks, NumPy arrays standing in for CuPy in tests) through
    ``cp.matmul``.
    """
    if type(a).__module__.startswith("cupy") and type(b) is type(a) and a.ndim == 2 \
            and b.ndim == 2 and a.dtype == b.dtype and a.dtype.name in _LIBRARY_DTYPES:
        from ...kernels.matmul import matmul

        return matmul(a, b, out=out)
    return cp.matmul(a, b) if out is None else cp.matmul(a, b, out=out)
