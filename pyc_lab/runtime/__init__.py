"""The runtime: keep the GPU fed — pinned host memory, bounded worker pools, the belt.

- :mod:`.pinned` — :class:`PinnedPool`: page-locked host buffers in size classes, placed
  on the GPU's NUMA node;
- :mod:`.dispatcher` — :class:`Dispatcher`: a bounded pool of CPU workers with metrics;
- :mod:`.pipeline` — :class:`Pipeline`: the conveyor belt (prepare -> H2D -> compute ->
  D2H in flight at once); its stages run on host lanes (:mod:`.host_lanes`, CPU mode)
  or CUDA lanes (:mod:`.cuda_lanes`, GPU mode), both behind the interface in
  :mod:`.lanes`, over the slots, jobs and runs of :mod:`.belt_state`;
- :mod:`.belt_tuning` — :func:`tune_pipeline`: the belt's settings searched by the
  shared tuning session;
- :mod:`.checks` — the argument checks their constructors share (bad settings fail at
  construction, with what to pass instead).

Nothing here imports a GPU library at import time; what needs one imports it when
called and raises :class:`~pyc_lab.errors.DeviceUnavailableError` (or falls back to the
CPU, where the docstring says so) when it is missing.
"""

from .._lazy import lazy_face

_EXPORTS = {
    "BeltSweep": "belt_tuning", "tune_pipeline": "belt_tuning",
    "Dispatcher": "dispatcher",
    "PinnedBuffer": "pinned", "PinnedPool": "pinned", "parse_numa_maps": "pinned",
    "size_class": "pinned",
    "Pipeline": "pipeline", "PipelineError": "pipeline", "last_pipeline": "pipeline",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, globals())
