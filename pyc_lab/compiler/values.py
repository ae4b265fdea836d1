"""Telling traced values apart without importing the proxy class.

The tracing helpers (:mod:`.ufuncs`, :mod:`.reductions`, :mod:`.mutation`,
:mod:`.array_functions`) are imported by :mod:`.proxy`; they recognise its proxies by a
class marker instead of importing it back, so no import runs in a circle.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_traced"]


def is_traced(value: Any) -> bool:
    """Whether ``value`` is a :class:`~pyc_lab.compiler.proxy.Traced` proxy."""
    return bool(getattr(type(value), "__pyc_traced__", False))
