"""GPU kernels and their autotuner (CUTLASS GEMM/conv, attention, tuning database).

Not built yet: this package is reserved for the autotuner issue. It is laid out now so
that the data flow runtime -> kernels -> compiler is fixed from the start.
"""
