"""IPython magics: thin wrappers that parse arguments, call the library and display.

``%load_ext pyc_lab`` registers them (and prints nothing); ``%unload_ext pyc_lab``
removes them again: ``%pyc_hw`` (topology), ``%%pyc_compile`` (the compiler),
``%pyc_tune`` (the GEMM autotuner, live or replayed), ``%pyc_timeline`` (the last
pipeline's timeline), ``%%pyc_trace`` (the GPU activity of a cell, per stream) and
``%pyc_serve`` (the inference servers running in the kernel).
"""

from __future__ import annotations

import ast
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, kwds, magic_arguments, parse_argstring
from IPython.display import display

from .cli import check_recording, dimension
from .errors import PycLabError

__all__ = ["PycLabMagics", "register", "unregister"]

#: What to type for ``%pyc_tune`` (argparse would list the options first).
TUNE_USAGE = ("%pyc_tune gemm M N K [--dtype DTYPE] [--layout LAYOUT] [--strategy STRATEGY] "
              "[--budget S] [--max-candidates N] [--replay [PATH]] [--wait]")


def _parse(magic: Any, line: str, name: str) -> Any:
    """Parse a magic's line; a bad one is a one-line UsageError saying what to type."""
    try:
        return parse_argstring(magic, line)
    except UsageError as exc:
        # IPython's help formatter writes the usage as a reST literal block ("::")
        words = [w for w in magic.parser.format_usage().split() if w not in ("usage:", "::")]
        usage = " ".join(words)
        if name.startswith("%%") and not usage.startswith("%%"):
            usage = "%" + usage  # argparse knows the cell magic by its line name
        raise UsageError(f"{name}: {exc}. Type: {usage} ({name}? explains every "
                         "option)") from None


def _check_folder(flag: str, path: str, magic: str) -> None:
    """Refuse an output path whose folder does not exist, before any work is done."""
    from pathlib import Path

    folder = Path(path).parent
    if not folder.is_dir():
        raise UsageError(f"{magic}: {flag} {path}: folder {folder} does not exist; create "
                         "it first")


