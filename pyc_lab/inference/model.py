"""``pl.inference.load``: a model ready to serve — imported, compiled, described.

A :class:`CompiledModel` wraps a function compiled by ``pl.compile`` (an imported ONNX
graph with its weights bound, or a function the user compiled) with what a server needs:
named inputs and outputs with dtypes and shapes (axis 0 is the batch), a call taking
arrays or a dict, and ``explain()`` — the import's decisions above the compiler's own
explanation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..compiler.api import CompiledFunction
from ..compiler.api import compile as pl_compile
from .errors import BadRequestError, InferenceError, ModelImportError
from .onnx_import import ImportedGraph, TensorSpec, import_onnx
from .onnx_layout import LAYOUTS

__all__ = ["CompiledModel", "ModelExplanation", "load"]

log = logging.getLogger(__name__)


@dataclass
class ModelExplanation:
    """What ``CompiledModel.explain()`` returns: the import's and the compiler's story.

    Attributes
    ----------
    model
        The model's name.
    source
        ``"onnx"`` or ``"function"``.
    inputs, outputs
        The model's tensors.
    op_counts
        ONNX op -> nodes in the imported program (empty for a function).
    notes
        Import decisions: folded batch norms, constants, graph breaks.
    graph_breaks
        ``(op, node)`` that run through onnxruntime.
    compiled
        The compiler's :class:`~pyc_lab.compiler.explain.Explanation` for a batch of the
        explained size.
    """

    model: str
    source: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    op_counts: dict[str, int]
    notes: list[str]
    graph_breaks: list[tuple[str, str]]
    compiled: Any = None
    batch: int = 1

    def to_text(self) -> str:
        """Plain text: tensors, ops, notes, then the compiler's explanation."""
        lines = [f"model {self.model!r} ({self.source}), explained at batch {self.batch}"]
        lines += [f"  input  {s.describe()}" for s in self.inputs]
        lines += [f"  output {s.describe()}" for s in self.outputs]
        if self.op_counts:
            lines.append("ONNX ops: " + ", ".join(f"{k} x{v}" for k, v in
                                                  self.op_counts.items()))
        lines += [f"import: {n}" for n in self.notes]
        lines.append(f"graph breaks through onnxruntime: {len(self.graph_breaks)}")
        lines += [f"  {op} (node {node!r})" for op, node in self.graph_breaks]
        if self.compiled is not None:
            lines.append(str(self.compiled))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(self.to_text())}</pre>"


