"""The array types :func:`pyc_lab.matmul` takes: NumPy, CuPy and torch, and bfloat16.

Three kinds of array reach a GEMM here: NumPy arrays (computed on the CPU), CuPy arrays
(on the GPU) and torch tensors. A CUDA torch tensor is viewed as a CuPy array through
DLPack (no copy), computed on torch's current stream (a CuPy stream over its handle,
:func:`torch_raw_stream`) and handed back as a torch tensor; a CPU
tensor goes through NumPy the same way.

bfloat16 has no NumPy type of its own: ``ml_dtypes`` supplies one (CuPy 14 imports it
and uses the same dtype for its bfloat16 arrays, which is what torch's bfloat16 tensors
arrive as). Its NumPy ``kind`` is ``"V"``, so promotion is spelled out in
:func:`result_dtype` rather than left to ``np.result_type`` (which refuses bfloat16 with
float16).

Nothing here imports CuPy or torch unless an array of theirs is given.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import numpy as np

from ..errors import PycLabError

__all__ = [
    "BF16",
    "FLOATS",
    "bf16_dtype",
    "cupy_of_torch",
    "dtype_name",
    "is_cupy",
    "is_torch",
    "kind",
    "numpy_dtype",
    "numpy_of_torch",
    "result_dtype",
    "torch_installed",
    "torch_of",
    "torch_raw_stream",
    "torch_stream",
    "torch_stream_of_cupy",
]

#: The name of the brain-float dtype (NumPy via ml_dtypes, CuPy 14, torch).
BF16 = "bfloat16"
#: Real floating dtypes, narrowest first, by name.
FLOATS = ("float16", BF16, "float32", "float64")

_STREAMS: dict[tuple[int, int], Any] = {}


def kind(x: Any) -> str:
    """``"cupy"``, ``"torch"`` or ``"numpy"`` (anything else that has a dtype and shape
    counts as NumPy-like), read from the type's module without importing anything."""
    mod = type(x).__module__
    if mod.startswith("cupy"):
        return "cupy"
    if mod.startswith("torch"):
        return "torch"
    return "numpy"


