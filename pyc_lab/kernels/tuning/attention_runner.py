"""The live attention runner: pyc_lab's Hopper kernel built, checked and timed against SDPA.

For one forward problem (B, Hq, Hkv, Sq, Sk, D; causal or not) in f16 or bf16 on this
machine's GPU:

1. the candidates — :func:`~pyc_lab.kernels.cutlass.attention.attention_configs`, cut
   to ``max_candidates`` — are built in parallel into the kernel cache (a kernel depends
   on the dtype and head dimension only, so every problem of a model shares them);
2. each runs on standard-normal operands into a NaN-poisoned output and log-sum-exp,
   twice, each launch watched for a hang, and is compared with a float32 reference
   (float32 products, float64 softmax); NaN or an error above the dtype's tolerance
   rejects it, with the reason;
3. correct ones are timed with the tuner's one timing
   (:func:`~pyc_lab.kernels.tuning.gemm_runner.gpu_ms`: CUDA events, L2 flushed);
4. torch's SDPA is timed the same way in the same run — its default choice (cuDNN on
   the H200) and each backend forced — and recorded as baseline rows (``"sdpa"``,
   ``"sdpa_cudnn"``, ``"sdpa_flash"``, ``"sdpa_efficient"``).

Needs CuPy and torch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...errors import PycLabError
from ...hardware.device import require_cupy
from ...search import Outcome
from ..arrays import torch_stream
from ..attention_sm90 import attention_problem_key, geometry_of, run_fused
from ..cutlass.attention import (
    AttnConfig,
    AttnKernel,
    FusedAttention,
    attention_configs,
    build_attention_many,
)
from ..cutlass.nvcc import BuildResult
from .gemm_runner import gpu_ms, run_watched
from .kernel_rows import CandidateRows
from .keys import DeviceKey, device_key
from .options import GemmTuneOptions

__all__ = ["AttentionProblem", "AttentionRunner"]

log = logging.getLogger(__name__)

#: Largest error against the float32 reference, relative to the largest output: P is
#: rounded to the 16-bit type before P V, as in every fused attention kernel.
TOLERANCE = {"f16": 4e-3, "bf16": 2.5e-2}
#: SDPA's backends timed as baselines (torch's names).
BACKENDS = {"sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_flash": "FLASH_ATTENTION",
            "sdpa_efficient": "EFFICIENT_ATTENTION"}


class AttentionProblem:
    """An attention forward problem: ``(B, Hq, Hkv, Sq, Sk, D)``, causal or not."""

    def __init__(self, batch: int, heads: int, len_q: int, head_dim: int, *,
                 len_k: int | None = None, heads_kv: int | None = None,
                 causal: bool = False) -> None:
        self.batch, self.heads_q = int(batch), int(heads)
        self.heads_kv = int(heads_kv if heads_kv is not None else heads)
        self.len_q = int(len_q)
        self.len_k = int(len_k if len_k is not None else len_q)
        self.head_dim, self.causal = int(head_dim), bool(causal)
        if min(self.batch, self.heads_q, self.heads_kv, self.len_q, self.len_k) < 1:
            raise PycLabError(f"autotune_attention: sizes must be positive: {self}")
        if self.heads_q % self.heads_kv:
            raise PycLabError(f"autotune_attention: {self.heads_q} query heads are not a "
                              f"multiple of {self.heads_kv} key/value heads")

    def __repr__(self) -> str:
        kv = f"/{self.heads_kv}" if self.heads_kv != self.heads_q else ""
        return (f"attention B{self.batch} H{self.heads_q}{kv} Sq{self.len_q} Sk{self.len_k} "
                f"D{self.head_dim}{' causal' if self.causal else ''}")


class AttentionRunner(CandidateRows):
    """Measures pyc_lab's attention kernel configurations for one problem on this GPU.

    Parameters
    ----------
    problem
        The sizes and causality.
    options
        dtype (``f16`` or ``bf16``), candidate cut, repeats, workers, hang limit, seed
        (a :class:`~pyc_lab.kernels.tuning.options.GemmTuneOptions`).
    restrict
        ``restrict(config) -> bool``: only configurations it accepts are considered.
    cache
        The kernel cache builds go to (the user's by default).

    Raises
    ------
    PycLabError
        No GPU or torch, a GPU that is not Hopper, a dtype or head dimension the kernel
        does not take.
    """

    def __init__(self, problem: AttentionProblem, options: GemmTuneOptions, *,
                 restrict: Callable[[AttnConfig], bool] | None = None,
                 cache: Any = None) -> None:
        cp = require_cupy("autotune_attention")
        try:
            import torch
        except ImportError:
            raise PycLabError("autotune_attention needs torch: its SDPA is the baseline "
                              "and the float32 reference") from None
        opts = options
        if opts.dtype not in ("f16", "bf16"):
            raise PycLabError(f"autotune_attention: dtype {opts.dtype!r}; the kernel takes "
                              "f16 or bf16")
        kernel = AttnKernel(opts.dtype, problem.head_dim)
        device, cc, _ = device_key()
        if cc < 90:
            raise PycLabError(f"pyc_lab's attention kernel is built for Hopper (sm_90a); this "
                              f"GPU is sm_{cc}")
        self._deadline = time.perf_counter() + opts.budget_s if opts.budget_s else None
        self.attn, self.kernel, self.options = problem, kernel, opts
        self.device: DeviceKey = device
        ranked = attention_configs(kernel, problem.causal)
        if restrict is not None:
            ranked = [c for c in ranked if restrict(c)]
        if not ranked:
            raise PycLabError(f"autotune_attention {problem}: every configuration excluded")
        if opts.max_candidates is not None:
            ranked = ranked[:opts.max_candidates]
        self.configs = ranked
        self.config_type = AttnConfig
        self._cp, self._torch = cp, torch
        self._make_inputs(opts.seed)
        self.flops = self.geometry.flops
        self.problem = attention_problem_key(self.geometry, opts.dtype)
        self._libraries = {"sdpa": self._sdpa(None),
                           **{name: self._sdpa(b) for name, b in BACKENDS.items()}}
        self.baselines = self._time_sdpa(opts.repeats)
        self._builds: dict[AttnConfig, BuildResult] = {}
        self._futures = build_attention_many(
            ranked, kernel, cc, opts.workers, cache,
            on_done=lambda r: self._builds.__setitem__(r.config, r))
        self._loaded: dict[AttnConfig, FusedAttention] = {}
        self._init_rows()
        self._hung: str | None = None

    def _make_inputs(self, seed: int) -> None:
        torch = self._torch
        p = self.attn
        dt = {"f16": torch.float16, "bf16": torch.bfloat16}[self.kernel.dtype]
        gen = torch.Generator(device="cuda").manual_seed(seed)

        def normal(h: int, s: int) -> Any:
            return torch.randn((p.batch, h, s, p.head_dim), generator=gen,
                               device="cuda").to(dt)

        self._q, self._k, self._v = normal(p.heads_q, p.len_q), normal(p.heads_kv, p.len_k), \
            normal(p.heads_kv, p.len_k)
        self._o = torch.empty_like(self._q)
        self._lse = torch.empty((p.batch, p.heads_q, p.len_q), device="cuda",
                                dtype=torch.float32)
        self.scale = p.head_dim ** -0.5
        self.geometry = geometry_of(self._q, self._k, self._v, self._o, p.causal, self.scale)
        g = p.heads_q // p.heads_kv
        ref = torch.empty_like(self._q, dtype=torch.float32)
        # one (batch, head, block of query rows) at a time: the float64 scores stay
        # under 256 MiB whatever the sequence lengths
        rows = max(1, (1 << 25) // p.len_k)
        for b in range(p.batch):
            for h in range(p.heads_q):
                kh = self._k[b, h // g].float()
                vh = self._v[b, h // g].double()
                for r0 in range(0, p.len_q, rows):
                    r1 = min(p.len_q, r0 + rows)
                    s = (self._q[b, h, r0:r1].float() @ kh.T).double() * self.scale
                    if p.causal:
                        i = torch.arange(r0, r1, device="cuda")[:, None]
                        j = torch.arange(p.len_k, device="cuda")[None, :]
                        s = s.masked_fill(j > i, float("-inf"))
                    ref[b, h, r0:r1] = (torch.softmax(s, dim=-1) @ vh).float()
                    del s
        self._ref = ref
        self._ref_max = float(ref.abs().max()) or 1.0

    def _sdpa(self, backend: str | None) -> Callable[[], Any]:
        torch = self._torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        sdpa = torch.nn.functional.scaled_dot_product_attention
        q, k, v, causal = self._q, self._k, self._v, self.attn.causal
        gqa = self.attn.heads_q != self.attn.heads_kv

        def run() -> Any:
            if backend is None:
                return sdpa(q, k, v, is_causal=causal, scale=self.scale, enable_gqa=gqa)
            with sdpa_kernel(getattr(SDPBackend, backend)):
                return sdpa(q, k, v, is_causal=causal, scale=self.scale, enable_gqa=gqa)

        return run

    def _time_sdpa(self, repeats: int) -> dict[str, float]:
        """Time SDPA's default and each backend; a backend that refuses the shape is no
        baseline (and leaves :attr:`_libraries`)."""
        times = {}
        for name, run in list(self._libraries.items()):
            try:
                times[name] = gpu_ms(run, repeats)
            except Exception as exc:
                if name == "sdpa":
                    raise
                log.info("SDPA backend %s refused %s: %s", BACKENDS[name], self.attn, exc)
                del self._libraries[name]
        return times

    # -- the runner protocol (space() comes from CandidateRows) -----------------------
    def evaluate(self, candidate: Mapping[str, Any], fidelity: int) -> Outcome:
        """Build (wait for), run twice, check and time one configuration."""
        cfg = AttnConfig.from_dict(dict(candidate))
        library, outcome = self._library_of(cfg)
        if outcome is not None:
            return outcome
        try:
            attn = self._loaded.get(cfg) or FusedAttention(library, cfg, self.kernel)
            self._loaded[cfg] = attn
        except Exception as exc:
            return self._finish(cfg, "wrong_result", message=f"{type(exc).__name__}: {exc}")

        def checked() -> None:
            run_fused(attn, self.geometry, self._q, self._k, self._v, self._o, self._lse)

        def timed() -> None:  # as pl.attention runs it: no log-sum-exp
            run_fused(attn, self.geometry, self._q, self._k, self._v, self._o)

        status, ms, err, msg = self._check_and_time(checked, timed, cfg.id, fidelity)
        if status == "ok":
            self._launches[cfg.id] = (cfg, timed)
        return self._finish(cfg, status, ms, err, msg)

    def _check_and_time(self, launch: Callable[[], None], timed: Callable[[], None],
                        name: str, repeats: int
                        ) -> tuple[str, float | None, float | None, str]:
        torch = self._torch
        try:
            self._o.fill_(float("nan"))
            self._lse.fill_(float("nan"))
            with torch_stream(torch.cuda.current_device()):
                hung = run_watched((launch, launch), self._cp, self.options.hang_s)
            if hung:
                self._hung = name
                return "timeout", None, None, hung
        except Exception as exc:
            return "wrong_result", None, None, f"{type(exc).__name__}: {exc}"
        got = self._o.float()
        if not bool(torch.isfinite(got).all()) or not bool(torch.isfinite(self._lse).all()):
            return "nan", None, None, "NaN or Inf in the output or log-sum-exp"
        err = float((got - self._ref).abs().max()) / self._ref_max
        tol = TOLERANCE[self.kernel.dtype]
        if err > tol:
            return "wrong_result", None, err, f"max error {err:.3g} > {tol} vs float32"
        return "ok", gpu_ms(timed, repeats), err, ""
