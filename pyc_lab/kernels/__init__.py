"""GPU kernels and their autotuner.

- :mod:`.cache` — a content-addressed on-disk cache of built kernels, verified by SHA-256
  before use, exportable to one file;
- :mod:`.strategies` — search strategies (exhaustive, random, successive halving,
  evolutionary) with budgets, restrictions, observers and failure isolation;
- :mod:`.tuning_db` — the SQLite (WAL) tuning database: every measured candidate, the
  baselines of the same run and the winner per device and problem, exact and
  nearest-bucket lookup, JSON/CSV export;
- :mod:`.cutlass_compat` — ``cutlass_cppgen`` under cuda-bindings 13, with its cache,
  temporary and error files kept in pyc_lab's cache directory;
- :mod:`.cublaslt` — cuBLASLt GEMMs with bias/relu/gelu epilogues through nvmath-python
  (the compiler's ``cublaslt`` implementation);
- :mod:`.cutlass_gemm` — CUTLASS GEMMs for Hopper (f16, bf16, tf32 and SIMT f32; fused
  bias/relu/gelu/silu epilogues): configurations from ``cutlass_cppgen``, pruning and
  ranking, emitted sources, parallel nvcc builds, ctypes launches and CUDA-graph capture;
- :mod:`.autotune` — ``autotune_gemm``: build, check against cuBLAS, time, record;
- :mod:`.matmul` — ``pyc_lab.matmul``: the tuned kernel (also what the compiler's policy
  asks for), else cuBLASLt/cuBLAS;
- :mod:`.replay` — ``replay_autotune``: the same search strategies run against a tuning
  recorded on a GPU (the shipped H200 recording), for machines without one.

The notebook-facing parts live outside the library: ``pyc_lab.widgets.AutotuneWidget``
and ``KernelComparison``, ``pyc-lab tune gemm`` and ``%pyc_tune``.
"""

from .cache import CacheEntry, KernelCache, KernelCacheWarning, cache_key
from .strategies import STRATEGIES, Budget, Outcome, SearchSpace, get_strategy
from .tuning_db import (
    DeviceKey,
    LookupResult,
    Measurement,
    ProblemKey,
    TuningDB,
    TuningDBError,
    TuningDBWarning,
)

__all__ = [
    "STRATEGIES",
    "Budget",
    "CacheEntry",
    "DeviceKey",
    "KernelCache",
    "KernelCacheWarning",
    "LookupResult",
    "Measurement",
    "Outcome",
    "ProblemKey",
    "SearchSpace",
    "TuningDB",
    "TuningDBError",
    "TuningDBWarning",
    "cache_key",
    "get_strategy",
]
