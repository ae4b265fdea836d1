"""The CuPy backend: a planned graph lowered to launch steps and run on the GPU.

- :mod:`.steps` — the launch steps (generated kernels, cuBLAS + epilogue, cuBLASLt,
  tuned CUTLASS, CuPy calls) and how generated kernels are launched;
- :mod:`.lowering` — the graph and an implementation per node as a launch list: the
  fallbacks when an implementation cannot serve a node, the storage and in-place
  analysis against the memory plan (no device);
- :mod:`.executable` — :class:`~.executable.CupyExecutable`: device buffers and
  constants, running the launch list call after call;
- :mod:`.graphs` — CUDA-graph capture and replay, the launch list split into graph
  segments around the library calls.
"""
