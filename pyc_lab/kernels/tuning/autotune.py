"""``autotune_gemm``: build, check and time CUTLASS candidates for one problem on this GPU.

Steps, for ``M x N x K`` in a dtype and layout:

1. the candidate space — :func:`~.cutlass_gemm.configurations`, pruned for the problem
   and ranked by the cheap model; user restrictions (``restrict``) and
   ``max_candidates`` cut it to the configurations worth building;
2. those are built in parallel (``workers`` nvcc processes) into the kernel cache,
   best-ranked first, while the search strategy measures the ones already built;
3. each candidate runs on inputs uniform in [-1, 1]; its output is compared with
   cuBLAS's (``cupy.matmul``) and a NaN/Inf or an error above the dtype's tolerance
   rejects it, with the reason; correct ones are timed with CUDA events after a warm-up,
   with the L2 cache flushed before every timed launch (median of ``fidelity`` runs);
4. every candidate — built, failed or rejected — is recorded in the tuning database,
   the fastest correct one as the winner; cuBLAS is timed the same way in the same run.

The result is a :class:`TuneResult`: ``.best``, ``.table`` (a DataFrame) and
``.compare()`` (tuned CUTLASS vs cuBLAS vs torch.matmul when torch is installed).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ...errors import PycLabError
from ...search import Budget, Outcome, SearchSpace, StopSearch, Trial, get_strategy
from ..cutlass import gemm as cg
from .database import DeviceKey, Measurement, ProblemKey, TuningDB

__all__ = ["DENSE_PEAK_TFLOPS", "PEAK_FRACTION", "TOLERANCE", "TuneResult", "apply_epilogue",
           "as_float32", "autotune_gemm", "bias_input", "device_key", "gemm_inputs",
           "peak_tflops", "reference", "time_gpu"]

log = logging.getLogger(__name__)

#: Max |cutlass - reference| / max |reference| accepted, per dtype (all accumulate in
#: float32; they differ by the rounding of the output and operands and the summation
#: order; the reference is cuBLAS in float32 for tf32 and f32).
TOLERANCE = {"f16": 5e-3, "bf16": 3e-2, "tf32": 5e-3, "f32": 1e-4}
#: Dense (no sparsity) fp16/bf16 tensor-core peaks by GPU name, TFLOP/s.
DENSE_PEAK_TFLOPS = {"H200": 989.4, "H100 SXM": 989.4, "H100 80GB HBM3": 989.4,
                     "H100 PCIe": 756.5, "H100 NVL": 835.0}
#: Other dtypes' dense peaks relative to fp16 on Hopper: TF32 tensor cores run at half
#: the fp16 rate; float32 on the CUDA cores at 67 of 989 TFLOP/s (H100/H200 SXM).
PEAK_FRACTION = {"f16": 1.0, "bf16": 1.0, "tf32": 0.5, "f32": 66.9 / 989.4}


def peak_tflops(gpu_name: str, dtype: str = "f16") -> float | None:
    """The dense peak of a GPU (by part of its name) for ``dtype``, or None if unknown."""
    for key, value in DENSE_PEAK_TFLOPS.items():
        if key in gpu_name:
            return value * PEAK_FRACTION.get(dtype, 1.0)
    return None


@lru_cache(maxsize=8)
def device_key(index: int = 0) -> tuple[DeviceKey, int, int]:
    """This machine's GPU ``index``: its tuning-database key, compute capability as an
    int (90) and SM count (detected once per process)."""
    from ...hardware import detect_hardware

    hw = detect_hardware()
    gpu = next((g for g in hw.gpus if g.index == index), None)
    if gpu is None:
        raise PycLabError(f"no GPU {index} on this machine: autotuning needs a CUDA device")
    cc = int(str(gpu.compute_capability).replace(".", "") or 0)
    return DeviceKey.from_profile(hw, index), cc, int(gpu.sm_count or 132)


def _cast(cp: Any, x: Any, dtype: str) -> Any:
    if dtype == "bf16":
        return _to_bf16_bits(cp, x)
    return x.astype(cp.float16) if dtype == "f16" else x


def gemm_inputs(m: int, n: int, k: int, dtype: str, layout: str, seed: int = 0) -> tuple:
    """CuPy ``a`` (M x K), ``b`` (K x N) in ``layout``'s memory order, uniform in
    [-1, 1], and a C-contiguous ``out`` poisoned with NaN.

    CuPy has no bfloat16 arrays: bf16 operands are ``int16`` arrays holding the bf16 bit
    patterns (rounded to nearest even from float32); :func:`as_float32` reads them back.
    ``tf32`` and ``f32`` operands are float32.
    """
    import cupy as cp

    rng = cp.random.default_rng(seed)

    def mat(rows: int, cols: int, order: str) -> Any:
        shape = (rows, cols) if order == "t" else (cols, rows)
        x = _cast(cp, rng.uniform(-1, 1, shape, dtype=cp.float32), dtype)
        return x if order == "t" else x.T

    a = mat(m, k, layout[0])
    b = mat(k, n, layout[1])
    out = _cast(cp, cp.full((m, n), cp.nan, dtype=cp.float32), dtype)
    return a, b, out


def bias_input(n: int, dtype: str, seed: int = 1) -> Any:
    """A bias row of length ``n`` uniform in [-1, 1] in ``dtype`` (bf16 as bits)."""
    import cupy as cp

    return _cast(cp, cp.random.default_rng(seed).uniform(-1, 1, n, dtype=cp.float32), dtype)


def apply_epilogue(y: Any, bias: Any, activation: str | None) -> Any:
    """``act(y + bias)`` in float32 on CuPy arrays: the fused epilogue's reference."""
    import cupy as cp

    if bias is not None:
        y = y + bias
    if activation == "relu":
        y = cp.maximum(y, 0)
    elif activation == "gelu":
        y = 0.5 * y * (1 + cp.tanh(0.7978845608028654 * (y + 0.044715 * y ** 3)))
    elif activation == "silu":
        y = y / (1 + cp.exp(-y))
    return y


