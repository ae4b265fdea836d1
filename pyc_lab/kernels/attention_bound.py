"""``pl.attention`` on CuPy arrays at fixed addresses, as a call made once and run often.

Every call of :func:`~.attention.attention` on CuPy arrays hands them to torch through
DLPack, enters a torch stream context, finds the problem's choice (pyc_lab's kernel or
torch's SDPA) and hands the result back: tens of microseconds of host time around a
kernel that may take a few. :func:`bound_attention` does the conversions and the choice
once for operands that keep their addresses (a compiled function's inputs called again
with the same arrays, a CUDA-graph replay program's static arrays) and returns a call
that only launches: pyc_lab's kernel by raw pointers on CuPy's current stream, or SDPA
on the torch views made once, its result copied into the caller's array with one
``cudaMemcpyAsync``. The choice is made again when the tuning database changes
(:func:`~.matmul.db_stamp`), as :func:`~.attention_sm90.fused_choice` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import PycLabError
from . import arrays
from .attention import _check, _scale, _sdpa

__all__ = ["BoundAttention", "bound_attention"]

#: cudaMemcpyDeviceToDevice
_D2D = 3


class BoundAttention:
    """``softmax(q @ k^T * scale [+ mask]) @ v`` of fixed CuPy operands into ``out``.

    Built by :func:`bound_attention`; ``call(out)`` writes the ``(B, Hq, Sq, Dv)`` result
    into ``out`` (a C-contiguous CuPy array of the operands' dtype and that many
    elements, any shape) on CuPy's current stream.
    """

    def __init__(self, q: Any, k: Any, v: Any, mask: Any, causal: bool, scale: float) -> None:
        import torch

        self._ptrs = (q.data.ptr, k.data.ptr, v.data.ptr)
        self.dtype = q.dtype
        self.shape = (*q.shape[:3], v.shape[-1])
        self.nbytes = int(q.dtype.itemsize * q.shape[0] * q.shape[1] * q.shape[2]
                          * v.shape[-1])
        self.causal, self.scale = causal, scale
        with torch.cuda.stream(arrays.torch_stream_of_cupy()):
            self._t = tuple(torch.from_dlpack(x) for x in (q, k, v))
            self._mask = None if mask is None else torch.from_dlpack(mask)
        self._device = self._t[0].device
        self._stamp: Any = None
        self.choice: Any = None
        self._choose()

    def _sdpa(self) -> Any:
        return _sdpa(*self._t, self.causal, self.scale, self._mask)

    def _choose(self) -> Any:
        """The choice for the tuning database as it is now (raced on first sight)."""
        from .attention_sm90 import fused_choice
        from .matmul import db_stamp

        stamp = db_stamp()
        if stamp != self._stamp or self.choice is None:
            import torch

            with torch.cuda.stream(arrays.torch_stream_of_cupy()):
                probe = torch.empty(self.shape, dtype=self._t[0].dtype, device=self._device)
                self.choice = fused_choice(*self._t, probe, self.causal, self.scale,
                                           self._mask, self._sdpa)
            self._stamp = stamp
        return self.choice

    @property
    def route(self) -> str:
        """``"pyc-fused"`` or ``"torch-sdpa"``: what a call runs now."""
        return self.choice.route

    def __call__(self, out: Any) -> None:
        import cupy as cp

        if out.dtype != self.dtype or out.nbytes != self.nbytes or \
                not out.flags.c_contiguous:
            raise PycLabError(f"pl.attention: a bound call's output must be a C-contiguous "
                              f"{self.dtype} array of {self.nbytes} bytes (the result "
                              f"{self.shape}), got {out.dtype} {tuple(out.shape)}")
        stream = cp.cuda.get_current_stream().ptr
        choice = self._choose()
        if choice.kernel is not None and out.data.ptr % 16 == 0:
            choice.kernel.run(choice.geometry, *self._ptrs, out.data.ptr, 0, stream)
            return
        if stream == arrays.torch_raw_stream(self._device.index):
            y = self._sdpa().contiguous()
        else:
            import torch

            with torch.cuda.stream(arrays.torch_stream_of_cupy()):
                y = self._sdpa().contiguous()
        cp.cuda.runtime.memcpyAsync(out.data.ptr, y.data_ptr(), self.nbytes, _D2D, stream)


def bound_attention(q: Any, k: Any, v: Any, *, causal: bool = False,
                    scale: float | None = None, mask: Any = None
                    ) -> Callable[[Any], None] | None:
    """A call computing ``pl.attention(q, k, v, ...)`` into a given array, for CuPy
    arrays that keep their addresses and contents' layout between calls.

    Parameters
    ----------
    q, k, v : cupy.ndarray
        ``(B, Hq, Sq, D)``, ``(B, Hkv, Sk, D)``, ``(B, Hkv, Sk, Dv)``, C-contiguous, one
        dtype (as :func:`~.attention.attention` takes them, layout ``"bhsd"``).
    causal, scale, mask
        As :func:`~.attention.attention` (the mask a CuPy array of the operands' dtype or
        boolean).

    Returns
    -------
    callable or None
        ``call(out)``, see :class:`BoundAttention`; the problem's choice between pyc_lab's
        kernel and torch's SDPA is made here (raced on its first sight). ``None`` where
        that does not apply — not CuPy arrays, no torch, an operand or the mask not
        C-contiguous, a mask of another float dtype: then call
        :func:`~.attention.attention` each time.

    Raises
    ------
    PycLabError
        Operands :func:`~.attention.attention` refuses.
    """
    if arrays.kind(q) != "cupy" or not arrays.torch_installed():
        return None
    q, k, v = _check(q, k, v, mask, "bhsd")
    if not all(x.flags.c_contiguous for x in (q, k, v)):
        return None
    if mask is not None and (not mask.flags.c_contiguous or
                             (mask.dtype.kind != "b" and mask.dtype != q.dtype)):
        return None
    scale = _scale(scale, q)
    return BoundAttention(q, k, v, mask, bool(causal), scale)
