"""Graph breaks through onnxruntime: a node pyc_lab has no mapping for, run on its own.

:func:`ort_runner` wraps one ONNX node in a one-node model and an onnxruntime session
(CPU provider; one per input signature, made at first use; CuPy inputs go through the
host and come back as CuPy arrays); :func:`graph_break` makes it a handler the tracer
runs eagerly, with the reason ``explain()`` shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["graph_break", "onnxruntime_module", "ort_runner"]


def onnxruntime_module() -> Any | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime


def ort_runner(node: Any, opset: int, ir_version: int) -> Callable[..., Any]:
    """A function running one ONNX node through onnxruntime (a session per input
    signature, built on first use)."""
    from onnx import helper

    sessions: dict[tuple, Any] = {}
    names = [i for i in node.input if i]  # the inputs given (optional ones may be empty)

    def run(*arrays: Any) -> Any:
        host = [a.get() if hasattr(a, "get") and type(a).__module__.startswith("cupy")
                else np.asarray(a) for a in arrays]
        key = tuple((a.shape, a.dtype.str) for a in host)
        sess = sessions.get(key)
        if sess is None:
            ort = onnxruntime_module()
            inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                    a.shape)
                      for n, a in zip(names, host, strict=True)]
            outputs = [helper.make_empty_tensor_value_info(o)
                       for o in node.output if o]
            g = helper.make_graph([node], "break", inputs, outputs)
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
            m.ir_version = ir_version
            sess = ort.InferenceSession(m.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
            sessions[key] = sess
        feed = dict(zip(names, host, strict=True))
        outs = sess.run(None, feed)
        if arrays and type(arrays[0]).__module__.startswith("cupy"):
            import cupy

            outs = [cupy.asarray(o) for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    return run


def graph_break(fn: Callable[..., Any], op: str, node: str) -> Callable[..., Any]:
    from ..compiler.proxy import Traced

    reason = f"ONNX op {op} (node {node!r}) has no pyc_lab mapping: it runs in onnxruntime"

    def handler(args, attrs, op_, node_, opset):
        present = [a for a in args if a is not None]
        traced = next((a for a in present if isinstance(a, Traced)), None)
        if traced is not None:
            return traced.tracer.eager(fn, tuple(present), {}, reason)
        return fn(*present)

    return handler
