"""Batches on the GPU: per bucket, pinned staging buffers, device buffers and a CUDA graph.

The batcher pads every batch to one of a few bucket sizes, so the GPU sees a handful of
shapes. For each bucket a :class:`BucketExecutor` keeps

- page-locked host buffers for the inputs and outputs, taken from the belt's
  :class:`~pyc_lab.runtime.pinned.PinnedPool` (so copies run at pinned bandwidth and the
  host never allocates per batch);
- the device input buffers, filled by asynchronous copies on the executor's stream;
- the model compiled by ``pl.compile(..., backend="cupy", cuda_graph=True)``, which
  traces once per bucket shape and replays the bucket's launch list as CUDA graphs,
  bound to the bucket's device buffers and the weights
  (:meth:`~pyc_lab.compiler.api.CompiledFunction.bind`): the graphs read them in place
  and the outputs are copied to the pinned buffers straight from the graphs' own arrays.

Whether a GPU is used is the device gate's answer
(:func:`pyc_lab.hardware.device.cupy_status`); without one, the server runs the model's
own call on host arrays and says nothing, unless ``device="gpu"`` was asked for.
:func:`replica_executors` makes one executor per GPU asked for (each with its own pinned
pool on that GPU's NUMA node, stream, device buffers, weights and graphs), the replicas
one batcher feeds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..compiler.api import compile as pl_compile
from ..hardware.device import cupy_status, require_cupy
from .batcher import ServeOptions
from .model import CompiledModel

__all__ = ["BucketExecutor", "bucket_executor", "replica_executors"]

log = logging.getLogger(__name__)


def bucket_executor(model: CompiledModel, options: ServeOptions,
                    device: str = "auto") -> Callable[[list[np.ndarray]], list[Any]] | None:
    """A GPU executor for ``model``'s batches, or ``None`` to run on the host.

    Parameters
    ----------
    model
        The model.
    options
        The server's settings (the buckets).
    device
        ``"auto"``: the GPU when the device gate says one is usable and the model is not
        pinned to the numpy backend; ``"gpu"``: the GPU or
        :class:`~pyc_lab.errors.DeviceUnavailableError`; ``"cpu"``: never.
    """
    if device == "cpu" or model.compiled.backend == "numpy":
        if device == "gpu":
            from .errors import InferenceError

            raise InferenceError(f"model {model.name!r} was compiled for the numpy backend; "
                                 "load it with backend='auto' or 'cupy' to serve it on a GPU")
        return None
    if device == "gpu":
        require_cupy(f"serving {model.name!r} on the GPU")
    else:
        cp, reason = cupy_status()
        if cp is None:
            log.debug("serving %r on the CPU: %s", model.name, reason)
            return None
    return BucketExecutor(model, options)  # pragma: no cover - needs a GPU


def replica_executors(model: CompiledModel, options: ServeOptions, devices: Sequence[int],
                      replicas: int = 1) -> list[Any]:
    """``replicas`` executors on each GPU of ``devices``, for one batcher to feed.

    Raises
    ------
    InferenceError
        A model compiled for the numpy backend, or a device index that is not a GPU
        here (the message says how many there are).
    DeviceUnavailableError
        No usable GPU.
    """
    if model.compiled.backend == "numpy":
        from .errors import InferenceError

        raise InferenceError(f"model {model.name!r} was compiled for the numpy backend; load "
                             "it with backend='auto' or 'cupy' to serve it on GPUs")
    cp = require_cupy(f"serving {model.name!r} on GPUs {list(devices)}")
    count = cp.cuda.runtime.getDeviceCount()  # pragma: no cover - needs a GPU
    bad = [d for d in devices if not 0 <= int(d) < count]  # pragma: no cover
    if bad:  # pragma: no cover - needs a GPU
        from .errors import InferenceError

        raise InferenceError(f"devices {bad} are not GPUs here: this machine has {count} "
                             f"(0..{count - 1})")
    return [BucketExecutor(model, options, device=int(d))  # pragma: no cover - needs a GPU
            for d in devices for _ in range(replicas)]


class BucketExecutor:  # pragma: no cover - needs a GPU (tests/inference/test_gpu.py)
    """Run padded batches on the GPU through per-bucket staging buffers and CUDA graphs.

    Parameters
    ----------
    model
        The model; its function is recompiled for the cupy backend with CUDA graphs.
    options
        The server's settings (the buckets to prepare).
    pool
        The pinned pool to stage from (default: a new one for ``device``, on its NUMA
        node).
    device
        The GPU it runs on: its buffers, weights, stream and graphs are made there and
        every call runs under it.

    Notes
    -----
    One executor serves one worker thread of a batcher, so a bucket's buffers are never
    in use twice at once; the outputs it returns are views of its pinned output buffers,
    valid until the next call (the batcher copies each request's rows out at once).
    """

    def __init__(self, model: CompiledModel, options: ServeOptions, pool: Any = None,
                 device: int = 0) -> None:
        import cupy as cp

        from ..runtime.pinned import PinnedPool

        self.cp = cp
        self.model = model
        self.options = options
        self.device = int(device)
        self._own_pool = pool is None
        with cp.cuda.Device(self.device):
            self.pool = pool or PinnedPool(device=self.device, mode="gpu")
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.fn = pl_compile(model.compiled.fn, backend="cupy",
                                 mode=model.compiled.mode, cuda_graph=True)
            self.weights = [cp.asarray(w) for w in model.weights]
        self._buckets: dict[tuple, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def _bucket(self, arrays: list[np.ndarray]) -> dict[str, Any]:
        key = tuple((a.shape, a.dtype.str) for a in arrays)
        b = self._buckets.get(key)
        if b is not None:
            return b
        cp = self.cp
        ins_host, ins_dev, bufs = [], [], []
        for a in arrays:
            buf = self.pool.acquire(a.nbytes)
            bufs.append(buf)
            ins_host.append(buf.array(a.dtype, a.shape))
            ins_dev.append(cp.empty(a.shape, dtype=a.dtype))
        b = {"in_host": ins_host, "in_dev": ins_dev, "bufs": bufs, "out_host": None}
        self._buckets[key] = b
        return b

    def __call__(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        with self._lock, self.cp.cuda.Device(self.device):
            b = self._bucket(arrays)
            with self.stream:
                for src, host, dev in zip(arrays, b["in_host"], b["in_dev"], strict=True):
                    np.copyto(host, src)
                    dev.set(host, stream=self.stream)
                call = b.get("call")
                if call is None:  # compiled, warmed and captured on this batch's data
                    call = b["call"] = self.fn.bind(*b["in_dev"], *self.weights)
                outs = call()
                outs = list(outs) if isinstance(outs, tuple) else [outs]
                if b["out_host"] is None:
                    b["out_host"] = []
                    for o in outs:
                        buf = self.pool.acquire(o.nbytes)
                        b["bufs"].append(buf)
                        b["out_host"].append(buf.array(o.dtype, o.shape))
                for o, host in zip(outs, b["out_host"], strict=True):
                    o.get(stream=self.stream, out=host, blocking=False)
            self.stream.synchronize()
            return list(b["out_host"])

    def close(self) -> None:
        """Give the pinned buffers back to the pool (and close a pool made here)."""
        with self._lock:
            for b in self._buckets.values():
                for buf in b["bufs"]:
                    buf.release()
            self._buckets.clear()
            if self._own_pool:
                self.pool.close()
