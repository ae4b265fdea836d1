"""The compiler: trace NumPy-style functions into an IR, optimise it, lower it to kernels.

Pipeline: :mod:`.tracer` (proxies record the function) -> :mod:`.ir` (typed graph, op
registry in :mod:`.ops`) -> :mod:`.passes` (canonicalize, fold, CSE, DCE, simplify,
fusion, memory planning) -> :mod:`.policy` (an implementation per node, with a reason)
-> execution by :func:`.ops.run_graph` (NumPy) or the CuPy backend (generated CUDA kernels,
cuBLAS, optional CUDA-graph replay).
"""

from . import conv_op  # noqa: F401  (registers the conv op and pl.conv's tracing)
from .errors import (
    CastingError,
    DynamicShapeError,
    ReadOnlyError,
    ScalarOverflowError,
    TraceError,
    UnsupportedOperationError,
)
from .functions import erf, gelu, layer_norm, relu, sigmoid, silu, softmax
from .ir import Graph, IRError, Node
from .ops import REGISTRY, ShapeError
from .tracer import trace

__all__ = ["REGISTRY", "CastingError", "DynamicShapeError", "Graph", "IRError", "Node",
           "ReadOnlyError", "ScalarOverflowError", "ShapeError", "TraceError",
           "UnsupportedOperationError", "erf", "gelu", "layer_norm", "relu", "sigmoid",
           "silu", "softmax", "trace"]
