"""Quantiles of a stream in bounded memory: what long runs report medians and tails with.

A :class:`QuantileSketch` keeps logarithmic bins of the values it has seen, so its
quantiles are within a known relative accuracy whatever the stream's length; the belt's
folded spans and the dispatcher's task records use it once their rings of recent items
are full.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["QuantileSketch"]


class QuantileSketch:
    """Quantiles of a stream of non-negative values, in bounded memory.

    Values are counted in logarithmic buckets ``(g**(k-1), g**k]`` with
    ``g = (1 + a) / (1 - a)`` (the DDSketch construction), so any quantile comes back
    within a relative error ``a`` of the stream's value at that rank however many values
    were added. Memory grows only with the range of the values, not their number:
    durations from a nanosecond to an hour need at most about 1,450 buckets at 1 %
    (a belt's usually fill a few hundred); values at or below ``min_value`` share one.

    Parameters
    ----------
    relative_accuracy
        ``a``, in (0, 1).
    min_value
        Values at or below this count as the smallest bucket.

    Examples
    --------
    >>> q = QuantileSketch()
    >>> for k in range(1, 1001):
    ...     q.add(k * 1e-3)
    >>> abs(q.quantile(0.5) - 0.5) < 0.01 * 0.5, q.count
    (True, 1000)
    """

    __slots__ = ("_bins", "_gamma", "_low", "_per_log", "count", "max", "min",
                 "min_value", "total")

    def __init__(self, relative_accuracy: float = 0.01, min_value: float = 1e-9) -> None:
        if not 0.0 < relative_accuracy < 1.0:
            raise ValueError(f"relative_accuracy must be in (0, 1), got {relative_accuracy!r}")
        self._gamma = (1.0 + relative_accuracy) / (1.0 - relative_accuracy)
        self._per_log = 1.0 / math.log(self._gamma)
        self.min_value = float(min_value)
        self._bins: dict[int, int] = {}
        self._low = 0
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, value: float, times: int = 1) -> None:
        """Count one value (negative ones count as 0), ``times`` times over (the
        compute time of a batch, once per request in it)."""
        v = float(value)
        if v < 0.0:
            v = 0.0
        self.count += times
        self.total += v * times
        if v < self.min:
            self.min = v
        if v > self.max:
            self.max = v
        if v <= self.min_value:
            self._low += times
            return
        k = math.ceil(math.log(v) * self._per_log)
        bins = self._bins
        bins[k] = bins.get(k, 0) + times

    def add_many(self, values: Sequence[float]) -> None:
        """Count several values at once (what :meth:`add` does, vectorised)."""
        if len(values) < 16:
            for v in values:
                self.add(v)
            return
        import numpy as np

        a = np.asarray(values, dtype=np.float64)
        low = float(a.min())
        if low < 0.0:  # negative values count as 0
            a = np.maximum(a, 0.0)
            low = 0.0
        self.count += len(a)
        self.total += float(a.sum())
        self.min = min(self.min, low)
        self.max = max(self.max, float(a.max()))
        high = a if low > self.min_value else a[a > self.min_value]
        self._low += len(a) - len(high)
        if not len(high):
            return
        scaled = np.log(high)
        scaled *= self._per_log
        keys = np.ceil(scaled, out=scaled).astype(np.int64)
        first = int(keys.min())
        counts = np.bincount(keys - first)  # values cluster: a short array
        seen = np.flatnonzero(counts)
        bins = self._bins
        for k, c in zip((seen + first).tolist(), counts[seen].tolist(), strict=True):
            bins[k] = bins.get(k, 0) + c

    def _value(self, k: int) -> float:
        """The value bucket ``k`` stands for (within the relative accuracy of all in it)."""
        return 2.0 * self._gamma ** k / (self._gamma + 1.0)

    def quantile(self, q: float) -> float | None:
        """The value at rank ``q * (count - 1)`` (``q`` in [0, 1]); ``None`` when empty."""
        if not self.count:
            return None
        rank = min(max(float(q), 0.0), 1.0) * (self.count - 1)
        seen = self._low
        if rank < seen:
            return self.min
        for k in sorted(self._bins):
            seen += self._bins[k]
            if rank < seen:
                return min(max(self._value(k), self.min), self.max)
        return self.max

    def at_least(self, threshold: float) -> tuple[int, float]:
        """How many values are at least ``threshold``, and their sum (by bucket)."""
        n, total_ = 0, 0.0
        if threshold <= self.min_value:
            n += self._low
        for k, c in self._bins.items():
            v = self._value(k)
            if v >= threshold:
                n, total_ = n + c, total_ + c * v
        return n, total_

    def copy(self) -> QuantileSketch:
        """An independent copy."""
        other = QuantileSketch.__new__(QuantileSketch)
        for name in self.__slots__:
            setattr(other, name, getattr(self, name))
        other._bins = dict(self._bins)
        return other
