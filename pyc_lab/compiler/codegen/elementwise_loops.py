"""The loops of an elementwise kernel: collapsed layouts, index arithmetic and pieces.

An elementwise kernel (:mod:`.elementwise`) walks its output in one or more loops. Each
:class:`Part` is one loop: the pieces of the output it computes (the whole output; the
operands of an output concatenation, several at once when they share a shape; the
outputs of a body with several), the union of their loads (:mod:`pyc_lab.compiler.views`)
and the collapsed layout every array is walked in: size-1 dimensions dropped and
dimensions merged where every array walks them as one contiguous run, so the common
cases need one or no division per element. Shapes and strides are static (a compiled
signature has static shapes) and are written into the source as constants.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..ir import Graph
from ..views import Load, Piece, contiguous_strides
from . import cuda_types as ct

__all__ = ["DeviceFunction", "Part", "coords", "idx_type", "layout", "offset", "parts_of",
           "pieces_note"]

#: Builds a piece's ``__device__`` function: ``(name, body, out dtype, root, loads) ->
#: (source, helper sections it needs)``.
DeviceFunction = Callable[[str, Graph, np.dtype, int, Sequence[Load]], tuple[str, set[str]]]


# -- layout: collapsed dims and per-array strides ------------------------------------------
def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    return contiguous_strides(tuple(shape))


def layout(out_shape: tuple[int, ...], in_shapes: Sequence[tuple[int, ...]],
            in_strides: Sequence[Sequence[int]] | None = None,
            out_strides: Sequence[int] | None = None) \
        -> tuple[list[int], list[int], list[list[int]]]:
    """Collapsed output dims, the output's strides and every input's (elements, 0 =
    broadcast). Arrays are C-contiguous unless ``in_strides``/``out_strides`` give their
    element strides (views read or written in place)."""
    rank = len(out_shape)
    out_str = list(out_strides) if out_strides is not None else _contiguous_strides(out_shape)
    in_str = []
    for k, shape in enumerate(in_shapes):
        own = list(in_strides[k]) if in_strides is not None else _contiguous_strides(shape)
        pad = rank - len(shape)
        row = []
        for j in range(rank):
            if j < pad:
                row.append(0)
            else:
                d = shape[j - pad]
                row.append(0 if d == 1 and out_shape[j] != 1 else own[j - pad])
        in_str.append(row)
    keep = [j for j in range(rank) if out_shape[j] != 1]
    dims = [out_shape[j] for j in keep]
    strides = [[out_str[j] for j in keep]] + [[s[j] for j in keep] for s in in_str]
    if not dims:  # a single element
        return [1], [1], [[0] for _ in in_shapes]
    # merge dim j into j+1 when every array walks both as one contiguous run
    k = len(dims) - 2
    while k >= 0:
        if all(s[k] == s[k + 1] * dims[k + 1] for s in strides):
            dims[k] = dims[k] * dims[k + 1]
            del dims[k + 1]
            for s in strides:
                s[k] = s[k + 1]
                del s[k + 1]
        k -= 1
    return dims, strides[0], strides[1:]


# -- kernel source -------------------------------------------------------------------------
def idx_type(n: int) -> tuple[str, str]:
    """Index C type and literal suffix: 32-bit when the size allows."""
    return ("unsigned int", "u") if n < 2**31 else ("unsigned long long", "ull")


def coords(dims: list[int], needed: set[int], idx: str, itype: str, sfx: str,
            indent: str) -> list[str]:
    """Lines computing the needed output coordinates ``c<j>`` of flat index ``idx``."""
    if not needed or len(dims) == 1:
        return []
    lines = []
    outer = min(needed)
    rest = idx
    for j in range(len(dims) - 1, outer, -1):
        if j in needed:
            lines.append(f"{indent}const {itype} c{j} = {rest} % {dims[j]}{sfx};")
        if rest == idx:
            lines.append(f"{indent}{itype} r = {idx} / {dims[j]}{sfx};")
            rest = "r"
        else:
            lines.append(f"{indent}r /= {dims[j]}{sfx};")
    last = rest if outer == 0 else f"{rest} % {dims[outer]}{sfx}"
    lines.append(f"{indent}const {itype} c{outer} = {last};")
    return lines


def offset(strides: list[int], out_strides: list[int], idx: str, sfx: str,
            names: dict[int, str] | None = None, base: int = 0) -> str:
    """C expression of an array's element offset for iteration element ``idx``.

    ``out_strides`` are the iteration's own (an array walking them is read at ``idx``);
    ``names`` overrides the coordinate expression of some dims (default ``c<j>``);
    ``base`` is the array's element offset. A negative stride is subtracted (index
    arithmetic is unsigned: the total is what it is modulo the index width).
    """
    if strides == out_strides:
        return f"{idx} + {base}{sfx}" if base else idx
    names = names or {}
    terms = [f"{base}{sfx}"] if base else []
    for j, s in enumerate(strides):
        if s == 0:
            continue
        coord = idx if len(strides) == 1 else names.get(j, f"c{j}")
        term = coord if abs(s) == 1 else f"{coord} * {abs(s)}{sfx}"
        terms.append(f"- {term}" if s < 0 else term)
    text = " + ".join(terms).replace("+ - ", "- ") if terms else "0"
    return f"0{sfx} {text}" if text.startswith("- ") else text


class Part:
    """Pieces of the output walked by one loop: pieces of one shape (all of them, for
    the halves of a rotary embedding) share their iteration, so a load they share is
    read once per element for all of them. Holds each piece's device function, the
    collapsed layout and the union of their loads."""

    def __init__(self, names: list[str], pieces: list[Piece], body: Graph,
                 out_dtypes: list[np.dtype], device_function: DeviceFunction) -> None:
        self.pieces = pieces
        self.names = names
        # where each piece is stored: its output array's name and dtype
        self.outs = [("out" if piece.out_param == 0 else f"out{piece.out_param}",
                      out_dtypes[piece.out_param]) for piece in pieces]
        shape = pieces[0].shape
        union: dict[int, Load] = {}
        for piece in pieces:
            for ld in piece.loads:
                union.setdefault(ld.node, ld)
        order = {nid: k for k, nid in enumerate(body.nodes)}
        self.loads = sorted(union.values(), key=lambda ld: order[ld.node])
        index = {ld.node: k for k, ld in enumerate(self.loads)}
        self.args = [[index[ld.node] for ld in piece.loads] for piece in pieces]
        self.funcs, self.needs = [], set()
        for name, piece, (_, odt) in zip(names, pieces, self.outs, strict=True):
            func, needs = device_function(name, body, odt, piece.root, piece.loads)
            self.funcs.append(func)
            self.needs |= needs
        self.n = int(np.prod(shape, dtype=np.int64))
        self.dtypes = [body.node(ld.node).dtype for ld in self.loads]
        # a gather's index is walked like one more array (it takes part in the collapse)
        gathers = [k for k, ld in enumerate(self.loads) if ld.gather is not None]
        self.index_dtypes = {k: body.node(self.loads[k].gather.node).dtype  # type: ignore
                             for k in gathers}
        shapes = [ld.shape for ld in self.loads] + [self.loads[k].shape for k in gathers]
        strides = [ld.strides for ld in self.loads] + [
            self.loads[k].gather.strides for k in gathers]  # type: ignore[union-attr]
        if self.n == 0:
            self.dims, self.out_str, walked = [0], [1], [[1] for _ in shapes]
        else:
            self.dims, self.out_str, walked = layout(shape, shapes, strides,
                                                     pieces[0].out_strides)
        self.in_str = walked[:len(self.loads)]
        self.index_str = dict(zip(gathers, walked[len(self.loads):], strict=True))
        self.it_str = _contiguous_strides(self.dims)
        # (a gather runs along the innermost dimension when its index does not change
        # there: a row of an embedding table is one run)
        self.along = [bool(s[-1] == 1) and (k not in self.index_str
                                            or self.index_str[k][-1] == 0)
                      for k, s in enumerate(self.in_str)]

    def vector_ok(self, vec: int) -> bool:
        """Whether ``vec`` consecutive elements of these pieces are one aligned vector
        of the output and of every load running along the innermost dimension."""
        if self.n == 0:
            return True
        dims = self.dims
        if len(dims) > 1 and dims[-1] % vec:
            return False
        if self.out_str[-1] != 1 or any(s % vec for s in self.out_str[:-1]) \
                or any(piece.out_offset % vec for piece in self.pieces):
            return False
        for k, (ld, s) in enumerate(zip(self.loads, self.in_str, strict=True)):
            if k in self.index_str:
                if self.index_str[k][-1] != 0:
                    return False  # the index changes within a vector: one element a time
                if s[-1] == 1 and ld.gather.stride % vec:  # type: ignore[union-attr]
                    return False  # a gathered row would start between two vectors
            if s[-1] == 1:
                if any(t % vec for t in s[:-1]) or ld.offset % vec:
                    return False
            elif s[-1] != 0:
                return False  # a strided innermost read (a transpose): no vector form
        return True

    def _calls(self, args: list[str]) -> list[tuple[Piece, str, str, np.dtype]]:
        """Per piece: the piece, its device function's call, its output's name and dtype."""
        return [(piece, f"{name}({', '.join(args[k] for k in idx)})", oname, odt)
                for piece, name, idx, (oname, odt) in zip(self.pieces, self.names, self.args,
                                                          self.outs, strict=True)]

    def element_lines(self, idx: str, indent: str, itype: str, sfx: str) -> list[str]:
        """One element ``idx`` of the pieces: the loads, then each piece's call and
        store."""
        arrays = [self.out_str, *self.in_str, *self.index_str.values()]
        needed = {j for s in arrays if s != self.it_str for j, v in enumerate(s) if v}
        lines = coords(self.dims, needed, idx, itype, sfx, indent)
        args = []
        for k, (ld, d) in enumerate(zip(self.loads, self.dtypes, strict=True)):
            off = offset(self.in_str[k], self.it_str, idx, sfx, base=ld.offset)
            if ld.gather is not None:
                off = self._gathered(k, ld, off, idx, itype, sfx, indent, lines)
            lines.append(f"{indent}const {ct.compute_type(d)} x{k} = "
                         f"{ct.from_storage(d, f'in{ld.param}[{off}]')};")
            args.append(f"x{k}")
        for piece, call, oname, odt in self._calls(args):
            out_off = offset(self.out_str, self.it_str, idx, sfx, base=piece.out_offset)
            lines.append(f"{indent}{oname}[{out_off}] = {ct.to_storage(odt, call)};")
        return lines

    def _gathered(self, k: int, ld: Load, off: str, idx: str, itype: str, sfx: str,
                  indent: str, lines: list[str]) -> str:
        """Append the lines reading gather ``k``'s index (wrapped into the axis) and
        return its source offset."""
        g = ld.gather
        assert g is not None
        ioff = offset(self.index_str[k], self.it_str, idx, sfx, base=g.offset)
        raw = ct.storage_type(self.index_dtypes[k])
        n = g.length
        lines += [
            f"{indent}long long j{k} = static_cast<long long>("
            f"static_cast<{raw}>(in{g.param}[{ioff}]));",
            f"{indent}if (static_cast<unsigned long long>(j{k}) >= {n}ull) {{"
            "  // negative: from the end; out of range: wrapped",
            f"{indent}    j{k} = ((j{k} % {n}LL) + {n}LL) % {n}LL;",
            f"{indent}}}",
            f"{indent}const {itype} w{k} = static_cast<{itype}>(j{k});",
        ]
        step = f"w{k}" if abs(g.stride) == 1 else f"w{k} * {abs(g.stride)}{sfx}"
        return f"({off}) {'-' if g.stride < 0 else '+'} {step}"

    def vector_lines(self, vec: int, itype: str, sfx: str) -> list[str]:
        """The body of the vector loop (``i``: the vectors' first element)."""
        dims, inner = self.dims, self.dims[-1]
        last = {len(dims) - 1: f"(i % {inner}{sfx})"}
        arrays = [self.out_str, *self.in_str, *self.index_str.values()]
        needed = {j for s in arrays if s != self.it_str
                  for j, v in enumerate(s[:-1] if len(dims) > 1 else []) if v}
        lines = coords(dims, needed, "i", itype, sfx, "        ")
        args = []
        for k, (ld, d) in enumerate(zip(self.loads, self.dtypes, strict=True)):
            st = ct.storage_type(d)
            if self.along[k]:
                # the innermost coordinate of a vector's first element is i % inner
                off = offset(self.in_str[k], self.it_str, "i", sfx, last, base=ld.offset)
                if ld.gather is not None:  # one index for the whole vector
                    off = self._gathered(k, ld, off, "i", itype, sfx, "        ", lines)
                lines.append(
                    f"        const pyc_vec<{st}, {vec}> x{k} = "
                    f"*reinterpret_cast<const pyc_vec<{st}, {vec}>*>(in{ld.param} + {off});")
                args.append(ct.from_storage(d, f"x{k}.v[e]"))
            else:
                outer = [*self.in_str[k][:-1], 0] if len(dims) > 1 else [0]
                off = offset(outer, self.it_str, "i", sfx, base=ld.offset) \
                    if any(outer) or ld.offset else "0"
                if ld.gather is not None:
                    off = self._gathered(k, ld, off, "i", itype, sfx, "        ", lines)
                lines.append(f"        const {ct.compute_type(d)} x{k} = "
                             f"{ct.from_storage(d, f'in{ld.param}[{off}]')};  "
                             "// the same for the whole vector")
                args.append(f"x{k}")
        for p, (piece, call, oname, odt) in enumerate(self._calls(args)):
            so = ct.storage_type(odt)
            y = "y" if len(self.pieces) == 1 else f"y{p}"
            out_off = offset(self.out_str, self.it_str, "i", sfx, last,
                              base=piece.out_offset)
            lines += [
                f"        pyc_vec<{so}, {vec}> {y};",
                "#pragma unroll",
                f"        for (int e = 0; e < {vec}; ++e) {{",
                f"            {y}.v[e] = {ct.to_storage(odt, call)};",
                "        }",
                f"        *reinterpret_cast<pyc_vec<{so}, {vec}>*>({oname} + {out_off}) = {y};",
            ]
        return lines


def parts_of(name: str, pieces: list[Piece], body: Graph, out_dtypes: list[np.dtype],
             device_function: DeviceFunction) -> list[Part]:
    """The loops of a kernel: one for all pieces when they have one shape, else one per
    piece."""
    names = [f"{name}_op" if len(pieces) == 1 else f"{name}_op{p}" for p in range(len(pieces))]
    if len({piece.shape for piece in pieces}) == 1:
        return [Part(names, pieces, body, out_dtypes, device_function)]
    return [Part([nm], [piece], body, out_dtypes, device_function)
            for nm, piece in zip(names, pieces, strict=True)]


def pieces_note(part: Part, p: int, loops: int) -> str:
    """The comment on a loop's element count."""
    if len(part.pieces) > 1:
        return f"  // elements of each of {len(part.pieces)} pieces of the concatenation"
    return f"  // piece {p} of the concatenation" if loops > 1 else ""


