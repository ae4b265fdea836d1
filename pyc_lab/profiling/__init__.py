"""Measuring: the one GPU timing primitive, traces and timelines, CUPTI activity, copy
bandwidths.

- :mod:`.timing` — :func:`~.timing.benchmark`: CUDA-event (or host) timing with warm-up,
  an L2 flush sized from the device, launch gaps kept out of the interval, median and
  spread; what the tuner, the probes, the benchmarks and ``%pyc_timeit`` use;
- :mod:`.trace` — :class:`Trace` of spans per lane, overlap reports, Chrome export,
  NVTX ranges, the CUDA-event clock;
- :mod:`.activity` — :class:`GpuActivity`: a block's GPU work from CUPTI records;
- :mod:`.bandwidth` — :func:`probe_bandwidth`: measured copy bandwidths beside the
  links' theoretical ones.
"""

from .._lazy import lazy_face

_EXPORTS = {
    "GpuActivity": "activity",
    "probe_bandwidth": "bandwidth", "bandwidth_summary": "bandwidth",
    "CudaEventClock": "trace", "OverlapReport": "trace", "Span": "trace", "Trace": "trace",
    "nvtx_range": "trace",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, globals())
