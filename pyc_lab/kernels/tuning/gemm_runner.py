"""The live GEMM runner: CUTLASS candidates built, checked against cuBLAS and timed here.

For ``M x N x K`` in a dtype and layout, on this machine's GPU:

1. the candidates — :func:`~pyc_lab.kernels.cutlass.config.configurations` pruned for
   the problem and ranked by the cheap model; user restrictions and ``max_candidates``
   cut them to the configurations worth building;
2. those are built in parallel (``workers`` nvcc processes) into the kernel cache,
   best-ranked first, while the search measures the ones already built;
3. each candidate runs on inputs uniform in [-1, 1] into a NaN-poisoned output, twice,
   each launch watched for a hang; its output is compared with cuBLAS's
   (:mod:`~pyc_lab.kernels.tuning.gemm_reference`) and a NaN/Inf or an error above the
   dtype's tolerance rejects it, with the reason; correct ones are timed with
   :func:`pyc_lab.profiling.timing.benchmark` (CUDA events, L2 flushed, launch gaps
   kept out of the interval, median of ``fidelity`` runs);
4. for a plain ``"tn"`` f16/bf16 problem of at most 64 rows, every configuration of
   pyc_lab's skinny GEMM (:mod:`~pyc_lab.kernels.skinny`, compiled by NVRTC in seconds)
   is checked and timed the same way before the search starts, the fastest three timed
   again with the libraries in interleaved rounds; the run's best is the fastest of the
   search's best CUTLASS candidate and these (:meth:`GemmRunner.best`);
5. for a plain f16/bf16 problem (no epilogue), cuBLASLt's heuristic picks beyond its
   first (:mod:`~pyc_lab.kernels.tuning.lt_candidates`: eight for each description of
   the product, and a few with a wide workspace) are timed coarsely and the fastest few
   checked and timed like any candidate, then beside the libraries in interleaved
   rounds — a pick the heuristic ranks lower can be the winner, run by
   :func:`pyc_lab.matmul` as :class:`~pyc_lab.kernels.lt_tuned.TunedLt`;
6. the libraries a user would call instead are timed the same way in the same run and
   recorded as ``"baseline"`` rows: ``cublas`` (``cupy.matmul``; ``torch.matmul`` for
   bf16/tf32), ``cublaslt`` (cuBLASLt: the fused epilogue through
   :mod:`~pyc_lab.kernels.cublaslt`, or for plain f16/bf16 GEMMs through nvmath-python)
   and ``torch`` (f16, when installed). The run's winner is the fastest of the CUTLASS
   candidates and these (:attr:`TuneResult.winner
   <pyc_lab.kernels.tuning.result.TuneResult.winner>`).

Builds can come from a :class:`~pyc_lab.kernels.tuning.builds.SharedBuilds` (several
problems tuned together share one pool and build an identical kernel once).
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import PycLabError
from ...hardware.device import require_cupy
from ...profiling.timing import benchmark
from ...search import Outcome, SearchSpace, StopSearch
from ...units import gemm_flops, tflops
from ..cutlass.config import GemmConfig, problem_alignment, problem_issue
from ..cutlass.launch import CutlassGemm
from ..cutlass.nvcc import BuildResult, build_many
from ..lt_algos import LtPick
from ..lt_tuned import DTYPES as LT_DTYPES
from ..lt_tuned import TunedLt
from ..skinny import SkinnyConfig, SkinnyGemm, compile_kernels, skinny_issue
from ..skinny import candidates as skinny_candidates
from .builds import wait_for_build
from .gemm_reference import (
    TOLERANCE,
    apply_epilogue,
    as_float32,
    bias_input,
    cublaslt_baseline,
    gemm_inputs,
    lt_baseline,
    reference,
    torch_baseline,
)
from .gemm_space import config_of, gemm_space, problem_configs
from .keys import DeviceKey, Measurement, ProblemKey, device_key
from .options import GemmTuneOptions

__all__ = ["CONFIRM_ROUNDS", "CONFIRM_TOP", "GemmRunner", "candidates_for", "gpu_ms",
           "interleaved_ms", "lt_search_issue", "run_watched"]

log = logging.getLogger(__name__)

#: The fastest configurations timed again beside the libraries ...
CONFIRM_TOP = 3
#: ... in this many interleaved rounds (the medians are kept).
CONFIRM_ROUNDS = 3


def gpu_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median GPU milliseconds of ``fn``: the tuner's one way of timing."""
    timing = benchmark(fn, repeats=max(2, repeats), warmup=2, flush_l2=True, spin=True,
                       gpu=True)
    return float(timing.gpu_median_s) * 1e3


