"""Scale-out on Dask: clusters that fit the machine, and tuning sweeps spread over GPUs."""

from .cluster import cluster, gpu_count
from .tuning import autotune_many

__all__ = ["autotune_many", "cluster", "gpu_count"]
