"""A compiled function bound to its arguments: run again and again with no copies.

``bound = f.bind(*arrays)`` is to a compiled function what onnxruntime's IOBinding is to
a session: the arrays are given once, and each ``bound()`` runs ``f`` on whatever they
hold then. On the CuPy backend with CUDA graphs the arrays are exactly what the captured
graphs read (inputs read in place, see :mod:`.backend.graphs`; the binding captures a
program of its own where ``f``'s copies an input), so a run is one launch per graph and
per library call between graphs — no copy into static buffers, no output allocated or
copied out: the results are the program's own arrays, overwritten by its next run
(``bound()`` again, or a call of ``f`` on the same arrays when the binding shares ``f``'s
program). Binding compiles ``f`` for the arrays if need be but does not call it: what
``f``'s own calls read in place is left as it was. Write new values
into the bound arrays between runs (``x[...] = ...``), never rebind them.

Where that does not hold — the NumPy backend, no CUDA graph (not captured, or refused),
an argument the graphs copy, an artifact that needs work around its run (a graph break,
an argument written back or returned) — ``bound()`` is ``f(*arrays)``: the same
results, fresh arrays, the full path's cost; :attr:`BoundCall.zero_copy` and
:attr:`BoundCall.why` say which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["BoundCall"]


class BoundCall:
    """``f`` bound to ``args``: ``bound()`` runs it on what they hold now.

    Parameters
    ----------
    fn
        The compiled function.
    args
        Its arguments, every one an array of the backend's kind, passed positionally.

    Attributes
    ----------
    zero_copy
        Whether runs launch the captured program on the bound arrays in place.
    why
        Why not, when they do not (``""`` when they do).
    """

    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self._run: Callable[[], Any] | None
        self._holds: Callable[[], bool] | None
        self._run, self._holds, self.why = fn._bound_launch(args)

    @property
    def zero_copy(self) -> bool:
        """Whether runs launch the captured program on the bound arrays in place."""
        return self._run is not None

    def __call__(self) -> Any:
        """Run ``f`` on the bound arrays: its result, as ``f`` returns it (on the
        zero-copy path, views of the program's arrays, valid until its next run)."""
        run, holds = self._run, self._holds
        if run is None or holds is None or not holds():
            return self.fn(*self.args)
        return run()

    def __repr__(self) -> str:
        how = "zero-copy replay" if self.zero_copy else f"full calls ({self.why})"
        return f"<BoundCall {getattr(self.fn, '__name__', 'fn')}: {how}>"
