"""CUTLASS 3 GEMM kernels for Hopper: configurations, sources, builds and launches.

- :mod:`.compat` — ``cutlass_cppgen`` under cuda-bindings 13, its side effects kept in
  pyc_lab's cache directory;
- :mod:`.gemm` — configurations, pruning and ranking, emitted sources, parallel nvcc
  builds, ctypes launches and CUDA-graph capture.
"""
