"""Errors the compiler raises while tracing or running a compiled function.

Every one is a :class:`~pyc_lab.errors.PycLabError`. Where NumPy itself raises for the
same code (an out-of-range Python integer in arithmetic, an in-place result that cannot
be cast back), the error is also an instance of NumPy's exception type
(``OverflowError``, ``TypeError``, ``ValueError``), so code that catches NumPy's error
keeps working under :func:`pyc_lab.compile`.
"""

from __future__ import annotations

from ..errors import PycLabError

__all__ = ["CastingError", "DynamicShapeError", "ReadOnlyError", "ScalarOverflowError",
           "TraceError", "UnsupportedOperationError"]


class TraceError(PycLabError):
    """The function cannot be traced (data-dependent control flow, unsupported output)."""


class UnsupportedOperationError(TraceError):
    """An array operation that pyc_lab cannot trace; the message names it and says what
    to write instead."""


class ScalarOverflowError(PycLabError, OverflowError):
    """A Python integer does not fit the dtype NumPy computes in (NumPy raises
    ``OverflowError`` for the same expression)."""


class CastingError(PycLabError, TypeError):
    """A result cannot be cast to the dtype it must be stored in, or no NumPy loop takes
    these dtypes (NumPy raises ``TypeError`` for the same expression)."""


class ReadOnlyError(PycLabError, ValueError):
    """A write into a read-only view such as ``np.broadcast_to``'s result (NumPy raises
    ``ValueError`` for the same write)."""


class DynamicShapeError(PycLabError):
    """A graph break returned a shape or dtype other than the one seen while tracing.

    Raised while running a compiled graph; :class:`~pyc_lab.compiler.api.CompiledFunction`
    catches it and runs the function as written from then on (``explain()`` says why).
    """