def _to_bf16_bits(cp: Any, x: Any) -> Any:
    u = cp.ascontiguousarray(x).view(cp.uint32)
    rounded = (u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16
    rounded = cp.where(cp.isnan(x), cp.uint32(0x7FC0), rounded)  # keep NaN a NaN
    return rounded.astype(cp.uint16).view(cp.int16)


def as_float32(x: Any, dtype: str) -> Any:
    """A CuPy float32 copy of an f16 array or of bf16 bits (see :func:`gemm_inputs`)."""
    import cupy as cp

    if dtype != "bf16":
        return x.astype(cp.float32)
    return (cp.ascontiguousarray(x).view(cp.uint16).astype(cp.uint32) << 16).view(cp.float32)


def reference(a: Any, b: Any, dtype: str) -> tuple[Any, Callable[[], Any], str]:
    """cuBLAS's ``a @ b`` as float32, a zero-argument call that runs cuBLAS again (for
    timing) and its name: ``cupy.matmul`` for f16 and f32; ``torch.matmul`` for bf16
    (CuPy has no bfloat16; torch's matmul is cuBLAS too) and for tf32 (cuBLAS's TF32
    mode, ``allow_tf32``; the reference values are still float32 ones from CuPy)."""
    import cupy as cp

    if dtype in ("f16", "f32"):
        out = cp.matmul(a, b)
        return out.astype(cp.float32), lambda: cp.matmul(a, b, out=out), "cublas"
    if dtype == "tf32":
        ref = cp.matmul(a, b)
        try:
            import torch
        except ImportError:
            log.info("torch is not installed: the tf32 baseline is cuBLAS in float32")
            out = ref.copy()
            return ref, lambda: cp.matmul(a, b, out=out), "cublas"
        ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
        tout = torch.empty((a.shape[0], b.shape[1]), device="cuda", dtype=torch.float32)

        def run_tf32() -> Any:
            flag = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                return torch.matmul(ta, tb, out=tout)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = flag

        return ref, run_tf32, "cublas"
    try:
        import torch
    except ImportError:
        raise PycLabError("bf16 tuning checks against cuBLAS through torch.matmul (CuPy has "
                          "no bfloat16); install torch or tune f16") from None
    ta = torch.as_tensor(a, device="cuda").view(torch.bfloat16)
    tb = torch.as_tensor(b, device="cuda").view(torch.bfloat16)
    ref = ta @ tb
    return cp.asarray(ref.float()), lambda: torch.matmul(ta, tb, out=ref), "cublas"


def _cublaslt_baseline(a: Any, b: Any, bias: Any, epi: cg.Epilogue,
                       dtype: str) -> Callable[[], Any] | None:
    """cuBLASLt running the same fused epilogue (f16/f32 relu/gelu), or None."""
    try:
        from ..cublaslt import FusedGemm, why_not

        if dtype == "bf16" or why_not(tuple(a.shape), tuple(b.shape), a.dtype, b.dtype,
                                      a.dtype, None if bias is None else tuple(bias.shape),
                                      None if bias is None else bias.dtype, epi.activation):
            return None
        import cupy as cp

        gemm = FusedGemm(epi.activation, has_bias=epi.bias)
        out = cp.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
        return lambda: gemm(a, b, out, bias)
    except Exception as exc:  # nvmath missing or refusing: no such baseline
        log.info("no cuBLASLt baseline: %s", exc)
        return None


_SPIN_SOURCE = r"""
extern "C" __global__ void pyc_spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
}
"""
_SPIN: list[Any] = []


def _spin(cp: Any, microseconds: float = 100.0) -> None:
    """Keep the GPU busy for ``microseconds`` (one thread spinning on ``clock64``)."""
    if not _SPIN:
        _SPIN.append(cp.RawKernel(_SPIN_SOURCE, "pyc_spin"))
    clock_khz = cp.cuda.Device().attributes.get("ClockRate", 1_980_000)
    _SPIN[0]((1,), (1,), (cp.int64(int(microseconds * clock_khz / 1000)),))


def time_gpu(fn: Callable[[], Any], repeats: int, flush: Any = None, warmup: int = 2) -> float:
    """Median milliseconds of ``fn`` over ``repeats`` CUDA-event-timed runs, the L2 cache
    flushed (``flush.fill(0)``, outside the timed interval) before each.

    A 100 us spin kernel is queued before the start event, so that the host has
    enqueued ``fn``'s launches by the time the GPU reaches the event: the interval holds
    GPU time only, not the host's launch overhead (which would otherwise dominate small
    problems, and differs between cuBLAS through CuPy, torch and a CUTLASS launch).
    """
    import cupy as cp

    for _ in range(warmup):
        fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(max(1, repeats)):
        if flush is not None:
            flush.fill(0)
        _spin(cp)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


@dataclass
class TuneResult:
    """What :func:`autotune_gemm` found.

    Attributes
    ----------
    problem, device
        The tuning-database keys.
    best
        The winning :class:`Measurement` (None when no candidate was correct).
    table
        One row per candidate: config id, status, ms, TFLOP/s, error, build seconds,
        message (pandas DataFrame).
    baselines
        ``name -> ms`` measured in the same run (``cublas``; ``torch`` when installed).
    seconds
        Wall time of the whole tuning (builds included).
    stopped_by, strategy
        Why the search ended, and how it searched.
    """

    problem: ProblemKey
    device: DeviceKey
    best: Measurement | None
    table: Any
    baselines: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    stopped_by: str = ""
    strategy: str = ""
    recorded: bool = False

    @property
    def flops(self) -> float:
        """Floating-point operations of one GEMM (2 M N K)."""
        m, n, k = self.problem.shape
        return 2.0 * m * n * k

    def compare(self) -> Any:
        """Tuned CUTLASS against the baselines: ms, TFLOP/s, fraction of dense peak and
        speed relative to cuBLAS (pandas DataFrame)."""
        import pandas as pd

        peak = peak_tflops(self.device.gpu_name, self.problem.dtype_a)
        rows = []
        entries = [("tuned CUTLASS", self.best.time_ms if self.best else None)]
        entries += [(name, ms) for name, ms in self.baselines.items()]
        ref = self.baselines.get("cublas")
        for name, ms in entries:
            tflops = self.flops / (ms * 1e-3) / 1e12 if ms else None
            rows.append({"kernel": name, "ms": ms, "tflops": tflops,
                         "pct_of_peak": 100 * tflops / peak if tflops and peak else None,
                         "vs_cublas": ref / ms if ms and ref else None})
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        best = "none"
        if self.best is not None:
            try:
                name = cg.GemmConfig.from_dict(self.best.config).id
            except PycLabError:
                name = self.best.config_id
            best = f"{name} {self.best.time_ms:.4g} ms"
        cublas = self.baselines.get("cublas")
        base = f"cublas {cublas:.4g} ms" if cublas else "no cuBLAS baseline"
        op = "" if self.problem.op == "gemm" else f" {self.problem.op}"
        return (f"TuneResult({self.problem.dtype_a} {self.problem.layout}{op} "
                f"{'x'.join(map(str, self.problem.shape))}: best {best}, "
                f"{len(self.table)} candidates, {base})")


def strategy_options(strategy: str, repeats: int, n_candidates: int) -> dict[str, Any]:
    """The options each search strategy gets from the tuner (live and replayed):
    successive halving screens at ``repeats // 9`` timed runs and refines at ``repeats``
    (eta 3); evolutionary breeds populations of up to 8 for 4 generations."""
    key = str(strategy).strip().lower().replace("-", "_")
    if key == "successive_halving":
        return {"eta": 3, "min_fidelity": max(2, repeats // 9), "max_fidelity": repeats}
    if key == "evolutionary":
        return {"fidelity": repeats, "population": min(8, n_candidates), "generations": 4}
    return {"fidelity": repeats}


def candidate_table(rows: Iterable[Mapping[str, Any]]) -> Any:
    """The candidate table as a DataFrame: correct ones by time, then the failures."""
    import pandas as pd

    table = pd.DataFrame(list(rows))
    if not table.empty:
        table = table.sort_values(["status", "ms"], key=lambda s: s.map(
            lambda v: (v != "ok") if isinstance(v, str) else v), na_position="last")
    return table.reset_index(drop=True)


def _space(configs: Sequence[cg.GemmConfig]) -> tuple[SearchSpace, dict[str, cg.GemmConfig]]:
    by_id = {c.id: c for c in configs}
    params = {
        "tile": sorted({"x".join(map(str, c.tile)) for c in configs}),
        "cluster": sorted({"x".join(map(str, c.cluster)) for c in configs}),
        "kernel_schedule": sorted({c.kernel_schedule for c in configs}),
        "epilogue_schedule": sorted({c.epilogue_schedule for c in configs}),
        "tile_scheduler": sorted({c.tile_scheduler for c in configs}),
    }
    allowed = {(("x".join(map(str, c.tile))), "x".join(map(str, c.cluster)), c.kernel_schedule,
                c.epilogue_schedule, c.tile_scheduler): c for c in configs}

    def exists(cand: Mapping[str, Any]) -> bool:
        return (cand["tile"], cand["cluster"], cand["kernel_schedule"],
                cand["epilogue_schedule"], cand["tile_scheduler"]) in allowed

    space = SearchSpace(params, restrictions=[exists])
    lookup = {cg.GemmConfig(tuple(int(x) for x in key[0].split("x")),
                            tuple(int(x) for x in key[1].split("x")), *key[2:]).id: cfg
              for key, cfg in allowed.items()}
    assert set(lookup) == set(by_id)
    return space, lookup


def _config_of(cand: Mapping[str, Any]) -> cg.GemmConfig:
    return cg.GemmConfig(tuple(int(x) for x in cand["tile"].split("x")),
                         tuple(int(x) for x in cand["cluster"].split("x")),
                         cand["kernel_schedule"], cand["epilogue_schedule"],
                         cand["tile_scheduler"])


def autotune_gemm(m: int, n: int, k: int, *, dtype: str = "bf16", layout: str = "tn",
                  strategy: str = "successive_halving", budget_s: float | None = 180.0,
                  max_candidates: int | None = 16, workers: int | None = None,
                  restrict: Callable[[cg.GemmConfig], bool] | None = None,
                  db: TuningDB | None = None, cache: Any = None, repeats: int = 20,
                  observer: Callable[[dict[str, Any]], None] | None = None,
                  stop: threading.Event | None = None, seed: int = 0,
                  hang_s: float = 20.0, bias: bool = False,
                  activation: str | None = None, stream_k: bool = False) -> TuneResult:
    """Tune a CUTLASS GEMM for ``m x n x k`` on this GPU and record the result.

    Parameters
    ----------
    m, n, k
        The problem: ``a`` is M x K, ``b`` K x N.
    dtype
        ``"f16"`` or ``"bf16"`` (tensor cores, float32 accumulation, output in the same
        dtype), ``"tf32"`` (float32 arrays, TF32 tensor cores) or ``"f32"`` (float32 on
        the CUDA cores).
    layout
        ``"tn"`` (default: ``a`` row-major, ``b`` column-major, as a linear layer's
        weight), ``"tt"``, ``"nt"`` or ``"nn"``.
    strategy
        ``"exhaustive"``, ``"random"``, ``"successive_halving"`` or ``"evolutionary"``.
    budget_s, max_candidates
        Stop starting new candidates after this many seconds; consider at most this
        many configurations (the best-ranked ones). ``None``: no limit.
    workers
        Parallel nvcc builds (default: the CPU count).
    restrict
        ``restrict(config) -> bool``: only configurations it accepts are considered.
    db, cache
        Tuning database and kernel cache (the user-cache-directory ones by default).
    repeats
        Timed runs at full fidelity (successive halving screens with fewer).
    observer
        Called with a dict per finished candidate (config, status, ms, tflops, error,
        message, built / total) — for progress bars and live charts.
    stop
        Set it to stop after the candidate being measured (a Stop button).
    hang_s
        A candidate whose first run has not finished after this many seconds is
        recorded as ``"timeout"`` and the search stops (a hung kernel holds the GPU).
    bias, activation
        Tune kernels with this fused epilogue, ``act(a @ b + bias)`` (bias: a length-N
        row; activation ``"relu"``, ``"gelu"`` or ``"silu"``), recorded under the op
        ``gemm_<epilogue>`` (what :func:`pyc_lab.matmul` and the compiler look up).
    stream_k
        Include Stream-K tile-scheduler candidates (off by default: one hung the H200;
        see :func:`~.cutlass_gemm.prune`).

    Raises
    ------
    PycLabError
        No GPU, no nvcc or nvidia-cutlass, a problem no kernel here can take, or every
        candidate excluded.
    """
    import cupy as cp

    from ...hardware.device import require_cupy

    require_cupy("autotune_gemm")
    cg._check(dtype, layout)
    epi = cg.Epilogue(bool(bias), activation)
    issue = cg.problem_issue(m, n, k, layout, dtype)
    if issue:
        raise PycLabError(f"autotune_gemm {m}x{n}x{k} {layout}: {issue}; pyc_lab.matmul "
                          "uses cuBLAS for such shapes")
    t_start = time.perf_counter()
    device, cc, sm_count = device_key()
    if cc < 90:
        raise PycLabError(f"the CUTLASS kernels here are built for Hopper (sm_90a); this "
                          f"GPU is sm_{cc}")
    problem = ProblemKey(epi.op, dtype, dtype, dtype, layout, m, n, k)
    db = db if db is not None else TuningDB()
    configs = cg.configurations(dtype, layout, cc)
    kept, dropped = cg.prune(configs, m, n, k, layout, dtype, epi, stream_k)
    if restrict is not None:
        kept = [c for c in kept if restrict(c)]
    ranked = cg.rank(kept, m, n, k, sm_count)
    if max_candidates is not None:
        ranked = ranked[:max_candidates]
    if not ranked:
        raise PycLabError(f"no CUTLASS configuration left for {m}x{n}x{k} {dtype} {layout} "
                          f"after pruning ({len(dropped)} dropped) and restrictions")

    a, b, out = gemm_inputs(m, n, k, dtype, layout, seed)
    ref, run_cublas, _ = reference(a, b, dtype)
    bias_arr = bias_input(n, dtype, seed + 1) if epi.bias else None
    if epi.fused:
        ref = apply_epilogue(ref, None if bias_arr is None else as_float32(bias_arr, dtype),
                             epi.activation)
    ref_max = float(cp.abs(ref).max()) or 1.0
    flush = cp.empty(256 << 20, dtype=cp.uint8)  # 256 MiB > the H200's 50 MiB L2
    flops = 2.0 * m * n * k
    baselines = {"cublas": time_gpu(run_cublas, repeats, flush)}
    if epi.fused:
        lt = _cublaslt_baseline(a, b, bias_arr, epi, dtype)
        if lt is not None:
            baselines["cublaslt"] = time_gpu(lt, repeats, flush)
    if dtype == "f16":
        try:
            import torch

            ta = torch.as_tensor(a, device="cuda")
            tb = torch.as_tensor(b, device="cuda")
            baselines["torch"] = time_gpu(lambda: ta @ tb, repeats, flush)
        except Exception as exc:
            log.debug("torch baseline skipped: %s", exc)

    builds: dict[cg.GemmConfig, cg.BuildResult] = {}
    futures = cg.build_many(ranked, dtype, layout, cc, workers, cache,
                            on_done=lambda r: builds.__setitem__(r.config, r), epilogue=epi)
    loaded: dict[cg.GemmConfig, cg.CutlassGemm] = {}
    rows: dict[str, dict[str, Any]] = {}
    measurements: dict[str, Measurement] = {}

    def finish(cfg: cg.GemmConfig, status: str, ms: float | None = None,
               error: float | None = None, message: str = "") -> Outcome:
        tflops = flops / (ms * 1e-3) / 1e12 if ms else None
        res = builds.get(cfg)
        row = {"config": cfg.id, "status": status, "ms": ms, "tflops": tflops,
               "error": error, "build_s": round(res.seconds, 1) if res else None,
               "build": res.status if res else None, "message": message[:500],
               **cfg.to_dict()}
        rows[cfg.id] = row
        measurements[cfg.id] = Measurement(cfg.to_dict(), status, ms, tflops, error, message)
        if observer is not None:
            try:
                observer({**row, "built": len(builds), "total": len(ranked)})
            except Exception:
                log.exception("autotune observer failed")
        return Outcome(status, ms, message)

    def evaluate(cand: Mapping[str, Any], fidelity: int) -> Outcome:
        if stop is not None and stop.is_set():
            raise StopSearch("stopped")
        cfg = _config_of(cand)
        res = futures[cfg].result()
        if not res.ok:
            return finish(cfg, "compile_error", message=res.message)
        try:
            gemm = loaded.get(cfg) or cg.CutlassGemm(res.library, cfg, dtype, layout, sm_count,
                                                     epi)
            loaded[cfg] = gemm
            if not gemm.can_implement(m, n, k):
                return finish(cfg, "skipped", message="can_implement refused the problem")
            out.view(cp.uint16).fill(0x7FFF)  # NaN in both f16 and bf16
            # two launches, each watched: a kernel that never finishes (the first launch,
            # or a later one, as Stream-K did when its workspace was not reset) must not
            # hang the tuner
            for launch in (lambda: gemm(a, b, out, bias=bias_arr),
                           lambda: gemm.launch(cp.cuda.get_current_stream().ptr)):
                launch()
                done = cp.cuda.Event()
                done.record()
                t0 = time.perf_counter()
                while not done.done:
                    if time.perf_counter() - t0 > hang_s:
                        finish(cfg, "timeout", message=f"still running after {hang_s:.0f} "
                                                       "s; the GPU context is unusable, "
                                                       "tuning stopped")
                        raise StopSearch(f"{cfg.id} hung")
                    time.sleep(0.001)
        except StopSearch:
            raise
        except Exception as exc:
            return finish(cfg, "wrong_result", message=f"{type(exc).__name__}: {exc}")
        got = as_float32(out, dtype)
        if not bool(cp.isfinite(got).all()):
            return finish(cfg, "nan", message="NaN or Inf in the output")
        err = float(cp.abs(got - ref).max()) / ref_max
        if err > TOLERANCE[dtype]:
            return finish(cfg, "wrong_result", error=err,
                          message=f"max error {err:.3g} > {TOLERANCE[dtype]} vs cuBLAS")
        stream = cp.cuda.get_current_stream().ptr
        ms = time_gpu(lambda: gemm.launch(stream), max(2, fidelity), flush)
        return finish(cfg, "ok", ms, err)

    space, _ = _space(ranked)
    search = get_strategy(strategy, **strategy_options(strategy, repeats, len(ranked)))
    result = search.run(space, evaluate, Budget(max_seconds=budget_s), rng=seed)

    # record everything measured (and every build that failed without being measured)
    for cfg, fut in futures.items():
        if cfg.id not in rows and fut.done() and not fut.result().ok:
            finish(cfg, "compile_error", message=fut.result().message)
    best_trial: Trial | None = result.best
    best = measurements.get(_config_of(best_trial.candidate).id) if best_trial else None
    recorded = False
    try:
        db.record_many(device, problem, [*measurements.values(), *(
            Measurement({"baseline": name}, "baseline", ms, flops / (ms * 1e-3) / 1e12)
            for name, ms in baselines.items())])
        if best is not None:
            db.set_winner(device, problem, best.config_id)
        recorded = True
        from ..matmul import forget

        forget()  # pl.matmul and the compiler look again
    except Exception as exc:
        log.warning("could not record the tuning in %s: %s", getattr(db, "path", db), exc)
    return TuneResult(problem, device, best, candidate_table(rows.values()), baselines,
                      time.perf_counter() - t_start, result.stopped_by, strategy, recorded)