class CompiledModel:
    """A model compiled by ``pl.compile``, with named, typed inputs and outputs.

    Axis 0 of every input and output is the batch: rows are independent, which is what
    lets a server stack requests and pad them. Build one with :func:`load`.

    Attributes
    ----------
    name
        The model's name (what the HTTP endpoint serves it as).
    inputs, outputs
        :class:`~pyc_lab.inference.onnx_import.TensorSpec` of each tensor.
    compiled
        The :class:`~pyc_lab.compiler.api.CompiledFunction` that runs it.
    """

    def __init__(self, name: str, compiled: CompiledFunction, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], weights: Sequence[Any] = (), *,
                 source: str = "function", imported: ImportedGraph | None = None) -> None:
        self.name = name
        self.compiled = compiled
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.weights = list(weights)
        self.source = source
        self.imported = imported
        self._device_weights: dict[type, list[Any]] = {}
        # one run at a time: a model served under two names (two batcher threads) or
        # called from the notebook while served shares one compiled function's caches
        self._run_lock = threading.Lock()

    # -- calling ----------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        """The inputs' names, in order."""
        return [s.name for s in self.inputs]

    @property
    def output_names(self) -> list[str]:
        """The outputs' names, in order."""
        return [s.name for s in self.outputs]

    def _weights_for(self, arrays: Sequence[Any]) -> list[Any]:
        """The weights as the inputs' kind of array (CuPy copies made once per kind)."""
        if not self.weights or not arrays:
            return self.weights
        kind = type(arrays[0])
        weights = self._device_weights.get(kind)
        if weights is None:
            weights = self.weights
            if kind.__module__.startswith("cupy"):  # pragma: no cover - needs a GPU
                import cupy

                weights = [cupy.asarray(w) for w in self.weights]
            self._device_weights[kind] = weights
        return weights

    def _sequence(self, arrays: Any, what: str) -> Sequence[Any]:
        """``arrays`` when it is a sequence of arrays; a clear error for one bare array."""
        if hasattr(arrays, "shape") or not isinstance(arrays, Sequence):
            raise BadRequestError(
                f"{self.name}.{what} takes a list of arrays, one per input in the order "
                f"{self.input_names}, got a {type(arrays).__name__}: pass [x] (or call the "
                f"model, {self.name}(x))")
        return arrays

    def run(self, arrays: Sequence[Any]) -> list[Any]:
        """Run on positional arrays (the inputs' order); every output, as a list.

        Raises
        ------
        BadRequestError
            ``arrays`` is one array rather than a list of them.
        """
        arrays = self._sequence(arrays, "run")
        with self._run_lock:
            out = self.compiled(*arrays, *self._weights_for(arrays))
        return _as_list(out)

    def io_binding(self, arrays: Sequence[Any]) -> Callable[[], list[Any]]:
        """Bind input arrays for repeated runs without copies: ``run = model.io_binding(
        inputs)``, then write new values into ``inputs`` and call ``run()`` for every
        output, as a list.

        onnxruntime's IOBinding for pyc_lab: on the CuPy backend with CUDA graphs the
        captured graphs read the bound arrays (and the weights) in place and ``run()``
        returns the program's own output arrays — valid until its next run — so a call
        is one launch per graph; elsewhere ``run()`` is :meth:`run` on the arrays.
        ``run.bound`` is the :class:`~pyc_lab.compiler.bound.BoundCall` underneath
        (``.zero_copy``, ``.why``).
        """
        arrays = list(self._sequence(arrays, "io_binding"))
        bound = self.compiled.bind(*arrays, *self._weights_for(arrays))
        lock = self._run_lock

        def run() -> list[Any]:
            with lock:
                out = bound()
            return _as_list(out)

        run.bound = bound  # type: ignore[attr-defined]
        return run

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``model(x)``, ``model(x1, x2)``, ``model(name=x)`` or ``model({name: x})``.

        Returns the output array, a tuple of them when the model has several, or a dict
        when called with a dict.
        """
        as_dict = len(args) == 1 and isinstance(args[0], Mapping)
        arrays = self.bind(args[0] if as_dict else None, args if not as_dict else (), kwargs)
        outs = self.run(arrays)
        if as_dict:
            return dict(zip(self.output_names, outs, strict=True))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def bind(self, mapping: Mapping[str, Any] | None = None, args: Sequence[Any] = (),
             kwargs: Mapping[str, Any] | None = None) -> list[Any]:
        """The inputs as a positional list, from a dict, positional arrays or keywords.

        Raises
        ------
        BadRequestError
            If an input is missing or unknown.
        """
        if args:
            if mapping or kwargs:
                raise BadRequestError("pass the inputs positionally or by name, not both")
            if len(args) != len(self.inputs):
                raise BadRequestError(f"model {self.name!r} takes {len(self.inputs)} input(s) "
                                      f"({', '.join(self.input_names)}), got {len(args)}")
            return list(args)
        named = dict(mapping or {})
        named.update(kwargs or {})
        unknown = sorted(set(named) - set(self.input_names))
        missing = [n for n in self.input_names if n not in named]
        if unknown or missing:
            raise BadRequestError(
                f"model {self.name!r} takes inputs {', '.join(self.input_names)}"
                + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                + (f"; missing: {', '.join(missing)}" if missing else ""))
        return [named[n] for n in self.input_names]

    def example(self, batch: int = 1, seed: int = 0) -> list[np.ndarray]:
        """Random inputs of ``batch`` rows (free dimensions other than the batch: 1)."""
        rng = np.random.default_rng(seed)
        out = []
        for s in self.inputs:
            shape = tuple(batch if i == 0 else (1 if d is None else d)
                          for i, d in enumerate(s.shape))
            if np.dtype(s.dtype).kind == "f":
                out.append(rng.standard_normal(shape).astype(s.dtype))
            else:
                out.append(rng.integers(0, 2, shape).astype(s.dtype))
        return out

    def explain(self, batch: int = 1) -> ModelExplanation:
        """What the import did and how the compiler compiled a batch of ``batch`` rows."""
        arrays = self.example(batch)
        compiled = self.compiled.explain(*arrays, *self.weights)
        imp = self.imported
        return ModelExplanation(
            model=self.name, source=self.source, inputs=self.inputs, outputs=self.outputs,
            op_counts=dict(imp.op_counts) if imp else {}, notes=list(imp.notes) if imp else [],
            graph_breaks=list(imp.breaks) if imp else [], compiled=compiled, batch=batch)

    def describe(self) -> str:
        """One line: ``name: inputs -> outputs``."""
        ins = ", ".join(s.describe() for s in self.inputs)
        outs = ", ".join(s.describe() for s in self.outputs)
        return f"{self.name}: {ins} -> {outs}"

    def __repr__(self) -> str:
        return f"CompiledModel({self.describe()}, source={self.source})"


def _specs(spec: Mapping[str, Any] | Sequence[TensorSpec], what: str) -> list[TensorSpec]:
    if isinstance(spec, Mapping):
        out = []
        for name, value in spec.items():
            if isinstance(value, TensorSpec):
                out.append(value)
                continue
            try:
                dtype, shape = value
                out.append(TensorSpec(name, np.dtype(dtype),
                                      tuple(None if d is None or d == -1 else int(d)
                                            for d in shape)))
            except (TypeError, ValueError):
                raise InferenceError(f"{what} {name!r}: give (dtype, shape), e.g. "
                                     "('float32', (None, 18)) with None for the batch axis"
                                     ) from None
        return out
    return list(spec)


def _layout(layout: str, backend: str, conv: str = "auto") -> str:
    """``load``'s ``layout`` with ``"auto"`` resolved for ``backend`` (and ``conv``:
    ``"im2col"`` asks for the convolutions inside the program, as the graph has them)."""
    if layout not in ("auto", *LAYOUTS):
        raise ModelImportError(f"layout must be one of {('auto', *LAYOUTS)}, got {layout!r}")
    if layout != "auto":
        return layout
    if backend == "numpy" or conv == "im2col":
        return "channels_first"
    if backend == "cupy":
        return "channels_last"
    from ..hardware.device import no_gpu_reason

    return "channels_last" if no_gpu_reason() is None else "channels_first"


def load(model: Any, *, name: str | None = None, inputs: Mapping[str, Any] | None = None,
         outputs: Sequence[str] | None = None, backend: str = "auto",
         mode: str = "balanced", cuda_graph: bool = False,
         onnxruntime_fallback: bool = True, conv: str = "auto",
         layout: str = "auto") -> CompiledModel:
    """Import and compile a model for serving.

    Parameters
    ----------
    model
        An ONNX model (a path, its bytes, or an ``onnx.ModelProto``), a
        ``pl.compile``d function, or a plain Python function of NumPy arrays (compiled
        here). A function's weights are bound by the function itself (a closure or
        ``functools.partial``): its parameters are the model's inputs.
    name
        The served name (default: the graph's or the function's name).
    inputs
        For a function: ``{name: (dtype, shape)}`` with ``None`` for the batch axis, e.g.
        ``{"x": ("float32", (None, 18))}``; the function's parameters in order.
    outputs
        For a function: the outputs' names (default ``output0, output1, ...``).
    backend, mode, cuda_graph
        Passed to ``pl.compile`` (see :func:`pyc_lab.compile`).
    onnxruntime_fallback
        Run ONNX ops the importer does not map through onnxruntime (graph breaks).
    conv
        How an ONNX model's convolutions run: ``"auto"`` (``pl.conv`` for large ones
        and for small ones pyc_lab's direct kernel takes, im2col inside the program for
        the rest), ``"library"`` or ``"im2col"`` (see
        :func:`~pyc_lab.inference.onnx_import.import_onnx`).
    layout
        ``"channels_last"``: an ONNX model's 2-D convolutions run on channels-last
        activations (what pyc_lab's tuned CUTLASS kernels and cuDNN's tensor-core
        kernels read; transposed where the graph needs its own layout),
        ``"channels_first"`` as the graph has them. ``"auto"`` (default):
        ``"channels_last"`` where the model will run on a GPU (``backend="cupy"``, or
        ``"auto"`` with a usable GPU and CuPy) through ``pl.conv`` (``conv`` not
        ``"im2col"``), ``"channels_first"`` otherwise (NumPy's im2col gains nothing from
        it). ``imported.layout`` holds the choice; ``explain()``'s import notes say when
        ``"auto"`` chose channels last.

    Returns
    -------
    CompiledModel

    Raises
    ------
    ModelImportError, UnsupportedOpError
        If the ONNX model cannot be imported.
    InferenceError
        If a function comes without ``inputs``.
    """
    if isinstance(model, (str, Path, bytes, bytearray)) or type(model).__name__ == "ModelProto":
        chosen = _layout(layout, backend, conv)
        imported = import_onnx(model, onnxruntime_fallback=onnxruntime_fallback, conv=conv,
                               layout=chosen)
        if layout == "auto" and chosen == "channels_last" and imported.op_counts.get("Conv"):
            imported.notes.append("layout auto: channels_last (the model runs on a GPU)")
        compiled = pl_compile(imported.function, backend=backend, mode=mode,
                              cuda_graph=cuda_graph)
        log.debug("loaded ONNX model %r", imported.name)
        return CompiledModel(name or imported.name, compiled, imported.inputs, imported.outputs,
                             imported.weights, source="onnx", imported=imported)
    if not callable(model):
        raise ModelImportError(f"pl.inference.load takes an ONNX model or a function, not "
                               f"{type(model).__name__}")
    if inputs is None:
        raise InferenceError("loading a function needs inputs={name: (dtype, shape)} with "
                             "None for the batch axis, e.g. {'x': ('float32', (None, 18))}")
    specs = _specs(inputs, "input")
    compiled = model if isinstance(model, CompiledFunction) else pl_compile(
        model, backend=backend, mode=mode, cuda_graph=cuda_graph)
    fname = getattr(getattr(compiled, "fn", None), "__name__", None) or getattr(
        model, "__name__", "model")
    probe = CompiledModel(name or fname, compiled, specs, [], source="function")
    outs = probe.run(probe.example(1))
    names = list(outputs) if outputs else [f"output{k}" for k in range(len(outs))]
    if len(names) != len(outs):
        raise InferenceError(f"outputs names {len(names)} tensor(s) but the function "
                             f"returns {len(outs)}")
    out_specs = [TensorSpec(n, np.asarray(o).dtype, (None, *np.asarray(o).shape[1:]))
                 for n, o in zip(names, outs, strict=True)]
    return CompiledModel(name or fname, compiled, specs, out_specs, source="function")


def as_model(model: Any) -> CompiledModel:
    """``model`` if it is a :class:`CompiledModel`, else :func:`load` of it."""
    return model if isinstance(model, CompiledModel) else load(model)


def _as_list(out: Any) -> list[Any]:
    """A compiled model's result (one array or a tuple of them) as a list."""
    return list(out) if isinstance(out, tuple) else [out]
