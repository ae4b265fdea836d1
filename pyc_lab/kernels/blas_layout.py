"""A row-major ``out = a @ b`` described as the column-major GEMM cuBLAS runs.

cuBLAS and cuBLASLt are column-major. A row-major ``r x c`` matrix with row stride ``s``
is, read column-major, its ``c x r`` transpose with leading dimension ``s``; so the
row-major product ``out (M x N) = a (M x K) @ b (K x N)`` is computed as the
column-major ``out^T (N x M) = b^T (N x K) @ a^T (K x M)``: cuBLAS's ``A`` is ``b``,
its ``B`` is ``a``, each with ``op = N`` when it is row-major and ``op = T`` when it is a
transposed (column-major) view. Batched operands add a batch stride (0 broadcasts a 2-D
``b`` over a 3-D ``a``).

:func:`describe` does this arithmetic once, from shapes and element strides, and says
why not when an operand is not a BLAS matrix (no unit stride, negative or overlapping
strides): those stay with the array library. It touches no GPU; the tests check it
against a NumPy model of what cuBLAS reads.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

__all__ = ["OP_N", "OP_T", "BlasGemm", "describe", "matrix_form", "merged_stride"]

#: cuBLAS's operation codes (``CUBLAS_OP_N``, ``CUBLAS_OP_T``; cuBLASLt uses the same).
OP_N, OP_T = 0, 1


@dataclass(frozen=True)
class BlasGemm:
    """The column-major GEMM ``C = op(A) @ op(B)`` that computes a row-major ``a @ b``.

    Attributes
    ----------
    m, n, k
        cuBLAS's extents: ``m = N`` (rows of ``out^T``), ``n = M``, ``k = K``.
    op_a, lda, stride_a
        cuBLAS's ``A`` (the operand ``b``): its op, leading dimension and batch stride.
    op_b, ldb, stride_b
        cuBLAS's ``B`` (the operand ``a``).
    ldc, stride_c
        The output's leading dimension (its row stride) and batch stride.
    batch
        The number of products (1 for 2-D).
    rows_a, cols_a, rows_b, cols_b
        The stored (column-major) shapes of ``A`` and ``B``, as cuBLASLt's layouts take
        them.
    """

    m: int
    n: int
    k: int
    op_a: int
    lda: int
    stride_a: int
    op_b: int
    ldb: int
    stride_b: int
    ldc: int
    stride_c: int
    batch: int
    rows_a: int
    cols_a: int
    rows_b: int
    cols_b: int


def _matrix(rows: int, cols: int, s_row: int, s_col: int) -> tuple[int, int, int, int] | str:
    """A row-major-indexed ``rows x cols`` matrix as ``(op, ld, stored_rows, stored_cols)``
    of its *transpose*, column-major; or why it is not a BLAS matrix.

    ``op = N``: stored column-major as ``cols x rows`` with ``ld = s_row`` (row-major).
    ``op = T``: stored column-major as ``rows x cols`` with ``ld = s_col`` (a transposed
    view), read transposed.
    """
    if s_col == 1 or cols == 1:
        ld = s_row if rows > 1 else max(cols, 1)
        if ld >= max(cols, 1):
            return 0, ld, cols, rows
    if s_row == 1 or rows == 1:
        ld = s_col if cols > 1 else max(rows, 1)
        if ld >= max(rows, 1):
            return 1, ld, rows, cols
    return f"strides ({s_row}, {s_col}) of a {rows} x {cols} matrix: no unit stride " \
           "with a leading dimension covering the other"


def merged_stride(shape: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """The stride (in the strides' units) that walks the dimensions ``shape`` (C order)
    as one, or ``None`` where no single stride does; 0 when there is nothing to walk past
    the first element (every extent 1)."""
    dims = [(d, s) for d, s in zip(shape, strides, strict=True) if d != 1]
    if not dims:
        return 0
    for (_, outer), (inner_d, inner) in itertools.pairwise(dims):
        if outer != inner_d * inner:
            return None
    return dims[-1][1]


def _fold_stack(a_shape: tuple[int, ...], a_strides: tuple[int, ...],
                b_shape: tuple[int, ...], out_strides: tuple[int, ...]
                ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]] | None:
    """A stack ``(B, M, K) @ (K, N)`` whose ``B x M`` rows of ``a`` and of the output are
    each one row-major matrix (every row a fixed stride after the one before, across the
    batches too) as the one 2-D product ``(B * M, K) @ (K, N)``: ``(a_shape, a_strides,
    out_strides)`` of that product, or ``None`` (not a stack over a 2-D ``b``, or rows
    that do not continue across batches). One GEMM of ``B * M`` rows is what the
    libraries tile well; a strided batch of ``B`` small products with ``b`` broadcast
    runs a tile per batch (38.4 µs against 13.3 µs for 4096 stacks of 9 rows on H100s:
    ``inference-kernels.json`` in benchmarks/results/h100/issue15-7bcafb1 and
    issue15-5584b1c)."""
    if len(a_shape) != 3 or len(b_shape) != 2 or len(out_strides) != 3 or a_shape[0] < 2:
        return None
    batch, mm, kk = a_shape
    nn = b_shape[1]
    if (a_strides[2] != 1 and kk > 1) or (out_strides[2] != 1 and nn > 1):
        return None  # rows not unit-stride: a transposed view
    row_a = merged_stride((batch, mm), a_strides[:2])
    row_out = merged_stride((batch, mm), out_strides[:2])
    if row_a is None or row_out is None or row_a < kk or row_out < nn:
        return None  # rows that do not continue, or that overlap
    return (batch * mm, kk), (row_a, 1), (row_out, 1)


def matrix_form(rows: int, cols: int, s_row: int, s_col: int) -> tuple[bool, int] | str:
    """How a row-major-indexed ``rows x cols`` matrix with element strides ``(s_row,
    s_col)`` lies in memory, as :func:`describe` reads it: ``(row_major, ld)`` — rows
    contiguous with row stride ``ld``, or columns contiguous with column stride ``ld`` —
    or why it is not a BLAS matrix."""
    got = _matrix(rows, cols, s_row, s_col)
    if isinstance(got, str):
        return got
    op, ld, _stored_rows, _stored_cols = got
    return op == OP_N, ld


def describe(a_shape: tuple[int, ...], a_strides: tuple[int, ...],
             b_shape: tuple[int, ...], b_strides: tuple[int, ...],
             out_strides: tuple[int, ...]) -> BlasGemm | str:
    """The column-major GEMM of a row-major ``out = a @ b``, or why there is none.

    Parameters
    ----------
    a_shape, a_strides
        ``a``: ``(M, K)`` or ``(B, M, K)``, strides in elements.
    b_shape, b_strides
        ``b``: ``(K, N)`` or ``(B, K, N)``, strides in elements.
    out_strides
        The output's strides in elements (``(M, N)`` or ``(B, M, N)``); its rows must be
        unit-stride.

    Returns
    -------
    BlasGemm or str
        The description, or a sentence saying why the operands are not BLAS matrices.
    """
    if len(a_shape) not in (2, 3) or len(b_shape) not in (2, 3):
        return "operands of other than 2 or 3 dimensions"
    folded = _fold_stack(a_shape, a_strides, b_shape, out_strides)
    if folded is not None:
        return describe(folded[0], folded[1], b_shape, b_strides, folded[2])
    if len(b_shape) == 3 and len(a_shape) != 3:
        return "a 2-D a with a batched b"
    if min(*a_shape, *b_shape) <= 0:
        return "an empty operand"
    if any(s < 0 for s in (*a_strides, *b_strides, *out_strides)):
        return "a negative stride"
    batch = a_shape[0] if len(a_shape) == 3 else 1
    if len(b_shape) == 3 and b_shape[0] != batch:
        return "batch sizes differ"
    mm, kk = a_shape[-2:]
    kb, nn = b_shape[-2:]
    if kb != kk:
        return "inner extents differ"
    got_a = _matrix(mm, kk, a_strides[-2], a_strides[-1])
    got_b = _matrix(kk, nn, b_strides[-2], b_strides[-1])
    if isinstance(got_a, str):
        return f"a: {got_a}"
    if isinstance(got_b, str):
        return f"b: {got_b}"
    if len(out_strides) != len(a_shape):
        return "out's rank differs from the product's"
    if out_strides[-1] != 1 and nn > 1:
        return "out's rows are not unit-stride"
    ldc = out_strides[-2] if mm > 1 else nn
    if ldc < nn:
        return "out's rows overlap"
    stride_c = out_strides[0] if batch > 1 else mm * ldc
    if batch > 1 and stride_c < mm * ldc:
        return "out's batches overlap"
    op_b, ldb, rows_b, cols_b = got_a
    op_a, lda, rows_a, cols_a = got_b
    stride_b = a_strides[0] if len(a_shape) == 3 else 0
    stride_a = b_strides[0] if len(b_shape) == 3 else 0
    if batch == 1:  # unused by a single product; the stored extents, for tidiness
        stride_a, stride_b = lda * cols_a, ldb * cols_b
    return BlasGemm(m=nn, n=mm, k=kk, op_a=op_a, lda=lda, stride_a=stride_a,
                    op_b=op_b, ldb=ldb, stride_b=stride_b, ldc=ldc, stride_c=stride_c,
                    batch=batch, rows_a=rows_a, cols_a=cols_a, rows_b=rows_b, cols_b=cols_b)