def interleaved_ms(fns: Mapping[str, Callable[[], Any]], repeats: int,
                   rounds: int = CONFIRM_ROUNDS) -> dict[str, float]:
    """Each function's median over ``rounds`` interleaved rounds of :func:`gpu_ms`: one
    timing each, taken seconds apart, would let a drift of the clocks decide close calls
    (a 6 % win at tuning measured 3 % slower in a later sweep)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(gpu_ms(fn, repeats))
    return {name: statistics.median(t) for name, t in times.items()}


def run_watched(launches: Sequence[Callable[[], Any]], cp: Any, hang_s: float) -> str:
    """Run each launch and wait at most ``hang_s`` for it to finish (on CuPy's current
    stream): a candidate that never finishes must not hang the tuner. The message when
    one did not finish (the GPU context is then unusable), else ``""``."""
    for launch in launches:
        launch()
        done = cp.cuda.Event()
        done.record()
        t0 = time.perf_counter()
        while not done.done:
            if time.perf_counter() - t0 > hang_s:
                return (f"still running after {hang_s:.0f} s; the GPU context is unusable, "
                        "tuning stopped")
            time.sleep(0.001)
    return ""


def lt_search_issue(options: GemmTuneOptions) -> str:
    """Why a tuning with these options measures no cuBLASLt picks, or ``""``."""
    from .. import cublaslt

    if not options.lt_search:
        return "lt_search=False"
    if options.epilogue.fused:
        return "cuBLASLt's picks are measured for plain GEMMs (no bias or activation)"
    if options.dtype not in LT_DTYPES:
        return f"dtype {options.dtype}: cuBLASLt's picks are measured for f16 and bf16"
    ok, why = cublaslt.status()
    return "" if ok else why


def candidates_for(m: int, n: int, k: int, options: GemmTuneOptions, cc: int, sm_count: int,
                   restrict: Callable[[GemmConfig], bool] | None = None
                   ) -> tuple[list[GemmConfig], dict[str, str]]:
    """The configurations a tuning of ``m x n x k`` builds and may evaluate: the
    problem's space (:func:`~pyc_lab.kernels.tuning.gemm_space.problem_configs`),
    ``restrict`` applied, cut to ``options.max_candidates``; and the dropped ones."""
    ranked, dropped = problem_configs(m, n, k, options.dtype, options.layout, cc, sm_count,
                                      options.epilogue, options.stream_k, options.wide)
    if restrict is not None:
        ranked = [c for c in ranked if restrict(c)]
    if options.max_candidates is not None:
        ranked = ranked[:options.max_candidates]
    return ranked, dropped


class GemmRunner:
    """Measures CUTLASS GEMM candidates for one problem on this GPU.

    Parameters
    ----------
    m, n, k
        The problem: ``a`` is M x K, ``b`` K x N.
    options
        dtype, layout, epilogue, candidate cut, repeats, workers, hang limit.
    restrict
        ``restrict(config) -> bool``: only configurations it accepts are considered.
    cache
        The kernel cache builds go to (the user's by default).
    builds
        A :class:`~pyc_lab.kernels.tuning.builds.SharedBuilds` to take builds from
        (shared with other problems); by default this runner starts its own.

    Attributes
    ----------
    problem, device
        The tuning-database keys.
    configs
        The ranked configurations the search may evaluate.
    baselines
        ``name -> ms`` of the libraries, timed in the same run.
    rows
        ``config id -> the table row`` of every candidate evaluated (the latest).

    skinny
        ``config id -> the table row`` of every skinny GEMM configuration measured.

    Raises
    ------
    PycLabError
        No GPU, a GPU that is not Hopper, a problem no kernel here can take, or every
        candidate excluded.
    """

    def __init__(self, m: int, n: int, k: int, options: GemmTuneOptions, *,
                 restrict: Callable[[GemmConfig], bool] | None = None,
                 cache: Any = None, builds: Any = None) -> None:
        cp = require_cupy("autotune_gemm")
        opts = options
        #: Builds not done by then are skipped: the budget bounds waiting for nvcc too.
        self._deadline = time.perf_counter() + opts.budget_s if opts.budget_s else None
        epi = opts.epilogue
        align = problem_alignment(m, n, k, opts.layout, opts.dtype)
        issue = (problem_issue(m, n, k, opts.layout, opts.dtype, align) if align else
                 "contiguous extents with no common alignment of 2 elements or more "
                 "(the narrowest kernels here)")
        skinny_why = ("skinny=False" if not opts.skinny else
                      "the skinny GEMM has no fused epilogue" if epi.fused else
                      skinny_issue(m, n, k, opts.dtype, opts.layout))
        skinny = [] if skinny_why else skinny_candidates(m, n, k)
        lt_why = lt_search_issue(opts)
        if not opts.cutlass and not skinny and lt_why:
            raise PycLabError(f"autotune_gemm {m}x{n}x{k} {opts.dtype} {opts.layout} with "
                              f"cutlass=False: nothing to measure ({skinny_why}; {lt_why}); "
                              "pyc_lab.matmul uses the library for it")
        if issue and not skinny and lt_why:
            raise PycLabError(f"autotune_gemm {m}x{n}x{k} {opts.layout}: {issue}; "
                              "pyc_lab.matmul uses cuBLAS for such shapes")
        device, cc, sm_count = device_key()
        if cc < 90:
            raise PycLabError(f"the CUTLASS kernels here are built for Hopper (sm_90a); this "
                              f"GPU is sm_{cc}")
        self.m, self.n, self.k = m, n, k
        self.options = opts
        self.epilogue = epi
        self.device: DeviceKey = device
        self.sm_count = sm_count
        self.problem = ProblemKey(epi.op, opts.dtype, opts.dtype, opts.dtype, opts.layout,
                                  m, n, k)
        ranked, dropped = ([], {}) if issue or not opts.cutlass else candidates_for(
            m, n, k, opts, cc, sm_count, restrict)
        if not ranked and not skinny and lt_why:
            raise PycLabError(f"no CUTLASS configuration left for {m}x{n}x{k} {opts.dtype} "
                              f"{opts.layout} after pruning ({len(dropped)} dropped) and "
                              "restrictions")
        self.configs = ranked
        self.flops = gemm_flops(m, n, k)
        self._cp = cp
        self._a, self._b, self._out = gemm_inputs(m, n, k, opts.dtype, opts.layout, opts.seed)
        ref, run_cublas, _ = reference(self._a, self._b, opts.dtype)
        self._bias = bias_input(n, opts.dtype, opts.seed + 1) if epi.bias else None
        if epi.fused:
            ref = apply_epilogue(ref, None if self._bias is None
                                 else as_float32(self._bias, opts.dtype), epi.activation)
        self._ref = ref
        self._ref_max = float(cp.abs(ref).max()) or 1.0
        lt = (cublaslt_baseline(self._a, self._b, self._bias, epi, opts.dtype) if epi.fused
              else lt_baseline(self._a, self._b, opts.dtype))
        torch_mm = torch_baseline(self._a, self._b, opts.dtype)
        self._libraries = {name: fn for name, fn in (("cublas", run_cublas), ("cublaslt", lt),
                                                     ("torch", torch_mm)) if fn is not None}
        self.baselines = {name: gpu_ms(fn, opts.repeats)
                          for name, fn in self._libraries.items()}
        self._builds: dict[GemmConfig, BuildResult] = {}
        self._futures: dict[GemmConfig, Any] = {}
        if not ranked:
            pass  # the skinny GEMM alone: nothing to build
        elif builds is None:
            self._futures = build_many(ranked, opts.dtype, opts.layout, cc, opts.workers,
                                       cache, epilogue=epi,
                                       on_done=lambda r: self._builds.__setitem__(r.config, r))
        else:
            self._futures = builds.submit(ranked, opts.dtype, opts.layout, cc, epi)
            for cfg, fut in self._futures.items():
                fut.add_done_callback(lambda f, c=cfg: None if f.cancelled()
                                      else self._builds.__setitem__(c, f.result()))
        self._loaded: dict[GemmConfig, CutlassGemm] = {}
        self.rows: dict[str, dict[str, Any]] = {}
        self._measurements: dict[str, Measurement] = {}
        self._hung: str | None = None
        self.skinny: dict[str, dict[str, Any]] = {}
        #: ``config id -> the table row`` of every cuBLASLt pick measured.
        self.lt_picks: dict[str, dict[str, Any]] = {}
        if skinny:
            self._measure_skinny(skinny)
        if not lt_why:
            self._measure_lt()

    def _measure_skinny(self, configs: list[SkinnyConfig]) -> None:
        """Check and time every skinny GEMM configuration (before the search: they need
        no build, and the search's budget is the CUTLASS candidates')."""
        cp = self._cp
        failed = compile_kernels(self.options.dtype, self.m, configs)
        stream = cp.cuda.get_current_stream()
        launches: dict[str, tuple[SkinnyConfig, Callable[[], Any]]] = {}
        for cfg in configs:
            if self._hung is not None:
                break
            if cfg.id in failed:
                self._record(cfg.id, cfg.to_dict(), "compile_error", message=failed[cfg.id])
                continue
            gemm = SkinnyGemm(cfg, self.options.dtype)
            status, ms, err, msg = self._check_and_time(
                lambda g=gemm: g(self._a, self._b, self._out), lambda g=gemm: g.launch(stream),
                cfg.id, self.options.repeats)
            self._record(cfg.id, cfg.to_dict(), status, ms, err, msg)
            self.skinny[cfg.id] = self.rows[cfg.id]
            if status == "ok":
                launches[cfg.id] = (cfg, lambda g=gemm: g.launch(stream))
        self._confirm(launches, self.skinny)

    def _measure_lt(self) -> None:
        """Time cuBLASLt's heuristic picks coarsely, then check and time the fastest few
        like any candidate."""
        from .lt_candidates import search

        cp = self._cp
        try:
            found = search(self._a, self._b, self._out, LT_DTYPES[self.options.dtype])
        except Exception as exc:  # the search is a candidate source: never fatal
            log.warning("cuBLASLt search for %dx%dx%d failed: %s", self.m, self.n, self.k,
                        exc)
            return
        stream = cp.cuda.get_current_stream()
        launches: dict[str, tuple[LtPick, Callable[[], Any]]] = {}
        for pick in found:
            if self._hung is not None:
                break
            kernel = TunedLt(pick, self.options.dtype)
            run = functools.partial(kernel, self._a, self._b, self._out, stream=stream)
            status, ms, err, msg = self._check_and_time(run, run, pick.id,
                                                        self.options.repeats)
            self._record(pick.id, pick.to_dict(), status, ms, err, msg)
            self.lt_picks[pick.id] = self.rows[pick.id]
            if status == "ok":
                launches[pick.id] = (pick, run)
        self._confirm(launches, self.lt_picks)

    def _confirm(self, launches: dict[str, tuple[Any, Callable[[], Any]]],
                 table: dict[str, dict[str, Any]]) -> None:
        """Time the :data:`CONFIRM_TOP` fastest of ``launches`` (skinny configurations or
        cuBLASLt picks) and the libraries again (:func:`interleaved_ms`), keep the
        medians of the rounds and note the rows in ``table``."""
        ok = sorted((self._measurements[cid].time_ms, cid) for cid in launches)
        top = [cid for _ms, cid in ok[:CONFIRM_TOP]]
        if not top:
            return
        ms = interleaved_ms({**{cid: launches[cid][1] for cid in top}, **self._libraries},
                            self.options.repeats)
        for name in self._libraries:
            self.baselines[name] = ms[name]
        for cid in top:
            m = self._measurements[cid]
            self._record(cid, launches[cid][0].to_dict(), "ok", ms[cid], m.error, m.message)
            table[cid] = self.rows[cid]

    def _check_and_time(self, first: Callable[[], Any], again: Callable[[], Any], name: str,
                        repeats: int) -> tuple[str, float | None, float | None, str]:
        """Run a candidate twice into a NaN-poisoned output, each launch watched for a
        hang; check it against the reference; time the correct ones.

        Returns
        -------
        status, ms, error, message
        """
        cp = self._cp
        try:
            self._out.view(cp.uint16).fill(0x7FFF)  # NaN in both f16 and bf16
            # two launches, each watched: a kernel that never finishes (the first launch,
            # or a later one, as a split kernel whose counters are not reset would) must
            # not hang the tuner
            hung = run_watched((first, again), self._cp, self.options.hang_s)
            if hung:
                self._hung = name
                return "timeout", None, None, hung
        except Exception as exc:
            return "wrong_result", None, None, f"{type(exc).__name__}: {exc}"
        got = as_float32(self._out, self.options.dtype)
        if not bool(cp.isfinite(got).all()):
            return "nan", None, None, "NaN or Inf in the output"
        err = float(cp.abs(got - self._ref).max()) / self._ref_max
        tol = TOLERANCE[self.options.dtype]
        if err > tol:
            return "wrong_result", None, err, f"max error {err:.3g} > {tol} vs cuBLAS"
        return "ok", gpu_ms(again, repeats), err, ""

    def best(self, searched: Measurement | None) -> Measurement | None:
        """The run's best: the fastest correct of the search's best CUTLASS measurement
        the skinny GEMM's and the cuBLASLt picks' (``None`` when nothing was correct)."""
        pool = [searched] if searched is not None and searched.ok else []
        pool += [m for cid, m in self._measurements.items()
                 if (cid in self.skinny or cid in self.lt_picks) and m.ok]
        return min(pool, key=lambda m: m.time_ms) if pool else searched

    # -- the runner protocol ----------------------------------------------------------
    def space(self) -> SearchSpace:
        """The ranked configurations as a search space."""
        return gemm_space(self.configs)

    def evaluate(self, candidate: Mapping[str, Any], fidelity: int) -> Outcome:
        """Build (wait for), run twice, check and time one configuration."""
        if self._hung is not None:
            raise StopSearch(f"{self._hung} hung; the GPU context is unusable")
        cp = self._cp
        cfg = config_of(candidate)
        res = wait_for_build(self._futures[cfg], self._deadline)
        if res is None:
            return self._finish(cfg, "skipped", message="its build did not finish within "
                                "the tuning budget")
        if not res.ok:
            return self._finish(cfg, "compile_error", message=res.message)
        try:
            gemm = self._loaded.get(cfg) or CutlassGemm(res.library, cfg, self.options.dtype,
                                                        self.options.layout, self.sm_count,
                                                        self.epilogue)
            self._loaded[cfg] = gemm
            if not gemm.can_implement(self.m, self.n, self.k):
                return self._finish(cfg, "skipped", message="can_implement refused the problem")
        except Exception as exc:
            return self._finish(cfg, "wrong_result", message=f"{type(exc).__name__}: {exc}")
        stream = cp.cuda.get_current_stream().ptr
        status, ms, err, msg = self._check_and_time(
            lambda: gemm(self._a, self._b, self._out, bias=self._bias),
            lambda: gemm.launch(stream), cfg.id, fidelity)
        return self._finish(cfg, status, ms, err, msg)

    # -- what was measured ------------------------------------------------------------
    def _finish(self, cfg: GemmConfig, status: str, ms: float | None = None,
                error: float | None = None, message: str = "") -> Outcome:
        res = self._builds.get(cfg)
        row = self._record(cfg.id, cfg.to_dict(), status, ms, error, message,
                           build_s=round(res.seconds, 1) if res else None,
                           build=res.status if res else None)
        details = {**row, "built": len(self._builds), "total": len(self.configs)}
        return Outcome(status, ms, message, details)

    def _record(self, config_id: str, config: dict[str, Any], status: str,
                ms: float | None = None, error: float | None = None, message: str = "",
                build_s: float | None = None, build: str | None = None) -> dict[str, Any]:
        """Keep one candidate's table row and measurement (the latest evaluation)."""
        rate = tflops(self.flops, ms)
        row = {"config": config_id, "status": status, "ms": ms, "tflops": rate,
               "error": error, "build_s": build_s, "build": build,
               "message": message[:500], **config}
        self.rows[config_id] = row
        self._measurements[config_id] = Measurement(config, status, ms, rate, error, message)
        return row

    def measurement(self, candidate: Mapping[str, Any]) -> Measurement | None:
        """The recorded measurement of a candidate (its latest evaluation)."""
        return self._measurements.get(config_of(candidate).id)

    def measurements(self) -> list[Measurement]:
        """Every candidate measured, plus builds that failed without being measured, and
        the baselines as ``"baseline"`` rows: what goes to the tuning database."""
        for cfg, fut in self._futures.items():
            if cfg.id not in self.rows and fut.done() and not fut.result().ok:
                self._finish(cfg, "compile_error", message=fut.result().message)
        return [*self._measurements.values(), *(
            Measurement({"baseline": name}, "baseline", ms, tflops(self.flops, ms))
            for name, ms in self.baselines.items())]
