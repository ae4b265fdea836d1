"""Channels-last execution of an imported graph's 2-D convolutions.

An ONNX graph is channels first (``N, C, H, W``). pyc_lab's CUTLASS convolutions — the
tuned float32 (3xTF32), TF32 and 16-bit kernels of ``pl.autotune_conv`` — read
channels-last activations, and so do cuDNN's fastest tensor-core kernels; a
channels-first input would cost each convolution two transposes. With
``layout="channels_last"`` the imported program keeps activations channels last
(``N, H, W, C``) from the first 2-D convolution on, for as long as the ops that follow
do not care about the layout:

- every 2-D ``Conv`` reads and writes channels last (``pl.conv(..., layout=
  "channels_last")``), its input transposed once if it arrives channels first;
- elementwise ops of one tensor (:data:`UNARY`) stay channels last, and so do those of
  several (:data:`BINARY`) when one input is channels last: an input of the graph's
  layout of at most four axes (a per-channel ``1, C, 1, 1`` bias, an activation that
  did not pass a convolution) is transposed to channels last once — the same
  broadcast, axes permuted alike — rather than every channels-last input back;
- pooling (:data:`POOLS`: ``MaxPool`` and ``AveragePool`` windows, ``GlobalAveragePool``)
  slides over the spatial axes of a channels-last tensor where they are (axes 1 and 2),
  its result channels last;
- any other op — reshapes, concatenations, a graph's outputs — gets its inputs
  transposed back to channels first.

The decisions are made while the program is traced (array ranks are known then), so the
compiled program carries only the transposes that remain, as copies the compiler fuses
where it can; the outputs are the model's, in its own layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..kernels.conv import LAYOUTS  # the layouts an imported model's convolutions take

__all__ = ["BINARY", "LAYOUTS", "POOLS", "UNARY", "ChannelsLast"]

#: Ops elementwise in their first input, any others single values (Clip's bounds).
UNARY = frozenset({
    "Relu", "Sigmoid", "Tanh", "Gelu", "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal",
    "Erf", "LeakyRelu", "Clip", "Elu", "Selu", "Softplus", "Softsign", "HardSigmoid",
    "HardSwish", "Mish", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh",
    "Asinh", "Acosh", "Atanh", "Floor", "Ceil", "Round", "Sign", "Identity"})
#: Ops elementwise over all their inputs (broadcasting).
BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum"})
#: Pooling ops that run on a channels-last input as it is (their window's axes moved).
POOLS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool"})


def _last(x: Any) -> Any:
    return np.transpose(x, (0, 2, 3, 1))


def _first(x: Any) -> Any:
    return np.transpose(x, (0, 3, 1, 2))


def _single(x: Any) -> bool:
    """A value that broadcasts the same in either layout (one element)."""
    return x is None or int(np.size(x)) == 1


class ChannelsLast:
    """Which values of one run of an imported program are held channels last.

    One is made per trace of the program; :meth:`arguments` says how each step runs.
    """

    def __init__(self) -> None:
        self._last: set[str] = set()
        self._firsts: dict[str, Any] = {}  # a channels-last value's transpose, made once
        self._lasts: dict[str, Any] = {}  # a graph-layout value's, made once

    def arguments(self, op: str, names: Sequence[str], env: dict[str, Any]
                  ) -> tuple[list[Any], str]:
        """A step's arguments and how it runs: ``"conv"`` (a 2-D convolution on a
        channels-last input), ``"pool"`` (a pooling op of :data:`POOLS` on a
        channels-last input), ``"same"`` (an elementwise op on channels-last inputs, as
        it is) or ``"first"`` (as the graph says, every input channels first)."""
        values = [env[n] if n else None for n in names]
        last = [bool(n) and n in self._last for n in names]
        if op == "Conv" and len(values) > 1 and np.ndim(values[1]) == 4:
            x = values[0] if last[0] else _last(values[0])
            return [x, *values[1:]], "conv"
        if op in POOLS and last[0]:
            return values, "pool"
        if op in UNARY and last[0]:
            return values, "same"
        # every channels-last value is 4-D: they broadcast among themselves as the
        # graph's tensors do, a single value broadcasts alike in either layout, and a
        # graph-layout value of at most 4 axes does once its axes are permuted alike
        if op in BINARY and any(last) and all(
                is_last or _single(v) or np.ndim(v) <= 4
                for is_last, v in zip(last, values, strict=True)):
            return [v if is_last or _single(v) else self._last_of(n, v)
                    for n, v, is_last in zip(names, values, last, strict=True)], "same"
        return [self._first_of(n, v) if is_last else v
                for n, v, is_last in zip(names, values, last, strict=True)], "first"

    def _last_of(self, name: str, value: Any) -> Any:
        """``value`` (in the graph's layout, at most 4 axes) channels last: its leading
        axes filled to four with ones, then transposed — once however many ops read it
        so."""
        out = self._lasts.get(name)
        if out is None:
            shape = tuple(value.shape)
            out = self._lasts[name] = _last(np.reshape(value, (1,) * (4 - len(shape)) + shape))
        return out

    def _first_of(self, name: str, value: Any) -> Any:
        """``value`` (held channels last) in the graph's layout, transposed once however
        many ops read it so."""
        out = self._firsts.get(name)
        if out is None:
            out = self._firsts[name] = _first(value)
        return out

    def produced(self, names: Sequence[str], how: str) -> None:
        """Record the layout of a step's outputs (channels last unless it ran
        ``"first"``)."""
        for n in names:
            if not n:
                continue
            if how == "first":
                self._last.discard(n)
            else:
                self._last.add(n)

    def output(self, name: str, value: Any) -> Any:
        """A graph output in the model's own layout."""
        return self._first_of(name, value) if name in self._last else value

