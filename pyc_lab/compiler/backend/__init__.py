"""The CuPy backend: a planned graph lowered to launch steps and run on the GPU.

- :mod:`.executable` — :class:`~.executable.CupyExecutable`: lowering to steps, alias
  analysis, execution and CUDA-graph replay.
"""
