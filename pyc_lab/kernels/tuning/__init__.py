"""Kernel tuning: the tuning database and the GEMM tuner on the shared tuning session.

- :mod:`.keys` — device and problem keys, measurements, lookup results;
- :mod:`.database` — :class:`TuningDB`: every candidate measured per device and problem,
  the winner, exact and bucketed lookup;
- :mod:`.sqlite_file` — its SQLite file: WAL, integrity, schema, damaged files set aside;
- :mod:`.io` — export and import files (JSON, CSV), checked row by row;
- :mod:`.options` — :class:`GemmTuneOptions`: the one source of every tuning default;
- :mod:`.gemm_space`, :mod:`.gemm_reference` — candidates as a search space; inputs,
  references, tolerances and library baselines;
- :mod:`.gemm_runner` — the live runner (build, check, time on this GPU);
- :mod:`.recording`, :mod:`.replay` — tunings recorded elsewhere, and the runner that
  replays them;
- :mod:`.autotune` — ``autotune_gemm`` and ``replay_autotune``: one session each;
- :mod:`.conv_runner`, :mod:`.conv_tune` — ``autotune_conv``: pyc_lab's CUTLASS
  convolutions built, checked and timed against cuDNN on the same session;
- :mod:`.attention_runner`, :mod:`.attention_tune` — ``autotune_attention``: pyc_lab's
  Hopper attention kernel built, checked and timed against torch's SDPA;
- :mod:`.kernel_rows` — the candidate table and search space those runners share;
- :mod:`.many`, :mod:`.builds` — ``autotune_many``: a list of problems, builds shared
  and deduplicated, one total budget, a summary table;
- :mod:`.result` — :class:`TuneResult`, :class:`ReplayResult`;
- :mod:`.background` — a tuning in a background thread (what the widget shows);
- :mod:`.compare` — tuned kernels against the libraries, across problems.
"""

from ..._lazy import lazy_face

_EXPORTS = {
    **dict.fromkeys(("DeviceKey", "LookupResult", "Measurement", "ProblemKey",
                     "TuningDBError", "TuningDBWarning", "TuningRecord", "device_key"), "keys"),
    "TuningDB": "database", "SQLiteFile": "sqlite_file",
    "GemmTuneOptions": "options",
    "TuneResult": "result", "ReplayResult": "result", "ReplayInfo": "result",
    "autotune_gemm": "autotune", "replay_autotune": "autotune",
    "autotune_conv": "conv_tune",
    "autotune_attention": "attention_tune",
    "autotune_many": "many", "ManyResult": "many", "GemmProblem": "many",
    **dict.fromkeys(("recorded_db", "recorded_problems", "recorded_result",
                     "recorded_results", "recording_path"), "recording"),
    "TuningRun": "background",
    "Comparison": "compare",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, globals())
