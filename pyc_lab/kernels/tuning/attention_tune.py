"""``autotune_attention``: tune pyc_lab's Hopper attention kernel for one problem, against
torch's SDPA.

The candidates of :class:`~pyc_lab.kernels.tuning.attention_runner.AttentionRunner` go
through the shared :class:`~pyc_lab.search.session.TuningSession` (strategy, budget,
seed and observers as for GEMMs); every candidate, SDPA's baselines of the same run and
the winner go to the tuning database under the problem's (dtype, head dimension, causal,
sizes) key, where ``pl.attention`` finds the winner for every problem within a factor
of 2 of it (the sequence bucket) and races it against SDPA on the first call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..cutlass.attention import AttnConfig
from .attention_runner import AttentionProblem, AttentionRunner
from .autotune import tune_runner
from .database import TuningDB
from .options import GemmTuneOptions
from .result import TuneResult

__all__ = ["autotune_attention"]

#: What an attention tuning changes from the GEMM tuning's defaults: a small ranked
#: space, searched in rank order.
ATTN_DEFAULTS = {"strategy": "exhaustive", "max_candidates": 6, "dtype": "bf16"}


def autotune_attention(batch: int, heads: int, seq_len: int, head_dim: int, *,
                       seq_len_k: int | None = None, heads_kv: int | None = None,
                       causal: bool = False, options: GemmTuneOptions | None = None,
                       restrict: Callable[[AttnConfig], bool] | None = None,
                       db: TuningDB | None = None, cache: Any = None,
                       observer: Callable[[dict[str, Any]], None] | None = None,
                       stop: threading.Event | None = None, **settings: Any) -> TuneResult:
    """Tune the attention forward for one problem on this GPU and record the result.

    Parameters
    ----------
    batch, heads, seq_len, head_dim
        ``(B, Hq, Sq, D)`` of the queries; ``D`` 64 or 128.
    seq_len_k, heads_kv
        Key/value length and heads (default: ``seq_len`` and ``heads``; fewer heads is
        grouped-query attention).
    causal
        Top-left aligned causal masking, as ``pl.attention(causal=True)``.
    options, **settings
        A :class:`~pyc_lab.kernels.tuning.options.GemmTuneOptions` and fields over it:
        ``dtype`` (``"bf16"`` default, or ``"f16"``), ``strategy`` (default
        ``"exhaustive"``), ``budget_s``, ``max_candidates`` (default 6), ``repeats``,
        ``seed``, ``workers``, ``hang_s``.
    restrict
        ``restrict(config) -> bool``: only configurations it accepts are considered.
    db, cache
        Tuning database and kernel cache (the user's by default).
    observer, stop
        As for :func:`~pyc_lab.kernels.tuning.autotune.autotune_gemm`.

    Returns
    -------
    TuneResult
        ``.best`` (the fastest correct configuration), ``.table``, ``.baselines``
        (``{"sdpa": ms, "sdpa_cudnn": ms, ...}``), ``.speedup`` against the best of them.

    Raises
    ------
    PycLabError
        No GPU or torch, not Hopper, no nvcc, a dtype or head dimension the kernel does
        not take, or a bad setting.
    """
    merged = {**{k: v for k, v in ATTN_DEFAULTS.items() if options is None}, **settings}
    opts = GemmTuneOptions.resolve(options, merged)
    problem = AttentionProblem(batch, heads, seq_len, head_dim, len_k=seq_len_k,
                               heads_kv=heads_kv, causal=causal)
    t_start = time.perf_counter()
    runner = AttentionRunner(problem, opts, restrict=restrict, cache=cache)
    result = tune_runner(runner, opts, observer, stop, db, t_start)
    if result.recorded:
        from ..attention_sm90 import clear

        clear()
    return result
