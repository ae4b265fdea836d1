"""Measuring: the one GPU timing primitive, traces and timelines, CUPTI activity, copy
bandwidths.

- :mod:`.timing` — :func:`~.timing.benchmark` -> :class:`~.timing.Timing`: CUDA-event
  (or host) timing with warm-up, an L2 flush sized from the device, launch gaps kept out
  of the interval, host and GPU time per call, median and spread; what the tuner, the
  probes, the benchmarks and ``%pyc_timeit`` use;
- :mod:`.spans` — :class:`Span`, one stage of one item on one lane;
- :mod:`.trace` — :class:`Trace`: spans per lane, frames, Chrome export;
- :mod:`.overlap` — :class:`OverlapReport`: copy hidden behind compute, GPU idle,
  starvation gaps, the max-stage and pipeline bounds;
- :mod:`.clock` — :class:`CudaEventClock`: CUDA events on the host clock;
- :mod:`.nvtx` — :func:`nvtx_range` for Nsight Systems;
- :mod:`.activity` — :class:`GpuActivity`: a block's GPU work from CUPTI records;
- :mod:`.bandwidth` — :func:`probe_bandwidth`: measured copy bandwidths beside the
  links' theoretical ones.
"""

from .._lazy import lazy_face

_EXPORTS = {
    "benchmark": "timing", "Timing": "timing",
    "GpuActivity": "activity",
    "probe_bandwidth": "bandwidth", "bandwidth_summary": "bandwidth",
    "CudaEventClock": "clock", "OverlapReport": "overlap", "Span": "spans", "Trace": "trace",
    "nvtx_range": "nvtx",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, globals())
