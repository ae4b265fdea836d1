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
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PycLabError
from . import guards as guards_
from .arguments import (
    ARRAY_MODULE,
    array_module,
    holds_arrays,
    static_argument_key,
)
from .artifact import Artifact
from .cache_keys import static_key
from .errors import DynamicShapeError, TraceError
from .fast_path import FastEntry, call_kinds, fast_entry, pack
from .ir import Graph, dtype_short
from .ops import FUSED_OPS, VIEW_RESULT_OPS, ShapeError, evaluate, run_graph
from .policy import MODES, choose
from .signature import check_argument, check_signature_type, parse_spec
from .tracer import is_array, is_array_mapping, is_array_sequence, trace
from .values import is_foreign_array

if TYPE_CHECKING:  # pragma: no cover
    from .bound import BoundCall

__all__ = ["BACKENDS", "CompiledFunction", "compile"]

log = logging.getLogger(__name__)

BACKENDS = ("auto", "cupy", "numpy")


def compile(
    fn: Callable | None = None,
    *,
    backend: str = "auto",
    mode: str = "balanced",
    cuda_graph: bool | str = "auto",
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
        On the cupy backend, capture the launch list into CUDA graphs at the second
        call and replay them from then on (GEMMs are recorded as direct cuBLAS calls
        where nvmath-python is installed, else run between graph segments). ``"auto"``
        (the default) captures a program of several launches on at most 8 MiB of inputs
        and outputs, where the host's launches are the cost, and nothing else;
        ``explain()`` says which and why. ``True`` always, ``False`` never.
    signature
        Optional expected inputs, e.g. ``{"x": "f32[*,512]", "w": "f32[512,256]"}``
        (``*`` matches any size); a call that does not match raises a
        :class:`PycLabError` naming the argument, what was expected and what came.
    passes
        Pass pipeline override (default: ``passes.DEFAULT_PIPELINE``).

    Returns
    -------
    CompiledFunction

    Notes
    -----
    Semantics are NumPy's. Globals and closure variables the function reads are guarded
    (:mod:`pyc_lab.compiler.guards`): rebinding one re-traces at the next call, and
    arrays read that way are inputs read afresh at every call. Writes into arguments
    (``x += 1``, ``x[0] = 0``, ``out=x``) reach the caller's arrays as in NumPy. Results
    share memory with the arguments exactly where NumPy's would (a returned argument or
    a view of one; on the cupy backend results are fresh arrays, except an argument the
    function wrote into and views of it). A graph break whose result shape depends on
    the data is checked at every call; when the shape changes the function runs as
    written from then on (``explain()`` says so).
    """
    if backend not in BACKENDS:
        raise PycLabError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if mode not in MODES:
        raise PycLabError(f"mode must be one of {MODES}, got {mode!r}")
    if cuda_graph not in (True, False, "auto"):
        raise PycLabError(f"cuda_graph must be True, False or 'auto', got {cuda_graph!r}")
    check_signature_type(signature)

    def wrap(f: Callable) -> CompiledFunction:
        return CompiledFunction(f, backend=backend, mode=mode, cuda_graph=cuda_graph,
                                signature=signature, passes=passes)

    return wrap if fn is None else wrap(fn)


def _as_function(fn: Any) -> Callable:
    """``fn`` as a Python function with a readable signature (a ufunc is wrapped)."""
    if isinstance(fn, np.ufunc):
        return _ufunc_function(fn)
    if not callable(fn):
        raise PycLabError(f"pyc_lab.compile needs a function, got {type(fn).__name__}")
    if isinstance(fn, functools.partial):
        fn = _partial_function(fn)
    elif guards_.is_user_object(fn):
        # a callable object (a model with __call__): its bound __call__, whose self is
        # guarded as a bound method's
        fn = types.MethodType(type(fn).__call__, fn)
    try:
        inspect.signature(fn)
    except (TypeError, ValueError):
        name = getattr(fn, "__name__", type(fn).__name__)
        raise PycLabError(
            f"pyc_lab.compile needs a function whose signature Python can read; {name!r} "
            f"is a builtin without one. Wrap it: pl.compile(lambda *a: {name}(*a)) with "
            "the arguments it takes") from None
    return fn


def _partial_function(part: functools.partial) -> Callable:
    """``functools.partial(f, *args, **kw)`` as a function whose closure holds ``f`` and
    the bound arguments, so that guards see them (arrays among them are inputs read at
    every call, as a closure's are)."""
    func, bound_args, bound_kw = part.func, part.args, dict(part.keywords)

    def partial_call(*args: Any, **kwargs: Any) -> Any:
        return func(*bound_args, *args, **{**bound_kw, **kwargs})

    partial_call.__signature__ = inspect.signature(part)  # type: ignore[attr-defined]
    partial_call.__name__ = partial_call.__qualname__ = getattr(func, "__name__", "partial")
    partial_call.__doc__ = getattr(func, "__doc__", None)
    return partial_call


def _dropped() -> None:
    """What an instance's cached compiled method unpickles to: nothing (made again)."""
    return None


def _remade(fn: Callable, options: dict[str, Any]) -> CompiledFunction:
    """A compiled function made afresh from its function and options (unpickling)."""
    return CompiledFunction(fn, **options)


def _ufunc_function(ufunc: np.ufunc) -> Callable:
    if ufunc.nin == 1:
        def fn(x: Any) -> Any:
            return ufunc(x)
    elif ufunc.nin == 2:
        def fn(x1: Any, x2: Any) -> Any:  # type: ignore[misc]
            return ufunc(x1, x2)
    else:
        raise PycLabError(f"pyc_lab.compile(np.{ufunc.__name__}): a ufunc of {ufunc.nin} "
                          "inputs; wrap it in a function")
    fn.__name__ = fn.__qualname__ = ufunc.__name__
    fn.__doc__ = ufunc.__doc__
    return fn


class CompiledFunction:
    """A compiled function: call it like the original; ``explain()`` shows the work."""

    def __init__(self, fn: Callable, *, backend: str = "auto", mode: str = "balanced",
                 cuda_graph: bool | str = "auto", signature: dict[str, str] | None = None,
                 passes: list[str] | None = None) -> None:
        check_signature_type(signature)
        fn = _as_function(fn)
        self.fn = fn
        #: an instance's compiled method kept on it by __get__ (a cache copies drop)
        self._per_instance = False
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
        self._signature_text = dict(signature or {})
        self.signature = {k: parse_spec(k, v) for k, v in self._signature_text.items()}
        unknown = set(self.signature) - set(self._params)
        if unknown:
            raise PycLabError(f"signature names {sorted(unknown)}, which {fn.__name__} does "
                              f"not take; its parameters are {self._params}")
        # per key, the artifacts traced under different guarded globals, newest first
        self._cache: dict[tuple, list[Artifact]] = {}
        self._seen: dict[tuple, list[Artifact]] = {}  # call key -> the same lists
        self._last: Artifact | None = None
        #: The last call's per-argument (type, shape, dtype, C-contiguous) and artifact,
        #: where a call like it may skip the key and look-up (see :meth:`_fast_artifact`).
        self._fast: FastEntry | None = None
        self.stats = {"hits": 0, "misses": 0}
        functools.update_wrapper(self, fn)

    # -- calling ------------------------------------------------------------------------
    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """A method decorated with ``@pl.compile``: read through an instance, the
        compiled bound method of that instance, whose ``self`` is guarded as a bound
        method's is (see :mod:`.guards`). It is made once and kept on the instance as a
        cache: copies and pickles of the instance drop it and make their own."""
        if instance is None:
            return self
        slot = f"__pl_compiled_{self.fn.__name__}"
        store = getattr(instance, "__dict__", None)
        bound = store.get(slot) if store is not None else None
        if bound is None or bound.fn.__self__ is not instance:
            bound = _remade(types.MethodType(self.fn, instance), self._options())
            bound._per_instance = True
            if store is not None:
                store[slot] = bound
        return bound

    def __reduce__(self) -> tuple:
        """Pickled as its function and options, compiled afresh where it is loaded; an
        instance's cached method (see :meth:`__get__`) as nothing."""
        if self._per_instance:
            return (_dropped, ())
        return (_remade, (self.fn, self._options()))

    def __copy__(self) -> CompiledFunction | None:
        return None if self._per_instance else _remade(self.fn, self._options())

    def __deepcopy__(self, memo: dict) -> CompiledFunction | None:
        return self.__copy__()

    def _options(self) -> dict[str, Any]:
        return {"backend": self.backend, "mode": self.mode, "cuda_graph": self.cuda_graph,
                "passes": self.passes, "signature": self._signature_text or None}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fast = self._fast  # read once: another thread may replace it
        if fast is not None and not kwargs:
            art = self._fast_artifact(args, fast)
            if art is not None:  # the last call's kind: nothing to add around the run
                art.calls += 1
                return fast.pack(fast.run(list(args)))
        art, arrays = self._artifact(args, kwargs)
        art.calls += 1
        if art.dynamic is not None:
            self._fast = None
            return self.fn(*args, **kwargs)
        inputs = arrays + [art.guards.readers[name]() for name in art.captured]
        try:
            outs = art.runner(inputs)
        except DynamicShapeError as exc:
            art.dynamic = f"runs as written since call {art.calls}: {exc}"
            log.warning("%s: %s", self.fn.__name__, art.dynamic)
            self._fast = None
            return self.fn(*args, **kwargs)
        # every parameter given positionally, each an array, and this run went through:
        # the next call like it can take the fast path
        self._fast = fast_entry(art, args) \
            if not kwargs and self._plain and len(args) == len(self._params) else None
        for position, out in art.graph.writeback:
            dst, src = inputs[position], outs[out]
            if dst is not src:
                dst[...] = src
        for out, (position, steps) in art.returns_input.items():
            outs[out] = _view_of(inputs[position], steps)
        for out in art.graph.scalar_outputs:
            if isinstance(outs[out], np.ndarray):
                outs[out] = outs[out][()]  # NumPy's scalar, as the function returns
        return pack(outs, art.graph.output_tree)

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

    def gemm_problems(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        """The GEMMs this function runs for these arguments, as the tuner takes them.

        Traces (or reuses) the function for the arguments and returns one dict per matmul
        the tuning database can serve (2-D, float16 or float32, after the passes fused
        any bias and activation into it): ``{"m", "n", "k", "dtype", "layout", "bias",
        "activation"}``, duplicates dropped; give the list to
        :func:`pyc_lab.autotune_many`. Matmuls no tuned kernel can take (batched,
        other dtypes) are left out; :meth:`explain` says why for each.
        """
        from .policy import tuned_problem

        art, _ = self._artifact(args, kwargs)
        graph = art.graph
        problems: list[dict[str, Any]] = []
        for node in graph.nodes.values():
            if node.op != "matmul":
                continue
            problem, _why = tuned_problem(node, graph)
            if problem is None:
                continue
            m, n, k, dtype, layout, epilogue = problem
            item = {"m": m, "n": n, "k": k, "dtype": dtype,
                    "layout": layout, "bias": epilogue.bias,
                    "activation": epilogue.activation}
            if item not in problems:
                problems.append(item)
        return problems

    def _fast_artifact(self, args: tuple, fast: FastEntry) -> Artifact | None:
        """The last call's artifact when ``args`` are arrays of the same types, shapes,
        dtypes and contiguity and its guards still hold, else ``None`` (the full path).

        What the full path would compute from these arguments — their key, the backend,
        the artifact of that key whose guards hold — is the same as for the last call
        then, so only the comparison and the guards are paid.
        """
        parts, art = fast.kinds, fast.artifact
        if len(args) != len(parts):
            return None
        try:
            if call_kinds(args) != parts:
                return None
        except AttributeError:  # not an array this time
            return None
        if art.guards.guards and art.guards.failing() is not None:
            return None
        self.stats["hits"] += 1
        return art

    def bind(self, *args: Any) -> BoundCall:
        """Bind arrays for repeated runs without copies (onnxruntime's IOBinding idea).

        ``bound = f.bind(x, w)`` compiles, warms up and captures ``f`` on these arrays;
        each ``bound()`` then runs it on what they hold at that moment. With CUDA graphs
        on the CuPy backend that is one launch per graph, reading the arrays in place and
        returning the program's own output arrays (overwritten by its next run);
        elsewhere it is the ordinary call. See :mod:`pyc_lab.compiler.bound`.

        Raises
        ------
        PycLabError
            As the ordinary call does.
        """
        from .bound import BoundCall

        return BoundCall(self, args)

    def _bound_launch(self, args: tuple) -> tuple[Any, Any, str]:
        """``(run, holds, "")`` for a zero-copy replay of ``args`` (compiling the artifact
        if need be, without calling it) — ``run()`` the packed result, ``holds()``
        whether the artifact's guards still hold — or ``(None, None, why not)``."""
        art, _ = self._artifact(args, {})
        if fast_entry(art, args) is None:
            return None, None, ("the call needs work around its run (a graph break, an "
                                "argument written or returned, a scalar result, captured "
                                "arrays or non-array arguments)")
        bind = getattr(art.runner, "bind", None)
        if bind is None:
            return None, None, f"the {art.backend} backend has no captured program"
        launch = bind(list(args))
        if launch is None:
            exe = art.runner
            why = getattr(exe, "graph_capture_error", None) or getattr(
                exe, "graph_decision", None) or "CUDA graphs are off for this function"
            return None, None, str(why)
        tree = art.graph.output_tree
        guards = art.guards

        def run() -> Any:
            return pack(launch(), tree)

        def holds() -> bool:
            return not guards.guards or guards.failing() is None

        return run, holds, ""

    def cache_info(self) -> dict[str, int]:
        """Hits, misses and the number of cached signatures."""
        return {**self.stats, "signatures": sum(len(v) for v in self._cache.values())}

    def clear_cache(self) -> None:
        """Forget every compiled signature."""
        self._fast = None
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
        specs = self.signature

        def member(v: Any) -> tuple:
            """An array of a container argument: an input, and its kind for the key."""
            m = ARRAY_MODULE.get(type(v)) or array_module(v)
            modules.add(m)
            arrays.append(v)
            return (m, v.shape, v.dtype, v.flags.c_contiguous)

        for name, value in named:
            module = ARRAY_MODULE.get(type(value))
            if module is None:
                module = array_module(value)
            if module:
                if specs:
                    self._check_spec(name, value)
                modules.add(module)
                arrays.append(value)
                # NumPy's and CuPy's shapes are tuples already; a dtype is its own key
                key_parts.append((name, module, value.shape, value.dtype,
                                  value.flags.c_contiguous))
            elif is_array_sequence(value):
                # a sequence of arrays (an optimiser's parameters): each one an input, in
                # order, and the sequence's kind, length and arrays in the key
                key_parts.append((name, type(value), tuple(member(v) for v in value)))
            elif is_array_mapping(value):
                # a dict of arrays (parameters by name): each one an input, in order; its
                # numbers and strings static, by value
                kinds = tuple(member(v) if is_array(v) else ("static", static_key(v))
                              for v in value.values())
                key_parts.append((name, dict, tuple(static_key(k) for k in value), kinds))
            elif isinstance(value, (list, tuple)) and any(is_array(v) for v in value):
                raise PycLabError(
                    f"argument {name!r} is a {type(value).__name__} mixing arrays and other "
                    "values; pass a sequence of arrays only, or each array as its own "
                    "argument"
                )
            elif isinstance(value, (list, tuple)) and value and all(
                    isinstance(v, (int, float)) for v in value) and not (
                    type(value) is tuple and all(type(v) is int for v in value)):
                # (a tuple of ints is a shape or axes: static, by value)
                raise PycLabError(
                    f"argument {name!r} is a {type(value).__name__} of numbers; pass an "
                    f"array (np.asarray({name})) — lists are static values, not inputs"
                )
            elif holds_arrays(value):
                raise PycLabError(
                    f"argument {name!r} is a {type(value).__name__} holding arrays among "
                    "other values: they would be compiled in as constants, unseen when "
                    "they change. Pass the arrays as arguments (a list, tuple or dict of "
                    "arrays only), or compile a bound method (pl.compile(model.forward)), "
                    "whose self is read at every call")
            elif is_foreign_array(value):
                raise PycLabError(
                    f"argument {name!r} is a {type(value).__module__}.{type(value).__name__}: "
                    "compiled functions take NumPy and CuPy arrays; any other array-like "
                    f"would be compiled in as a constant. Pass np.asarray({name}) (or a CuPy "
                    "array: cupy.asarray, cupy.from_dlpack)")
            else:
                key_parts.append((name, "static", static_argument_key(value)))
        call_key = tuple(key_parts)
        entries = self._seen.get(call_key)  # modules are in the key: backend resolved
        if entries:
            art = _valid(entries)
            if art is not None:
                self.stats["hits"] += 1
                return art, arrays
        if bound is None:
            bound = self._bind(args, kwargs)
        backend = self._resolve_backend(modules, bound)
        key = (backend, call_key)
        entries = self._cache.setdefault(key, [])
        self._seen[call_key] = entries
        art = _valid(entries)
        if art is not None:
            self.stats["hits"] += 1
            return art, arrays
        if entries:
            changed = [g.source for a in entries for g in a.guards.guards if not g.holds()]
            log.info("%s: re-tracing: %s changed since the last trace", self.fn.__name__,
                     ", ".join(sorted(set(changed))) or "a guarded value")
        self.stats["misses"] += 1
        art = self._build(key, backend, bound)
        entries.insert(0, art)
        del entries[_MAX_ENTRIES:]
        self._last = art
        return art, arrays

    def _check_spec(self, name: str, value: Any) -> None:
        spec = self.signature.get(name)
        if spec is not None:
            check_argument(name, value, spec)

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
            for n, v in _array_arguments(bound.arguments))
        module = "cupy" if backend == "cupy" else "numpy"
        guards = guards_.collect(
            self.fn, lambda a: type(a).__module__.split(".")[0] == module)
        try:
            graph, breaks = trace(self.fn, bound.args, bound.kwargs,
                                  captured=guards.captured)
        except (ShapeError, TraceError) as exc:
            raise _with_context(exc, f"{self.fn.__name__}({signature}): {exc}") from None
        n_args = len(_array_arguments(bound.arguments))
        captured = [graph.nodes[i].name or "" for i in graph.inputs[n_args:]]
        returns_input = _returned_inputs(graph)
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
                        runner, kernels, ms, guards=guards, captured=captured,
                        returns_input=returns_input)


