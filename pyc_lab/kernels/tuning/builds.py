"""Builds shared by several tunings: one nvcc pool, each distinct kernel built once.

:func:`~pyc_lab.kernels.tuning.many.autotune_many` tunes many problems whose candidate
lists overlap (the same tile and schedule suits many shapes). A :class:`SharedBuilds`
gives every problem's runner the same future for the same kernel — keyed by
configuration, dtype, layout, compute capability and epilogue, which is what the
emitted source (and so the kernel-cache key) depends on — and runs all builds on one
pool of ``workers`` nvcc processes, so that they proceed in parallel while the first
problems are measured.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..cutlass.config import Epilogue, GemmConfig
from ..cutlass.nvcc import BuildResult, build

__all__ = ["SharedBuilds", "wait_for_build"]

log = logging.getLogger(__name__)


class SharedBuilds:
    """A pool of nvcc builds, deduplicated across the problems that submit to it.

    Parameters
    ----------
    workers
        Parallel nvcc processes (the CPU count by default).
    cache
        The kernel cache builds go to (the user's by default).
    """

    def __init__(self, workers: int | None = None, cache: Any = None) -> None:
        self.workers = workers or max(1, os.cpu_count() or 1)
        self.cache = cache
        self._pool = cf.ThreadPoolExecutor(max_workers=self.workers,
                                           thread_name_prefix="pyc-nvcc")
        self._futures: dict[tuple, cf.Future] = {}
        self._lock = threading.Lock()
        self.requested = 0

    def _job(self, cfg: GemmConfig, dtype: str, layout: str, cc: int,
             epilogue: Epilogue) -> BuildResult:
        try:
            return build(cfg, dtype, layout, cc, self.cache, epilogue=epilogue)
        except Exception as exc:
            return BuildResult(cfg, "", None, "compile_error", 0.0,
                               f"{type(exc).__name__}: {exc}")

    def submit(self, configs: Sequence[GemmConfig], dtype: str, layout: str, cc: int,
               epilogue: Epilogue | None = None) -> dict[GemmConfig, cf.Future]:
        """A future per configuration (in the order given); a kernel another problem
        already asked for gets that problem's future instead of a second build."""
        epi = epilogue or Epilogue()
        out: dict[GemmConfig, cf.Future] = {}
        with self._lock:
            for cfg in configs:
                self.requested += 1
                key = (cfg, dtype, layout, cc, epi)
                fut = self._futures.get(key)
                if fut is None:
                    fut = self._pool.submit(self._job, cfg, dtype, layout, cc, epi)
                    self._futures[key] = fut
                out[cfg] = fut
        return out

    @property
    def distinct(self) -> int:
        """Kernels submitted once each (after deduplication)."""
        return len(self._futures)

    def shutdown(self, wait: bool = False) -> None:
        """Stop taking builds; ``wait`` for the running ones (queued ones are cancelled)."""
        self._pool.shutdown(wait=wait, cancel_futures=True)


def wait_for_build(future: cf.Future, deadline: float | None) -> BuildResult | None:
    """A build's result, waiting no later than ``deadline`` (a ``time.perf_counter()``).

    A tuning budget bounds the wait for builds as well as the candidates started: a
    build still queued or compiling at the deadline (or cancelled) gives ``None``, and
    the candidate is recorded as skipped instead of holding the tuning past its budget.
    ``deadline=None`` waits as long as the build takes.
    """
    try:
        if deadline is None:
            return future.result()
        return future.result(timeout=max(0.0, deadline - time.perf_counter()))
    except (cf.TimeoutError, cf.CancelledError):
        return None