def is_cupy(x: Any) -> bool:
    """Whether ``x`` is a CuPy array (by its type's module)."""
    return type(x).__module__.startswith("cupy")


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (by its type's module)."""
    return type(x).__module__.startswith("torch")


def dtype_name(dtype: Any) -> str:
    """The NumPy-style name of a NumPy, CuPy or torch dtype (``torch.bfloat16`` ->
    ``"bfloat16"``)."""
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    text = str(dtype)
    return text[len("torch."):] if text.startswith("torch.") else np.dtype(dtype).name


def bf16_dtype() -> np.dtype:
    """NumPy's bfloat16 dtype (from ``ml_dtypes``).

    Raises
    ------
    PycLabError
        When ``ml_dtypes`` is not installed.
    """
    try:
        import ml_dtypes
    except ImportError:
        raise PycLabError("bfloat16 NumPy arrays need ml_dtypes (pip install ml_dtypes), "
                          "which gives NumPy its bfloat16 dtype") from None
    return np.dtype(ml_dtypes.bfloat16)


def result_dtype(a: str, b: str) -> str:
    """The dtype name of ``a @ b`` for two names in :data:`FLOATS`.

    NumPy's promotion, with bfloat16 placed as torch places it: ``bfloat16 @ bfloat16``
    stays bfloat16; with float16 or float32 it is float32; with float64, float64.
    """
    if a == b:
        return a
    if BF16 in (a, b):
        other = b if a == BF16 else a
        return "float64" if other == "float64" else "float32"
    return np.result_type(np.dtype(a), np.dtype(b)).name


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a name in :data:`FLOATS` (bfloat16 via :func:`bf16_dtype`)."""
    return bf16_dtype() if name == BF16 else np.dtype(name)


class _StreamHandle:
    """A ``cudaStream_t`` as the CUDA stream protocol hands it over (``__cuda_stream__``)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def cupy_stream(ptr: int, device_index: int) -> Any:
    """A CuPy stream over a ``cudaStream_t`` of a device (memoised per handle and device,
    so a call costs a dictionary look-up): ``cupy.cuda.Stream.from_external`` (the CUDA
    stream protocol) where CuPy has it, else its older ``ExternalStream``."""
    key = (ptr, device_index)
    stream = _STREAMS.get(key)
    if stream is None:
        import cupy as cp

        if len(_STREAMS) > 64:
            _STREAMS.clear()
        if ptr == 0:  # the legacy default stream
            stream = cp.cuda.Stream.null
        elif hasattr(cp.cuda.Stream, "from_external"):
            with cp.cuda.Device(device_index):
                stream = cp.cuda.Stream.from_external(_StreamHandle(ptr))
        else:
            stream = cp.cuda.ExternalStream(ptr, device_index)
        _STREAMS[key] = stream
    return stream


def torch_stream(device_index: int) -> Any:
    """A CuPy stream over torch's current stream on a device (:func:`cupy_stream`)."""
    return cupy_stream(torch_raw_stream(device_index), device_index)


def torch_raw_stream(device: Any = None) -> int:
    """torch's current ``cudaStream_t`` on ``device`` (an index, a ``torch.device``, or
    ``None``: torch's current device) as an integer.

    Read with ``torch._C._cuda_getCurrentRawStream``, the getter torch's own generated
    code (Inductor) launches on: about 0.2 us, where ``torch.cuda.current_stream()``
    builds a Python stream object (several us, as much as a whole GEMM plan's call). A
    torch without it is asked through ``torch.cuda.current_stream``.
    """
    import torch

    if isinstance(device, int):
        index: int | None = device
    elif device is None:
        index = None
    else:  # a torch.device, or its text ("cuda:1")
        index = (device if isinstance(device, torch.device) else torch.device(device)).index
    if index is None:
        index = torch.cuda.current_device()
    fast = _raw_stream_getter()
    if fast is not None:
        return int(fast(index))
    return int(torch.cuda.current_stream(index).cuda_stream)


@functools.cache
def _raw_stream_getter() -> Any:
    """``torch._C._cuda_getCurrentRawStream`` where this torch has it, else ``None``."""
    import torch

    return getattr(torch._C, "_cuda_getCurrentRawStream", None)


_TORCH_STREAMS: dict[tuple[int, int], Any] = {}


@functools.cache
def torch_installed() -> bool:
    """Whether torch can be imported (looked up once, without importing it)."""
    return importlib.util.find_spec("torch") is not None


def torch_stream_of_cupy() -> Any:
    """A torch ``ExternalStream`` over CuPy's current stream on CuPy's current device
    (memoised per stream handle): torch work issued under ``torch.cuda.stream(...)`` of
    it is ordered with the CuPy work around it, and DLPack needs no synchronisation."""
    import cupy as cp
    import torch

    key = (cp.cuda.get_current_stream().ptr, cp.cuda.Device().id)
    stream = _TORCH_STREAMS.get(key)
    if stream is None:
        if len(_TORCH_STREAMS) > 64:
            _TORCH_STREAMS.clear()
        stream = _TORCH_STREAMS[key] = torch.cuda.ExternalStream(key[0],
                                                                 device=f"cuda:{key[1]}")
    return stream


def cupy_of_torch(t: Any) -> Any:
    """A CuPy view of a CUDA torch tensor (DLPack, no copy; bfloat16 stays bfloat16).

    Call it with torch's current stream current in CuPy (:func:`torch_stream`), so that
    the DLPack exchange needs no synchronisation.

    Raises
    ------
    PycLabError
        For a tensor that requires grad (pl.matmul does not record gradients).
    """
    import cupy as cp

    if t.requires_grad:
        raise PycLabError("pl.matmul does not record gradients; pass tensor.detach() (or "
                          "call it under torch.no_grad())")
    return cp.from_dlpack(t)


def numpy_of_torch(t: Any) -> np.ndarray:
    """A NumPy view of a CPU torch tensor (bfloat16 through its bits, no copy)."""
    import torch

    if t.requires_grad:
        raise PycLabError("pl.matmul does not record gradients; pass tensor.detach()")
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(bf16_dtype())
    return t.numpy()


def host_of(t: Any) -> np.ndarray | None:
    """A NumPy copy of a torch tensor on any device, outside autograd (``None`` stays
    ``None``): what a host-side path computes on."""
    return None if t is None else numpy_of_torch(t.detach().cpu())


def torch_on(y: Any, device: Any) -> Any:
    """A host result (NumPy) as a torch tensor on ``device`` (``None`` stays ``None``):
    the way back from :func:`host_of`."""
    return None if y is None else torch_of(np.ascontiguousarray(y)).to(device)


def torch_of(y: Any) -> Any:
    """A torch tensor of a CuPy or NumPy result (DLPack, no copy; bfloat16 through its
    bits for NumPy)."""
    import torch

    if is_cupy(y):
        return torch.from_dlpack(y)
    if np.dtype(y.dtype).name == BF16:
        return torch.from_numpy(np.ascontiguousarray(y).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(y)