def _run_numpy(graph: Graph, arrays: list[Any]) -> list[Any]:
    with np.errstate(all="ignore"):
        return run_graph(graph, arrays, np)


def _numpy_kernels(graph: Graph) -> list[dict[str, Any]]:
    out = []
    for node in graph:
        if node.op in FUSED_OPS:
            out.append({"name": node.attrs.get("name"), "ops": list(node.attrs.get("ops", ())),
                        "implementation": "numpy (one reference call per op)"})
    return out


#: Artifacts kept per signature for different values of guarded globals.
_MAX_ENTRIES = 8


def _valid(entries: list[Artifact]) -> Artifact | None:
    """The newest artifact whose guards all hold."""
    for art in entries:
        if art.guards.failing() is None:
            return art
    return None


def _with_context(exc: Exception, message: str) -> Exception:
    """``exc`` with ``message`` (its class kept; those that cannot be rebuilt as they are)."""
    try:
        return type(exc)(message)
    except TypeError:
        return exc


def _returned_inputs(graph: Graph) -> dict[int, tuple[int, tuple]]:
    """Results that are an argument the function wrote into, or a view of one: NumPy
    returns that argument (or that view of it) there, so the compiled function returns
    the caller's array, after the write, through the same view ops.

    Returns output position -> (input position, view ops ``(op, attrs)`` in order).
    """
    written = {graph.outputs[pos]: inp for inp, pos in graph.writeback}
    skip = {pos for _, pos in graph.writeback}
    out: dict[int, tuple[int, tuple]] = {}
    for k, nid in enumerate(graph.outputs):
        if k in skip:
            continue
        steps: list[tuple[str, dict[str, Any]]] = []
        node = graph.nodes[nid]
        while node.id not in written and node.op in VIEW_RESULT_OPS:
            steps.append((node.op, node.attrs))
            node = graph.nodes[node.inputs[0]]
        if node.id in written:
            out[k] = (written[node.id], tuple(reversed(steps)))
    return out


def _view_of(value: Any, steps: tuple) -> Any:
    """``value`` through the view ops ``steps`` (the references of views are views)."""
    xp = np
    if type(value).__module__.startswith("cupy"):
        import cupy as xp
    for op, attrs in steps:
        value = evaluate(op, xp, [value], attrs)
    return value


def _array_arguments(arguments: Any) -> list[tuple[str, Any]]:
    """The array arguments in input order, the arrays of a sequence argument each named
    ``name[i]``."""
    out: list[tuple[str, Any]] = []
    for name, v in arguments.items():
        if is_array(v):
            out.append((name, v))
        elif is_array_sequence(v):
            out.extend((f"{name}[{i}]", e) for i, e in enumerate(v))
        elif is_array_mapping(v):
            out.extend((f"{name}[{k!r}]", e) for k, e in v.items() if is_array(e))
    return out
