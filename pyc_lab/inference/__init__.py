"""Inference: models served inside the notebook's kernel, batched, measured, reachable.

- :mod:`.onnx_import` — an ONNX model as a NumPy-style function that ``pl.compile``
  traces (batch norms folded, weights bound; :mod:`.onnx_ops` holds the op functions);
- :mod:`.model` — :func:`load`: a :class:`CompiledModel` (compiled, typed, explained);
- :mod:`.zoo` — five scientific models built as ONNX in code;
- :mod:`.batcher` and :mod:`.server` — :func:`serve`: a dynamic batcher with Triton's
  semantics, futures, asyncio, bounded queue, timeouts, several models;
- :mod:`.stats` — what a server measured, in fixed-size structures;
- :mod:`.protocol` and :mod:`.http` — the KServe v2 / Open Inference Protocol over HTTP;
- :mod:`.load_testing` — :func:`load_test`: perf_analyzer's report as a DataFrame;
- :mod:`.gpu` — batch buckets on the GPU: pinned staging, CUDA graphs.

Importing this package loads none of them; nothing prints.
"""

from .._lazy import lazy_face

_EXPORTS = {
    "CompiledModel": "model", "load": "model",
    "TensorSpec": "onnx_import", "import_onnx": "onnx_import", "SUPPORTED_OPS": "onnx_import",
    "Server": "server", "serve": "server", "running_servers": "server",
    "load_test": "load_testing", "sweep": "load_testing",
    "InferenceError": "errors", "BadRequestError": "errors", "QueueFullError": "errors",
    "RequestTimeoutError": "errors", "ServerClosedError": "errors",
    "UnsupportedOpError": "errors", "ModelImportError": "errors",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, globals())
