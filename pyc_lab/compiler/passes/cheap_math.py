"""Cheap math: small integer powers of floats become multiplications.

``x ** n`` with a 0-d constant integer exponent ``3 <= n <= MAX_EXPONENT`` (``3`` or
``3.0``) on a floating-point ``x`` becomes a chain of multiplications by repeated
squaring (``x**3 = (x*x)*x``, ``x**4 = (x*x)*(x*x)``, ``x**8``: three multiplications).
``pow`` is one of the costliest functions a GPU evaluates (a logarithm, an exponential
and corrections), while a multiplication is one instruction; torch.compile makes the
same rewrite. ``x ** 2`` is already ``x * x`` in :mod:`.simplify`, where it is exact.

Accuracy: each multiplication rounds once, and a relative error doubles when a value
is squared, so the product is within ``(n - 1) u`` of ``x ** n`` computed exactly (``u``
the unit roundoff, half the relative spacing of the dtype's numbers): at most ``n - 1``
units in the last place of the result (2 ulp for ``x**3``, 7 for ``x**8``). NumPy's own
float32 ``power`` is within 1 ulp and CUDA's ``powf`` within 4. float16 and bfloat16
results are rounded to their dtype after every multiplication, as NumPy's (and
ml_dtypes') arithmetic is, so the bound is in their ulps.
Special values keep NumPy's answers:
NaN stays NaN, ``(+-inf) ** n`` and ``(-0.0) ** n`` keep their signs, and a product that
overflows is infinite as ``pow``'s is; only results in the subnormal range can differ
by more than the bound (by at most the smallest subnormal per multiplication).

Conditions: the exponent is a 0-d constant equal to an integer in range, the base is
not a constant, and every product has the power's shape and dtype (an exponent that
promotes the result — a 0-d float64 array against a float32 base — blocks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph, Node
from .rewrite import as_float, const_value, is_const, is_float, prune, same_type, try_infer

if TYPE_CHECKING:
    from .rewrite import PassContext

__all__ = ["MAX_EXPONENT", "NAME", "integer_exponent", "run"]

NAME = "cheap_math"

#: The largest exponent rewritten (3 multiplications, 7 ulp; the bound grows with ``n``).
MAX_EXPONENT = 8


def integer_exponent(graph: Graph, nid: int) -> int | None:
    """The exponent's value if ``nid`` is a 0-d constant equal to an integer in
    ``[3, MAX_EXPONENT]``, else ``None``."""
    arr = const_value(graph, nid)
    if arr is not None:
        arr = as_float(arr)  # a bfloat16 exponent too
    if arr is None or arr.ndim != 0 or arr.dtype.kind not in "iuf":
        return None
    value = arr.item()
    if isinstance(value, float) and not value.is_integer():
        return None
    n = int(value)
    return n if 3 <= n <= MAX_EXPONENT else None


def _chain(graph: Graph, anchor: Node, base: int, n: int) -> int:
    """Insert ``base ** n`` as multiplications (repeated squaring) before ``anchor``;
    the product's id. Every factor has ``anchor``'s type (checked by the caller), so
    every product has it too."""
    result: int | None = None
    square = base
    while True:
        if n & 1:
            result = square if result is None else graph.insert_before(
                anchor.id, "multiply", (result, square), {}).id
        n >>= 1
        if not n:
            return result
        square = graph.insert_before(anchor.id, "multiply", (square, square), {}).id


def run(graph: Graph, ctx: PassContext) -> bool:
    """Rewrite small integer powers of floats as multiplications, in place.

    Parameters
    ----------
    graph : Graph
        The graph, rewritten in place.
    ctx : PassContext
        Receives one note per rewrite.

    Returns
    -------
    bool
        Whether anything changed.
    """
    changed = False
    for n in list(graph):
        if n.id not in graph.nodes or n.op != "power" or len(n.inputs) != 2:
            continue
        base, exp = n.inputs
        if not is_float(n) or is_const(graph, base) \
                or not same_type(graph.nodes[base], n):
            continue
        power = integer_exponent(graph, exp)
        if power is None or try_infer("multiply", [graph.nodes[base]] * 2, {}) \
                != (tuple(n.shape), n.dtype):
            continue
        product = _chain(graph, n, base, power)
        graph.replace_uses(n.id, product)
        prune(graph, [n.id])
        multiplies = bin(power).count("1") + power.bit_length() - 2
        ctx.note(f"{NAME}: x**{power} as {multiplies} multiplications "
                 f"(within {power - 1} ulp): power %{n.id} -> %{product}")
        changed = True
    return changed

