"""Kernel tuning: the tuning database and the GEMM tuner on the shared tuning session.

- :mod:`.database` — :class:`TuningDB`: every candidate measured per device and problem
  (SQLite, WAL), the winner, exact and bucketed lookup, JSON/CSV export and import;
- :mod:`.autotune` — ``autotune_gemm``: the live GEMM runner (build, check, time);
- :mod:`.replay` — ``replay_autotune``: the same search over a recorded tuning.
"""

from ..._lazy import lazy_face

_EXPORTS = {
    "DeviceKey": "database", "LookupResult": "database", "Measurement": "database",
    "ProblemKey": "database", "TuningDB": "database", "TuningDBError": "database",
    "TuningDBWarning": "database",
    "TuneResult": "autotune", "autotune_gemm": "autotune",
    "ReplayResult": "replay", "replay_autotune": "replay",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, globals())