@magics_class
class PycLabMagics(Magics):
    """pyc_lab's magics."""

    @magic_arguments()
    @argument("--snapshot", "-s", metavar="PATH",
              help="show a saved profile (a JSON path or a shipped name: h200, dgx-h100) "
                   "instead of probing this machine")
    @argument("--bandwidth", "-b", action="store_true",
              help="also measure copy bandwidths (H2D/D2H pageable and pinned, D2D, peer; "
                   "host memcpy only without a GPU); takes a few seconds")
    @line_magic
    def pyc_hw(self, line: str) -> Any:
        """Show the machine's topology: NUMA nodes, CPUs, GPUs, links, PCIe bandwidths.

        Examples::

            %pyc_hw
            %pyc_hw --bandwidth
            %pyc_hw --snapshot dgx-h100
        """
        from .hardware import detect_hardware
        from .profiling import probe_bandwidth
        from .widgets import TopologyWidget

        args = _parse(self.pyc_hw, line, "%pyc_hw")
        try:
            profile = detect_hardware(snapshot=args.snapshot)
            bandwidth = None
            if args.bandwidth:
                if args.snapshot:
                    raise PycLabError(
                        "--bandwidth measures this machine and cannot be combined with "
                        "--snapshot; drop one of them"
                    )
                bandwidth = probe_bandwidth(profile=profile)
        except PycLabError as exc:
            # A bad argument is the user's to fix: a one-line message, not a traceback.
            raise UsageError(f"%pyc_hw: {exc}") from exc
        display(TopologyWidget(profile, bandwidth))
        return None

    @magic_arguments()
    @argument("--show", choices=["all", "ir", "kernels", "decisions", "memory"],
              default="all", help="which part of the explanation to show (default: all)")
    @argument("--backend", "-b", default="auto", choices=["auto", "cupy", "numpy"],
              help="backend for the compiled functions (default: auto)")
    @argument("--mode", "-m", default="balanced",
              choices=["balanced", "memory_first", "utilization_first"],
              help="compilation mode (default: balanced)")
    @argument("--example", "-e", metavar="EXPR",
              help="an expression giving example arguments, e.g. '(x, w, b)', to trace "
                   "the functions with when the cell does not call them")
    @cell_magic
    def pyc_compile(self, line: str, cell: str) -> Any:
        """Compile the functions defined in the cell and show what the compiler did.

        The cell runs as usual; every function it defines (``def f(...)``) is replaced in
        the namespace by ``pyc_lab.compile(f, backend=..., mode=...)``. If the cell calls
        the function, its explanation for that call is shown; otherwise pass
        ``--example "(x, w, b)"``.

        Example::

            %%pyc_compile --show decisions
            def f(x, w, b):
                return np.tanh(x @ w + b)
            y = f(x, w, b)
        """
        from .compiler.api import compile as pl_compile

        args = _parse(self.pyc_compile, line, "%%pyc_compile")
        try:
            tree = ast.parse(cell)
        except SyntaxError as exc:
            raise UsageError(f"%%pyc_compile: the cell is not valid Python: {exc}") from exc
        names = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
        if not names:
            raise UsageError("%%pyc_compile: the cell defines no function (def ...)")
        ns = self.shell.user_ns
        # Define the functions first, wrap them, then run the rest of the cell.
        defs = ast.Module(body=[n for n in tree.body if isinstance(n, ast.FunctionDef)],
                          type_ignores=[])
        rest = ast.Module(body=[n for n in tree.body if not isinstance(n, ast.FunctionDef)],
                          type_ignores=[])
        exec(compile(defs, "<pyc_compile>", "exec"), ns)  # runs the user's own cell
        try:
            for name in names:
                ns[name] = pl_compile(ns[name], backend=args.backend, mode=args.mode)
        except PycLabError as exc:
            raise UsageError(f"%%pyc_compile: {exc}") from exc
        if rest.body:
            result = self.shell.run_cell(ast.unparse(rest), store_history=False)
            if not result.success:
                return None
        example = None
        if args.example:
            try:
                example = eval(args.example, ns)  # the user's own expression
            except Exception as exc:
                raise UsageError(f"%%pyc_compile: --example {args.example!r} raised "
                                 f"{type(exc).__name__}: {exc}") from None
            example = example if isinstance(example, tuple) else (example,)
        for name in names:
            fn = ns[name]
            try:
                explanation = fn.explain(*example) if example else fn.explain()
            except PycLabError as exc:
                display({"text/plain": f"{name}: {exc}"}, raw=True)
                continue
            display(_part(explanation, args.show))
        return None

    @magic_arguments()
    @kwds(usage=TUNE_USAGE.replace("%pyc_tune", "%(prog)s", 1))
    @argument("op", metavar="gemm", choices=["gemm"],
              help="what to tune: gemm, a matrix product a @ b")
    @argument("m", metavar="M", type=dimension, help="M (a is M x K)")
    @argument("n", metavar="N", type=dimension, help="N (b is K x N)")
    @argument("k", metavar="K", type=dimension, help="K")
    # the defaults named here are GemmTuneOptions' (tests/test_extension.py checks them)
    @argument("--dtype", default=None,
              help="f16, bf16, tf32 or f32 (SIMT); default f16")
    @argument("--layout", default=None, help="tn, tt, nt or nn; default tn")
    @argument("--strategy", default=None,
              help="exhaustive, random, successive_halving or evolutionary; default "
                   "successive_halving")
    @argument("--budget", metavar="S", type=float, default=None,
              help="stop starting candidates after S seconds (0: no limit); default 180")
    @argument("--max-candidates", metavar="N", type=int, default=None,
              help="consider at most N configurations (0: all); default 16")
    @argument("--replay", metavar="PATH", nargs="?", const="", default=None,
              help="replay a recorded tuning (the H200 recording shipped with pyc_lab, or "
                   "a tuning-database export) instead of tuning on this GPU")
    @argument("--wait", action="store_true",
              help="tune to the end before showing the widget (deterministic output); "
                   "by default a live notebook shows it at once and tunes in the background")
    @line_magic
    def pyc_tune(self, line: str) -> Any:
        """Tune a CUTLASS GEMM and show it in an AutotuneWidget (chart, Stop, tables).

        On a GPU it tunes live; without one (or with ``--replay``) it replays the tuning
        recorded on an H200, and says so.

        Examples::

            %pyc_tune gemm 4096 4096 4096 --dtype f16
            %pyc_tune gemm 4096 4096 4096 --dtype f16 --replay --strategy evolutionary
            %pyc_tune gemm 2048 2048 2048 --max-candidates 4 --budget 120
        """
        from .widgets.autotune import AutotuneWidget
        from .widgets.display import has_live_frontend

        args = _parse(self.pyc_tune, line, "%pyc_tune")
        live_view = has_live_frontend()
        try:
            if (args.budget or 0) < 0 or (args.max_candidates or 0) < 0:
                raise PycLabError("--budget and --max-candidates take numbers >= 0 "
                                  "(0: no limit)")
            if args.replay:
                check_recording(args.replay)
            # what is not given comes from GemmTuneOptions, as for autotune_gemm; 0 = no limit
            settings = {name: value for name, value in (
                ("dtype", args.dtype), ("layout", args.layout), ("strategy", args.strategy))
                if value is not None}
            if args.budget is not None:
                settings["budget_s"] = args.budget or None
            if args.max_candidates is not None:
                settings["max_candidates"] = args.max_candidates or None
            replay = args.replay is not None
            widget = AutotuneWidget(
                args.m, args.n, args.k, mode="replay" if replay else "auto",
                source=args.replay or None,
                pace_s=0.1 if live_view and not args.wait else 0.0, **settings)
            if args.wait or not live_view:
                widget.run(wait=True)
        except PycLabError as exc:
            raise UsageError(f"%pyc_tune: {exc}") from exc
        display(widget)
        if live_view and not args.wait:
            widget.run(wait=False)
        return None

    @magic_arguments()
    @argument("--chrome", metavar="PATH",
              help="also write the trace as Chrome trace-event JSON (opens in Perfetto)")
    @line_magic
    def pyc_timeline(self, line: str) -> Any:
        """Show the timeline of the last pyc_lab.Pipeline run: lanes, stages, overlap.

        Example::

            for out in pipe.run(items): ...
            %pyc_timeline --chrome belt.json
        """
        from .runtime.pipeline import last_pipeline
        from .widgets import TimelineWidget

        args = _parse(self.pyc_timeline, line, "%pyc_timeline")
        if args.chrome:
            _check_folder("--chrome", args.chrome, "%pyc_timeline")
        pipe = last_pipeline()
        if pipe is not None and not pipe.traced:
            raise UsageError("%pyc_timeline: the last pipeline was built with trace=False and "
                             "recorded no spans; build it with trace=True (the default)")
        if pipe is None or not len(pipe.trace):
            raise UsageError("%pyc_timeline: no pipeline has run yet in this kernel; run "
                             "pyc_lab.Pipeline(...).run(items) first")
        if args.chrome:
            pipe.trace.to_chrome(args.chrome)
        display(TimelineWidget(pipe.trace))
        return None


    @magic_arguments()
    @argument("--backend", default="auto", choices=["auto", "cupti", "torch"],
              help="how CUPTI is reached: cupti-python, PyTorch's profiler, or the first "
                   "of them that is installed (default)")
    @argument("--chrome", metavar="PATH",
              help="also write the trace as Chrome trace-event JSON (opens in Perfetto)")
    @cell_magic
    def pyc_trace(self, line: str, cell: str) -> Any:
        """Run the cell and show the GPU work it did: kernels and copies per stream.

        Whatever launched the work (CuPy, CUTLASS, cuBLAS, PyTorch, a pyc_lab belt), the
        timeline shows one lane per CUDA stream with the overlap summary. Without a GPU
        (or a CUPTI backend) the cell still runs and the reason it was not traced is
        shown.

        Example::

            %%pyc_trace --chrome cell.json
            y = cp.sin(cp.asarray(x)).get()
        """
        from .profiling.activity import GpuActivity
        from .widgets import TimelineWidget

        args = _parse(self.pyc_trace, line, "%%pyc_trace")
        if args.chrome:
            _check_folder("--chrome", args.chrome, "%%pyc_trace")
        try:
            tracer = GpuActivity(args.backend, name="%%pyc_trace")
        except PycLabError as exc:
            self.shell.run_cell(cell, store_history=False)
            display({"text/plain": f"%%pyc_trace: the cell ran untraced: {exc}"}, raw=True)
            return None
        with tracer:  # pragma: no cover - needs a GPU
            result = self.shell.run_cell(cell, store_history=False)
        if not result.success:  # pragma: no cover - needs a GPU
            return None
        if args.chrome:  # pragma: no cover - needs a GPU
            tracer.trace.to_chrome(args.chrome)
        display(TimelineWidget(tracer.trace))  # pragma: no cover - needs a GPU
        return None

    @magic_arguments()
    @argument("-n", "--repeats", type=int, default=20, metavar="REPEATS",
              help="timed calls (default 20)")
    @argument("-w", "--warmup", type=int, default=2, metavar="WARMUP",
              help="untimed calls made first (default 2)")
    @argument("--flush-l2", action="store_true",
              help="flush the GPU's L2 cache before every timed call (outside the interval)")
    @argument("--no-spin", action="store_true",
              help="no spin kernel ahead of the start event: the GPU time then includes the "
                   "host's launch gaps (use it for a statement that waits for the GPU)")
    @argument("--cpu", action="store_true", help="time on the host only, even with a GPU")
    @argument("-o", "--output", action="store_true",
              help="also return the Timing (as %%timeit -o does): t = %%pyc_timeit -o f(x)")
    @argument("statement", nargs="*",
              help="the statement to time (line form; kept verbatim); the cell form times "
                   "the cell body")
    @line_cell_magic
    def pyc_timeit(self, line: str, cell: str | None = None) -> Any:
        """Time a statement (or the cell): GPU and CPU time per call, median of repeats.

        Runs the statement in the notebook's namespace through
        ``pyc_lab.profiling.benchmark``: warm-up calls, then timed ones, each between two
        CUDA events (GPU time) and two host clock reads (CPU time), with a spin kernel
        ahead of the start event so the host's launch gaps stay out of the GPU time.
        Without a GPU (or with ``--cpu``) it times on the host and says why there is no
        GPU time. The :class:`~pyc_lab.profiling.Timing` is displayed; with ``-o`` it is
        also returned, as ``%timeit -o`` does: ``t = %pyc_timeit -o f(x)`` (then
        ``t.to_dict()``, ``t.gpu_median_s``). Options come before the statement; ``--``
        ends them.

        Examples::

            %pyc_timeit cp.matmul(a, b)
            t = %pyc_timeit -o -n 50 --flush-l2 f(x)

            %%pyc_timeit -n 10 --cpu
            y = np.sort(x)
            z = y[::2].sum()
        """
        import re

        from .profiling.timing import benchmark

        magic = "%pyc_timeit" if cell is None else "%%pyc_timeit"
        # Leading options go to argparse; the statement after them is kept verbatim
        # (argparse would split it on spaces and strip its quotes). A token is an option
        # only if it starts with "--" or is -n/-w (with or without a number), so that a
        # statement such as "-x + 1" stays a statement.
        def head(text: str) -> tuple[str, str]:
            first, *others = text.split(None, 1)
            return first, (others[0] if others else "")

        rest, options = line.strip(), []
        while rest.startswith("-"):
            token, after = head(rest)
            if token == "--":
                rest = after
                break
            if not (token.startswith("--") or re.fullmatch(r"-[nw]\d*|-o", token)):
                break
            options.append(token)
            rest = after
            if token in ("-n", "-w", "--repeats", "--warmup") and rest:
                value, rest = head(rest)
                options.append(value)
        args = _parse(self.pyc_timeit, " ".join(options), magic)
        if cell is None:
            statement = rest
            if not statement:
                raise UsageError("%pyc_timeit: nothing to time; e.g. %pyc_timeit -n 50 f(x)")
        else:
            if rest:
                raise UsageError("%%pyc_timeit: only options go on the magic's line "
                                 f"(got {rest!r}); the cell body is what is timed")
            statement = cell
        try:
            code = compile(self.shell.transform_cell(statement), "<pyc_timeit>", "exec")
        except SyntaxError as exc:
            raise UsageError(f"{magic}: the statement is not valid Python: {exc}") from exc
        ns = self.shell.user_ns
        lines = [ln.strip() for ln in statement.strip().splitlines()]
        label = lines[0] if len(lines) == 1 else f"{lines[0]} ... ({len(lines)} lines)"
        label = label if len(label) <= 60 else label[:57] + "..."
        try:
            timing = benchmark(lambda: exec(code, ns),  # the user's own statement
                               repeats=args.repeats, warmup=args.warmup,
                               flush_l2=args.flush_l2, spin=not args.no_spin,
                               gpu=False if args.cpu else None, name=label)
        except PycLabError as exc:
            raise UsageError(f"{magic}: {exc}") from exc
        except Exception as exc:
            raise UsageError(f"{magic}: the statement raised {type(exc).__name__}: "
                             f"{exc}") from exc
        display(timing)
        return timing if args.output else None

    @magic_arguments()
    @argument("--monitor", "-m", metavar="SERVER", nargs="?", const="",
              help="show the live latency monitor of a server (the only one by default)")
    @argument("--model", metavar="NAME", help="with --monitor: which model of the server")
    @argument("--stop", metavar="SERVER",
              help="close a server by name (finishing its queued work), or 'all'")
    @line_magic
    def pyc_serve(self, line: str) -> Any:
        """Show the inference servers running in this kernel (pl.serve); monitor or stop one.

        Examples::

            %pyc_serve                     # the running servers, their models and settings
            %pyc_serve --monitor           # live latency histogram and percentiles
            %pyc_serve --stop server-1     # close it (queued requests finish first)
        """
        from .inference.server import running_servers
        from .widgets.inference import ServerMonitor, ServersView

        args = _parse(self.pyc_serve, line, "%pyc_serve")
        servers = running_servers()
        if args.stop:
            chosen = [s for s in servers if args.stop in ("all", s.name)]
            if not chosen:
                raise UsageError(f"%pyc_serve: no running server {args.stop!r}; running: "
                                 f"{', '.join(s.name for s in servers) or 'none'}")
            for s in chosen:
                s.close()
            display(ServersView())
            return None
        if args.monitor is not None:
            if args.monitor:
                chosen = [s for s in servers if s.name == args.monitor]
            else:
                chosen = servers if len(servers) == 1 else []
            if not chosen:
                raise UsageError("%pyc_serve --monitor: name one running server ("
                                 f"{', '.join(s.name for s in servers) or 'none running'})")
            try:
                display(ServerMonitor(chosen[0], args.model))
            except PycLabError as exc:
                raise UsageError(f"%pyc_serve: {exc}") from None
            return None
        display(ServersView(servers))
        return None


def _part(explanation: Any, show: str) -> Any:
    """The piece of an Explanation that ``--show`` asks for."""
    import pandas as pd

    if show == "ir":
        return _Text(f"# IR before\n{explanation.ir_before}\n\n# IR after\n"
                     f"{explanation.ir_after}")
    if show == "kernels":
        return pd.DataFrame([{k: v for k, v in kern.items() if k != "source"}
                             for kern in explanation.kernels])
    if show == "decisions":
        return explanation.decisions
    if show == "memory":
        return _Text(f"peak {explanation.peak_bytes} B vs naive {explanation.naive_bytes} B"
                     f"\n{explanation.memory.to_string(index=False)}")
    return explanation


class _Text:
    """Plain text shown as-is (IR dumps)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def register(ipython: Any) -> None:
    """Register the magics with an IPython shell."""
    ipython.register_magics(PycLabMagics)


def unregister(ipython: Any) -> None:
    """Remove the magics registered by :func:`register`."""
    manager = ipython.magics_manager
    for kind in ("line", "cell"):
        table = manager.magics[kind]
        for name in list(PycLabMagics.magics[kind]):
            table.pop(name, None)
    manager.registry.pop(PycLabMagics.__name__, None)
