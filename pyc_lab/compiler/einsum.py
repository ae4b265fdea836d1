"""``np.einsum`` as the ops it is: transposes, sums and batched matrix products.

:func:`plan` reads a subscript string and the operands' shapes and says how to compute
it with the compiler's ops, or raises :class:`NotPlanned` for what it does not cover
(repeated labels within one operand — diagonals —, labels whose sizes differ,
broadcasting other than through ``...``). A two-operand contraction becomes one batched
matmul: the labels both operands and the output share are the batch, the labels only
the operands share are contracted (``K``), each operand's own output labels are ``M``
and ``N``; each operand is first transposed to ``(batch, M, K)`` / ``(batch, K, N)`` and
flattened, the product is unflattened and transposed to the output's order. Labels that
appear in one operand only and not in the output are summed out of it first. More
operands are contracted pairwise, left to right, each intermediate keeping the labels a
later operand or the output still needs. The sums (NumPy's einsum sums in the operands'
dtype, so an int32 einsum stays int32) and products are exact where NumPy's are; float
results differ from NumPy's only by the order of their additions.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import ascii_letters

__all__ = ["Contraction", "NotPlanned", "parse", "plan_pair"]


class NotPlanned(Exception):
    """This einsum is not covered (it runs as written, a graph break)."""


def parse(subscripts: str, ndims: list[int]) -> tuple[list[str], str]:
    """The operands' label strings and the output's, ``...`` spelled out as letters not
    otherwise used and an implicit output (no ``->``) made explicit as NumPy makes it
    (the labels that appear once, in alphabetical order, after the broadcast ones)."""
    text = subscripts.replace(" ", "")
    if "->" in text:
        inputs, output = text.split("->")
        explicit = True
    else:
        inputs, output, explicit = text, "", False
    terms = inputs.split(",")
    if len(terms) != len(ndims):
        raise ValueError(f"einsum: {len(terms)} operand subscripts for {len(ndims)} operands")
    used = set(text) - set(".,->")
    if any(c not in ascii_letters for c in used):
        raise NotPlanned("a subscript that is not a letter")
    free = [c for c in ascii_letters if c not in used]
    ellipsis = max((nd - len(t.replace("...", "")) for t, nd in zip(terms, ndims, strict=True)
                    if "..." in t), default=0)
    if ellipsis > len(free):
        raise NotPlanned("too many broadcast dimensions")
    broadcast = "".join(free[:ellipsis])
    out_terms = []
    for t, nd in zip(terms, ndims, strict=True):
        if "..." in t:
            k = nd - len(t.replace("...", ""))
            t = t.replace("...", broadcast[ellipsis - k:])
        if "." in t or len(t) != nd:
            raise ValueError(f"einsum: subscripts {t!r} do not fit an operand of {nd} dims")
        out_terms.append(t)
    if explicit:
        output = output.replace("...", broadcast)
        if "." in output:
            raise ValueError("einsum: a malformed output subscript")
    else:
        counts: dict[str, int] = {}
        for t in out_terms:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        output = broadcast + "".join(sorted(c for c, n in counts.items()
                                            if n == 1 and c not in broadcast))
    for t in out_terms:
        if len(set(t)) != len(t):
            raise NotPlanned("a label repeated within one operand (a diagonal)")
    if len(set(output)) != len(output):
        raise ValueError("einsum: an output label appears twice")
    return out_terms, output


@dataclass(frozen=True)
class Contraction:
    """A two-operand contraction ``a, b -> out`` as one batched matmul.

    Attributes
    ----------
    a_order, b_order
        Transposes putting ``a`` in ``batch + m + k`` and ``b`` in ``batch + k + n`` order.
    batch, m, k, n
        The labels of each group, in that order.
    out_labels
        The product's labels after unflattening: ``batch + m + n``.
    """

    a_order: tuple[int, ...]
    b_order: tuple[int, ...]
    batch: str
    m: str
    k: str
    n: str

    @property
    def out_labels(self) -> str:
        return self.batch + self.m + self.n


def plan_pair(a: str, b: str, keep: str) -> Contraction:
    """The contraction of operands labelled ``a`` and ``b`` keeping labels ``keep`` (the
    output's, or those a later operand needs); every label of ``a`` and ``b`` must be in
    the other operand or in ``keep`` (sum it out first otherwise)."""
    batch = "".join(c for c in a if c in b and c in keep)
    k = "".join(c for c in a if c in b and c not in keep)
    m = "".join(c for c in a if c not in b)
    n = "".join(c for c in b if c not in a)
    if any(c not in keep for c in m + n):
        raise NotPlanned("a label of one operand only that is not kept (sum it first)")
    return Contraction(tuple(a.index(c) for c in batch + m + k),
                       tuple(b.index(c) for c in batch + k + n), batch, m, k, n)
