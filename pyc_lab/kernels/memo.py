"""Bounded memos: what a hot path remembers per problem (a plan, a choice, a loaded
kernel), its memory capped by dropping the oldest entries first."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["remember"]


def remember(memo: dict, key: Any, value: Any, limit: int, lock: threading.Lock) -> None:
    """Store ``value`` under ``key`` in ``memo``, then drop the oldest entries until at
    most ``limit`` remain (dicts keep insertion order)."""
    with lock:
        memo[key] = value
        while len(memo) > limit:
            del memo[next(iter(memo))]
