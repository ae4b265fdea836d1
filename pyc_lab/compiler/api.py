"""``pyc_lab.compile``: trace, optimise, choose, and run — cached per input signature.

.. code-block:: python

    @pl.compile
    def f(x, w, b):
        return np.tanh(x @ w + b)

    f(x, w, b)            # NumPy in, NumPy out (numpy backend)
    f(cx, cw, cb)         # CuPy in, CuPy out (cupy backend: generated kernels, cuBLAS)
    f.explain(x, w, b)    # IR before/after, kernels, decisions, memory plan, pass log
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import PycLabError
from .ir import Graph, dtype_short
from .ops import ShapeError, run_graph
from .policy import MODES, Decision, choose
from .tracer import TraceError, is_array, trace

__all__ = ["BACKENDS", "CompiledFunction", "compile"]

log = logging.getLogger(__name__)

BACKENDS = ("auto", "cupy", "numpy")


def compile(
    fn: Callable | None = None,
    *,
    backend: str = "auto",
    mode: str = "balanced",
    cuda_graph: bool = False,
    signature: dict[str, str] | None = None,
    passes: list[str] | None = None,
) -> Any:
    """Compile a NumPy-style function; usable as ``@compile`` or ``@compile(...)``.

    Parameters
    ----------
    fn
        The function. Its array arguments become graph inputs; other arguments are
        static (part of the cache key).
    backend
        ``"auto"`` follows the inputs — CuPy arrays on a usable GPU run on the cupy
        backend, NumPy arrays on the numpy backend; ``"cupy"`` or ``"numpy"`` insist.
    mode
        ``"balanced"``, ``"memory_first"`` (in-place buffer reuse) or
        ``"utilization_first"`` (see :mod:`pyc_lab.compiler.policy`).
    cuda_graph
        On the cupy backend, capture the launch list into CUDA graphs and replay them
        (CuPy cannot capture cuBLAS calls, so each matmul runs between graph segments).
    signature
        Optional expected inputs, e.g. ``{"x": "f32[*,512]", "w": "f32[512,256]"}``
        (``*`` matches any size); a call that does not match raises a
        :class:`PycLabError` naming the argument, what was expected and what came.
    passes
        Pass pipeline override (default: ``passes.DEFAULT_PIPELINE``).

    Returns
    -------
    CompiledFunction
    """
    if backend not in BACKENDS:
        raise PycLabError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if mode not in MODES:
        raise PycLabError(f"mode must be one of {MODES}, got {mode!r}")

    def wrap(f: Callable) -> CompiledFunction:
        if not callable(f):
            raise PycLabError(f"pyc_lab.compile needs a function, got {type(f).__name__}")
        return CompiledFunction(f, backend=backend, mode=mode, cuda_graph=cuda_graph,
                                signature=signature, passes=passes)

    return wrap if fn is None else wrap(fn)


@dataclass
class Artifact:
    """Everything built for one input signature."""

    key: tuple
    backend: str
    graph_before: Graph
    graph: Graph
    pass_log: Any
    notes: list[str]
    decisions: list[Decision]
    plan: Any
    breaks: list[dict[str, Any]]
    runner: Callable[[list[Any]], list[Any]]
    kernels: list[dict[str, Any]] = field(default_factory=list)
    compile_ms: float = 0.0
    calls: int = 0


_SPEC = re.compile(r"^\s*([a-z0-9]+)\s*\[([^\]]*)\]\s*$")


def _parse_spec(name: str, text: str) -> tuple[np.dtype | None, tuple[int | None, ...]]:
    m = _SPEC.match(text)
    if not m:
        raise PycLabError(f"signature for {name!r}: {text!r} is not like 'f32[*,128]'")
    long = {v: k for k, v in {
        "float64": "f64", "float32": "f32", "float16": "f16", "int64": "i64", "int32": "i32",
        "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "bool"}.items()}
    dt = m.group(1)
    dtype = None if dt in ("any", "*") else np.dtype(long.get(dt, dt))
    dims = tuple(None if d.strip() in ("*", "?") else int(d) for d in m.group(2).split(",")
                 if d.strip()) if m.group(2).strip() else ()
    return dtype, dims


class CompiledFunction:
    """A compiled function: call it like the original; ``explain()`` shows the work."""

    def __init__(self, fn: Callable, *, backend: str = "auto", mode: str = "balanced",
                 cuda_graph: bool = False, signature: dict[str, str] | None = None,
                 passes: list[str] | None = None) -> None:
        self.fn = fn
        self.backend = backend
        self.mode = mode
        self.cuda_graph = cuda_graph
        self.passes = passes
        self._sig = inspect.signature(fn)
        self._params = list(self._sig.parameters)
        # plain positional parameters: a call with exactly that many positional arguments
        # needs no Signature.bind (the per-call fast path)
        self._plain = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                          for p in self._sig.parameters.values())
        self.signature = {k: _parse_spec(k, v) for k, v in (signature or {}).items()}
        unknown = set(self.signature) - set(self._params)
        if unknown:
            raise PycLabError(f"signature names {sorted(unknown)}, which {fn.__name__} does "
                              f"not take; its parameters are {self._params}")
        self._cache: dict[tuple, Artifact] = {}
        self._seen: dict[tuple, Artifact] = {}  # call key (array modules + spec) -> artifact
        self._last: Artifact | None = None
        self.stats = {"hits": 0, "misses": 0}
        functools.update_wrapper(self, fn)

    # -- calling ------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        art, arrays = self._artifact(args, kwargs)
        art.calls += 1
        outs = art.runner(arrays)
        return _pack(outs, art.graph.output_tree)

    def explain(self, *args: Any, **kwargs: Any) -> Any:
        """Compile for these arguments (if not yet) and return an Explanation.

        With no arguments, explain the signature compiled most recently.
        """
        from .explain import Explanation

        if not args and not kwargs and self._params:
            if self._last is None:
                raise PycLabError(
                    f"{self.fn.__name__} has not been compiled yet: call it, or pass example "
                    f"arguments to explain(...)"
                )
            art = self._last
        else:
            art, _ = self._artifact(args, kwargs)
        return Explanation.from_artifact(self.fn.__name__, art, self.mode)

    def cache_info(self) -> dict[str, int]:
        """Hits, misses and the number of cached signatures."""
        return {**self.stats, "signatures": len(self._cache)}

    def clear_cache(self) -> None:
        """Forget every compiled signature."""
        self._cache.clear()
        self._seen.clear()

    # -- internals -----------------------------------------------------------------------
    def _bind(self, args: tuple, kwargs: dict) -> inspect.BoundArguments:
        try:
            bound = self._sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise PycLabError(f"{self.fn.__name__}: {exc}") from None
        bound.apply_defaults()
        return bound

    def _artifact(self, args: tuple, kwargs: dict) -> tuple[Artifact, list[Any]]:
        bound: inspect.BoundArguments | None = None
        if not kwargs and self._plain and len(args) == len(self._params):
            named: Any = zip(self._params, args, strict=True)
        else:
            bound = self._bind(args, kwargs)
            named = bound.arguments.items()
        arrays: list[Any] = []
        key_parts: list[Any] = []
        modules = set()
        for name, value in named:
            if is_array(value):
                self._check_spec(name, value)
                module = "cupy" if type(value).__module__.startswith("cupy") else "numpy"
                modules.add(module)
                arrays.append(value)
                key_parts.append((name, module, tuple(value.shape), value.dtype.str))
            elif isinstance(value, (list, tuple)) and any(is_array(v) for v in value):
                raise PycLabError(
                    f"argument {name!r} is a {type(value).__name__} of arrays; pass each "
                    "array as its own argument"
                )
            elif isinstance(value, (list, tuple)) and value and all(
                    isinstance(v, (int, float)) for v in value):
                raise PycLabError(
                    f"argument {name!r} is a {type(value).__name__} of numbers; pass an "
                    f"array (np.asarray({name})) — lists are static values, not inputs"
                )
            else:
                key_parts.append((name, "static", _static_key(value)))
        call_key = tuple(key_parts)
        art = self._seen.get(call_key)  # modules are in the key: the backend was resolved
        if art is not None:
            self.stats["hits"] += 1
            return art, arrays
        if bound is None:
            bound = self._bind(args, kwargs)
        backend = self._resolve_backend(modules, bound)
        key = (backend, call_key)
        art = self._cache.get(key)
        if art is None:
            self.stats["misses"] += 1
            art = self._build(key, backend, bound)
            self._cache[key] = art
            self._last = art
        else:
            self.stats["hits"] += 1
        self._seen[call_key] = art
        return art, arrays

    def _check_spec(self, name: str, value: Any) -> None:
        spec = self.signature.get(name)
        if spec is None:
            return
        dtype, dims = spec
        got = f"{dtype_short(value.dtype)}[{','.join(map(str, value.shape))}]"
        want = f"{dtype_short(dtype) if dtype is not None else 'any'}[" + ",".join(
            "*" if d is None else str(d) for d in dims) + "]"
        if len(value.shape) != len(dims):
            raise PycLabError(f"argument {name!r}: expected rank {len(dims)} ({want}), got "
                              f"rank {len(value.shape)} ({got})")
        for axis, (d, v) in enumerate(zip(dims, value.shape, strict=True)):
            if d is not None and d != v:
                raise PycLabError(f"argument {name!r}: expected size {d} on axis {axis} "
                                  f"({want}), got {v} ({got})")
        if dtype is not None and value.dtype != dtype:
            raise PycLabError(f"argument {name!r}: expected dtype {dtype.name} ({want}), got "
                              f"{value.dtype.name} ({got})")

    def _resolve_backend(self, modules: set[str], bound: inspect.BoundArguments) -> str:
        if len(modules) > 1:
            kinds = {n: type(v).__module__.split(".")[0] for n, v in bound.arguments.items()
                     if is_array(v)}
            raise PycLabError(
                f"{self.fn.__name__} got NumPy and CuPy arrays together ({kinds}); move them "
                "to one place first (cupy.asarray / cupy.asnumpy)"
            )
        module = next(iter(modules), "numpy")
        if self.backend == "numpy":
            if module == "cupy":
                raise PycLabError(f"{self.fn.__name__} was compiled with backend='numpy' but "
                                  "got CuPy arrays; pass NumPy arrays or use backend='auto'")
            return "numpy"
        if self.backend == "cupy":
            from ..hardware.device import require_cupy

            require_cupy(f"{self.fn.__name__} (backend='cupy')")
            if module == "numpy" and modules:
                raise PycLabError(f"{self.fn.__name__} was compiled with backend='cupy' but got "
                                  "NumPy arrays; pass CuPy arrays (cupy.asarray(x)) or use "
                                  "backend='auto'")
            return "cupy"
        if module == "cupy":
            from ..hardware.device import require_cupy

            require_cupy(f"{self.fn.__name__} on CuPy arrays")
        return module

    def _build(self, key: tuple, backend: str, bound: inspect.BoundArguments) -> Artifact:
        from .memory import plan_memory
        from .passes import PassManager

        t0 = time.perf_counter()
        signature = ", ".join(
            f"{n}: {dtype_short(v.dtype)}[{','.join(map(str, v.shape))}]"
            for n, v in bound.arguments.items() if is_array(v))
        try:
            graph, breaks = trace(self.fn, bound.args, bound.kwargs)
        except (ShapeError, TraceError) as exc:
            raise type(exc)(f"{self.fn.__name__}({signature}): {exc}") from None
        before = graph.copy()
        result = PassManager(self.passes, mode=self.mode).run(graph)
        graph = result.graph
        plan = plan_memory(graph, self.mode)
        notes = [n for rec in result.log for n in rec.notes]
        if backend == "numpy":
            decisions = choose(graph, "numpy", self.mode)
            runner = functools.partial(_run_numpy, graph)
            kernels = _numpy_kernels(graph)
        else:
            from .backend.executable import CupyExecutable
            from .codegen import supports

            decisions = choose(graph, "cupy", self.mode, supports)
            impl = {d.node: d.choice for d in decisions}
            exe = CupyExecutable(graph, impl, plan, cuda_graph=self.cuda_graph,
                                 tune_gemms=self.mode == "utilization_first")
            runner = exe
            kernels = exe.kernels
        ms = (time.perf_counter() - t0) * 1e3
        log.debug("compiled %s for %s on %s in %.1f ms", self.fn.__name__, signature, backend,
                  ms)
        return Artifact(key, backend, before, graph, result.log, notes, decisions, plan, breaks,
                        runner, kernels, ms)


def _run_numpy(graph: Graph, arrays: list[Any]) -> list[Any]:
    with np.errstate(all="ignore"):
        return run_graph(graph, arrays, np)


def _numpy_kernels(graph: Graph) -> list[dict[str, Any]]:
    out = []
    for node in graph:
        if node.op == "fused":
            out.append({"name": node.attrs.get("name"), "ops": list(node.attrs.get("ops", ())),
                        "implementation": "numpy (one reference call per op)"})
    return out


def _static_key(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def _pack(outs: list[Any], tree: Any) -> Any:
    if isinstance(tree, int):
        return outs[tree]
    return tuple(_pack(outs, t) for t in tree)
