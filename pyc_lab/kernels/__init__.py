"""GPU kernels, the libraries beside them, and their tuning.

- :mod:`.matmul` — ``pyc_lab.matmul`` and ``pyc_lab.matmul_plan``: look up the fastest
  known kernel for the problem (a tuned CUTLASS kernel where it beat the library, else
  cuBLASLt or cuBLAS) and launch it, never building one; :func:`prepare` builds the tuned
  winners the kernel cache lacks. Beside it: :mod:`.matmul_route` (the never-slower
  rule), :mod:`.matmul_plan` (plans), :mod:`.matmul_launch` (launchers),
  :mod:`.matmul_inputs` (input checks), :mod:`.arrays` (NumPy/CuPy/torch, bfloat16);
- :mod:`.cublaslt` — cuBLASLt GEMMs with bias/relu/gelu epilogues (nvmath-python);
- :mod:`.cache` — the content-addressed, hash-verified on-disk cache of built kernels;
- :mod:`.cutlass` — CUTLASS 3 GEMMs for Hopper: configurations, emitted sources, nvcc
  builds, ctypes launches;
- :mod:`.tuning` — the tuning database, the GEMM runners (live and replayed) and
  ``autotune_gemm`` / ``replay_autotune`` on the shared tuning session.

The notebook-facing parts live outside the library: ``pyc_lab.widgets.AutotuneWidget``
and ``KernelComparison``, ``pyc-lab tune gemm`` and ``%pyc_tune``.
"""

from .._lazy import lazy_face

_EXPORTS = {
    "prepare": "matmul",
    "CacheEntry": "cache", "KernelCache": "cache", "KernelCacheWarning": "cache",
    "cache_key": "cache",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, globals())
