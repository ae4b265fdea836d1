"""``pl.cluster()``: a Dask cluster that fits this machine, or the user's own.

Work meant for a GPU is submitted with ``resources={"GPU": 1}``, so Dask's scheduler
runs at most one such task per GPU at a time; workers declare how many GPUs they hold.
What starts here, in order of preference:

- with GPUs and dask-cuda installed, a ``dask_cuda.LocalCUDACluster``: one worker per
  GPU, each pinned to its GPU with ``CUDA_VISIBLE_DEVICES`` (and its CPU affinity);
- with GPUs and no dask-cuda, the same shape built from ``distributed`` alone: one
  worker process per GPU (a ``SpecCluster`` of nannies), each with
  ``CUDA_VISIBLE_DEVICES`` set to its GPU and one ``GPU`` resource;
- without GPUs, a ``distributed.LocalCluster`` of CPU workers, declaring
  ``gpus_per_worker`` GPU resources when asked (what the recorded tunings need to run
  the GPU half of a sweep on a machine without one, as CI does).

Any ``distributed.Client`` the user already holds (connected to a multi-node cluster by
their scheduler, say) is accepted as it is. The dashboard link is
``client.dashboard_link``; the JupyterLab Dask extension finds the cluster through it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any

from ..checks import check_whole
from ..errors import PycLabError

__all__ = ["cluster", "gpu_count"]

log = logging.getLogger(__name__)

_INSTALL = "install it with pip install 'pyc-lab[cluster]' (dask[distributed])"


def _distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise PycLabError(f"pl.cluster needs Dask's distributed package; {_INSTALL}") \
            from None
    return distributed


@functools.cache
def _owning_class(dist: Any) -> type:
    class OwningClient(dist.Client):  # type: ignore[misc, name-defined]
        """A ``distributed.Client`` that also closes the cluster pl.cluster started."""

        def close(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().close(*args, **kwargs)
            finally:
                with contextlib.suppress(Exception):  # closed already, or going
                    self.cluster.close()

    return OwningClient


def _owning_client(dist: Any, cluster: Any) -> Any:
    """A client of ``cluster`` that closes it when the client closes (a plain
    ``Client(cluster)`` leaves a cluster it was handed running)."""
    try:
        return _owning_class(dist)(cluster)
    except BaseException:
        cluster.close()
        raise


def _local_gpus() -> int:
    from ..hardware import detect_hardware

    try:
        return len(detect_hardware().gpus)
    except Exception as exc:  # detection must not stop a CPU cluster
        log.debug("no GPUs counted: %s", exc)
        return 0


def gpu_count(client: Any) -> int:
    """The GPU resources the workers of ``client`` declare, in total."""
    try:  # newer distributed lists only a few workers unless asked for all
        info = client.scheduler_info(n_workers=-1)
    except TypeError:
        info = client.scheduler_info()
    workers = info.get("workers", {})
    return int(sum(w.get("resources", {}).get("GPU", 0) for w in workers.values()))


def cluster(n_workers: int | None = None, *, client: Any = None,
            gpus_per_worker: int | None = None, processes: bool = True,
            threads_per_worker: int = 1, **cluster_kwargs: Any) -> Any:
    """A Dask client on a cluster that fits this machine (see the module docstring).

    Parameters
    ----------
    n_workers
        Workers to start (default: one per GPU; one without GPUs).
    client
        A ``distributed.Client`` already connected: returned as it is.
    gpus_per_worker
        GPU resources each worker declares. Default: 1 where there are GPUs (one worker
        per GPU), none without. Give it on a machine without GPUs to run recorded
        tunings as if the workers had one.
    processes
        Worker processes (the default; a tuning that hangs or crashes a worker then
        loses only its task) or threads of this process (quick to start; tests).
    threads_per_worker
        Threads per worker (default 1: one task at a time).
    **cluster_kwargs
        Passed on to the cluster class (``dashboard_address``, ``memory_limit``, ...).

    Returns
    -------
    distributed.Client
        Close it (or use it as a context manager): a cluster started here stops with it.

    Raises
    ------
    PycLabError
        Without Dask's distributed package, for a ``client`` that is not a
        ``distributed.Client``, or for a worker count below 1.
    """
    dist = _distributed()
    if client is not None:
        if not isinstance(client, dist.Client):
            raise PycLabError(f"pl.cluster(client=...) takes a distributed.Client, got "
                              f"{type(client).__name__}")
        return client
    if n_workers is not None:
        check_whole("pl.cluster", "n_workers", n_workers, minimum=1)
    if gpus_per_worker is not None:
        check_whole("pl.cluster", "gpus_per_worker", gpus_per_worker, minimum=0)
    cluster_kwargs.setdefault("dashboard_address", ":0")  # a free port, never a clash
    gpus = _local_gpus()
    if gpus:
        return _gpu_cluster(dist, gpus, n_workers, threads_per_worker, processes,
                            gpus_per_worker, cluster_kwargs)
    resources = {"GPU": int(gpus_per_worker)} if gpus_per_worker else None
    local = dist.LocalCluster(n_workers=int(n_workers or 1),
                              threads_per_worker=threads_per_worker, processes=processes,
                              resources=resources, **cluster_kwargs)
    log.info("pl.cluster: %d CPU worker(s), GPU resources %s", len(local.workers),
             resources)
    return _owning_client(dist, local)


def _gpu_cluster(dist: Any, gpus: int, n_workers: int | None, threads: int,
                 processes: bool, gpus_per_worker: int | None,
                 kwargs: dict[str, Any]) -> Any:
    """One worker per GPU, pinned (dask-cuda when installed, else nannies with
    ``CUDA_VISIBLE_DEVICES`` of their own)."""
    count = min(int(n_workers or gpus), gpus)
    per = 1 if gpus_per_worker is None else int(gpus_per_worker)
    resources = {"GPU": per} if per else None
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        LocalCUDACluster = None
    if LocalCUDACluster is not None and processes:
        local = LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(range(count)),
                                 threads_per_worker=threads, resources=resources, **kwargs)
        log.info("pl.cluster: dask-cuda, %d GPU worker(s)", count)
        return _owning_client(dist, local)
    if not processes:  # threads share one process, so one device: one worker
        local = dist.LocalCluster(n_workers=1, threads_per_worker=threads, processes=False,
                                  resources=resources, **kwargs)
        return _owning_client(dist, local)
    from distributed import Nanny, Scheduler, SpecCluster

    workers = {f"gpu-{i}": {"cls": Nanny, "options": {
        "nthreads": threads, "resources": resources or {},
        "env": {"CUDA_VISIBLE_DEVICES": str(i)}}} for i in range(count)}
    scheduler = {"cls": Scheduler, "options": {
        "dashboard_address": kwargs.pop("dashboard_address", ":0")}}
    local = SpecCluster(workers=workers, scheduler=scheduler, **kwargs)
    log.info("pl.cluster: %d GPU worker process(es), one GPU each", count)
    return _owning_client(dist, local)
