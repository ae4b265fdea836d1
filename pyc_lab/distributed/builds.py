"""Candidate builds for a tuning sweep over Dask, apart from the measurements.

Before any GPU worker measures, every problem's CUTLASS candidates are worked out for
the GPU workers' compute capability and SM count (asked of one GPU worker), deduplicated
across problems (a kernel several problems want is one build), and submitted as build
tasks that hold no GPU: any worker with nvcc and nvidia-cutlass takes them, CPU-only
workers included. A build lands in that worker's kernel cache and comes back as its
files under their content-keyed cache key; each problem's measuring task receives the
builds of its candidates and stores those its machine lacks in its own cache, verified
by hash (:meth:`~pyc_lab.kernels.cache.KernelCache.put`), so its runner finds every
kernel built and builds none. A worker whose nvcc differs from the builder's computes
other cache keys and builds for itself: a kernel is never used across toolchains.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from ..kernels.tuning.many import GemmProblem
from ..kernels.tuning.options import GemmTuneOptions

__all__ = ["build_kernel", "device_facts", "install_builds", "submit_builds"]

log = logging.getLogger(__name__)


def device_facts() -> tuple[int, int]:
    """This worker's GPU: compute capability as an int (90) and SM count."""
    from ..kernels.tuning.keys import device_key

    _device, cc, sm_count = device_key()
    return cc, sm_count


def build_kernel(config: Any, dtype: str, layout: str, cc: int, epilogue: Any
                 ) -> dict[str, Any]:
    """Build one candidate on this worker (or take it from its cache): its cache key,
    status and files (``None`` for a failed build, with the message)."""
    from ..kernels.cache import KernelCache
    from ..kernels.cutlass.nvcc import build

    cache = KernelCache()
    res = build(config, dtype, layout, cc, cache, epilogue=epilogue)
    files = None
    if res.status in ("built", "cached") and res.key:
        entry = cache.get(res.key)
        if entry is not None:
            files = {name: entry.file(name).read_bytes()
                     for name in ("kernel.so", "kernel.cu")}
    return {"key": res.key, "status": res.status, "message": res.message, "files": files}


def install_builds(builds: Sequence[dict[str, Any]]) -> int:
    """Store shipped builds this worker's kernel cache lacks; how many were stored."""
    from ..kernels.cache import KernelCache

    cache = KernelCache()
    stored = 0
    for b in builds:
        if b.get("files") and b.get("key") and cache.get(b["key"]) is None:
            cache.put(b["key"], b["files"], meta={"shipped": True})
            stored += 1
    return stored


def submit_builds(client: Any, items: Sequence[GemmProblem], opts: GemmTuneOptions,
                  resources: dict[str, int] | None) -> tuple[list[list[Any]], int, int]:
    """Every problem's candidate builds as Dask futures (one future per distinct
    kernel, shared by the problems that want it); also how many were asked for and how
    many are distinct. No builds where the sweep builds no CUTLASS kernel."""
    from ..kernels.tuning.gemm_runner import candidates_for

    if not opts.cutlass:
        return [[] for _ in items], 0, 0
    cc, sm_count = client.submit(device_facts, resources=resources, pure=False).result()
    futures: dict[tuple, Any] = {}
    per_problem: list[list[Any]] = []
    requested = 0
    for p in items:
        popts = dataclasses.replace(opts, dtype=p.dtype, layout=p.layout, bias=p.bias,
                                    activation=p.activation)
        try:
            configs = candidates_for(p.m, p.n, p.k, popts, cc, sm_count)[0]
        except Exception as exc:  # no candidates: the problem's task says why
            log.info("autotune_many: no candidates for %s: %s", p.label, exc)
            per_problem.append([])
            continue
        epi = popts.epilogue
        mine = []
        for cfg in configs:
            requested += 1
            key = (cfg, p.dtype, p.layout, cc, epi)
            if key not in futures:
                futures[key] = client.submit(build_kernel, cfg, p.dtype, p.layout, cc, epi,
                                             pure=False)
            mine.append(futures[key])
        per_problem.append(mine)
    return per_problem, requested, len(futures)
