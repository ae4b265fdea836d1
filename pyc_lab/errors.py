"""Errors raised by pyc_lab.

Every error pyc_lab raises on purpose is a :class:`PycLabError`; its message says
what was wrong and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "DeviceUnavailableError",
    "PycLabError",
    "SnapshotError",
]


class PycLabError(Exception):
    """Base class of every error pyc_lab raises on purpose."""


class DeviceUnavailableError(PycLabError):
    """A feature needs a CUDA device (or a GPU library) that this machine lacks."""


class SnapshotError(PycLabError):
    """A hardware snapshot could not be read: missing, not JSON, or not a profile."""
