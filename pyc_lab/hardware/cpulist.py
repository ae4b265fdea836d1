"""Linux CPU-list strings ("0-3,8,10-11") to and from sorted integer lists."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import PycLabError

__all__ = ["format_cpulist", "parse_cpulist"]


def parse_cpulist(text: str) -> list[int]:
    """Parse a Linux cpulist such as ``"0-3,8,10-11"`` into sorted CPU ids.

    Parameters
    ----------
    text
        The list as sysfs writes it (``/sys/devices/system/node/node0/cpulist``).
        An empty string is an empty list.

    Returns
    -------
    list of int
        The CPU ids, sorted and without repeats.

    Raises
    ------
    PycLabError
        If a part is not ``N`` or ``N-M`` with ``N <= M``.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise PycLabError(
                f"bad CPU list {text!r}: {part!r} is not N or N-M; expected e.g. '0-3,8'"
            ) from None
        if first < 0 or last < first:
            raise PycLabError(f"bad CPU list {text!r}: range {part!r} runs backwards")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format CPU ids as a compact cpulist (``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``)."""
    ids = sorted(set(int(c) for c in cpus))
    parts: list[str] = []
    start = prev = None
    for c in ids:
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = c
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(parts)


def cpumask_to_list(words: Iterable[int], bits_per_word: int = 64) -> list[int]:
    """Turn an affinity bitmask given as words (NVML's ``cpuSet``) into CPU ids."""
    cpus = []
    for w, word in enumerate(words):
        word = int(word)
        for b in range(bits_per_word):
            if word >> b & 1:
                cpus.append(w * bits_per_word + b)
    return cpus
