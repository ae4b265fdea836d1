"""CUTLASS 3 GEMM kernels for Hopper: configurations, sources, builds and launches.

One module per step:

- :mod:`.compat` — ``cutlass_cppgen`` under cuda-bindings 13, its side effects kept in
  pyc_lab's cache directory;
- :mod:`.config` — the configurations ``cutlass_cppgen`` offers, pruned and ranked for a
  problem; epilogues;
- :mod:`.emit` — a configuration's CUDA C++: the kernel plus the host wrapper from
  ``native/``;
- :mod:`.nvcc` — parallel ``nvcc`` builds into the hash-verified kernel cache;
- :mod:`.launch` — :class:`CutlassGemm`: a built kernel bound once and launched cheaply.

``from pyc_lab.kernels import cutlass`` gives all of their public names.
"""

from ..._lazy import lazy_face

_EXPORTS = {
    **dict.fromkeys(("ACTIVATIONS", "ALIGNMENTS", "DTYPES", "LAYOUTS", "Epilogue",
                     "GemmConfig", "check_dtype_layout", "configurations", "problem_issue",
                     "prune", "rank", "score"), "config"),
    "emit_source": "emit",
    **dict.fromkeys(("NVCC_FLAGS", "BuildResult", "build", "build_many", "cached",
                     "nvcc_path", "toolchain"), "nvcc"),
    "CutlassGemm": "launch",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, globals())
