"""One timing primitive: :func:`benchmark` times a callable on the GPU or on the host.

Every measurement in pyc_lab — the GEMM tuner, the bandwidth probe, the benchmarks and
``%pyc_timeit`` — goes through :func:`benchmark`, so that they all mean the same thing
by "time per call": the median of repeated calls after a warm-up.

On a GPU each call is bracketed by two CUDA events on one stream, and three things keep
the interval honest:

- an optional **L2 flush** (a memset of a buffer twice the device's L2 cache) before the
  start event, so that a call does not read what the previous call left in L2;
- a **spin kernel** (``native/spin.cu``) queued before the start event: while the GPU
  spins, the host issues the start event, the call's launches and the end event, so the
  GPU finds them all queued and the host's launch gaps stay out of the interval. The
  spin lasts at least 100 us, and twice the host time of the quickest warm-up call when
  that is longer (up to 50 ms), so that slow launchers are covered too. A call that waits
  for the device itself (a copy to pageable memory, ``.get()``) waits for the spin as
  well, which inflates its host time: time such calls with ``spin=False``;
- the host time of the call itself (``perf_counter`` around it) is kept beside the GPU
  time: the two together say whether a call is bound by the GPU or by the host.

Without a GPU (or with ``gpu=False``) each call is timed with ``perf_counter`` alone and
the result says why there is no GPU time.
"""

from __future__ import annotations

import contextlib
import html
import logging
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import PycLabError
from ..hardware.device import cupy_status, require_cupy
from ..paths import native_source

__all__ = ["Timing", "benchmark", "spin_ahead"]

log = logging.getLogger(__name__)

#: The spin kernel's shortest and longest run, and how many times the quickest warm-up
#: call's host time it covers.
_SPIN_MIN_S = 100e-6
_SPIN_MAX_S = 50e-3
_SPIN_HOST_FACTOR = 2.0
#: Used when the device does not report ``ClockRate`` (kHz) or ``L2CacheSize`` (bytes):
#: a high clock only makes the spin longer, a large L2 only the flush buffer bigger.
_FALLBACK_CLOCK_KHZ = 1_980_000
_FALLBACK_L2_BYTES = 128 << 20
#: With ``min_time_s``, at least this many timed calls (fewer only if ``repeats`` is).
_MIN_CALLS = 3


# -- the result ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Timing:
    """Times of repeated calls of one function, as measured by :func:`benchmark`.

    Attributes
    ----------
    name
        What was timed (the function's name unless given).
    cpu_s
        Host seconds of each timed call: ``perf_counter`` just before and just after it.
        For asynchronous GPU work this is the cost of issuing it, not of running it.
    gpu_s
        Device seconds of each timed call from CUDA events; ``None`` when timed on the
        host only.
    warmup
        Untimed calls made first.
    flushed_l2
        Whether the device's L2 cache was flushed before every timed call.
    device
        The GPU's name (``"NVIDIA H200"``), or ``"CPU (no GPU: <reason>)"``.
    """

    name: str
    cpu_s: tuple[float, ...]
    gpu_s: tuple[float, ...] | None
    warmup: int
    flushed_l2: bool
    device: str

    def __post_init__(self) -> None:
        if not self.cpu_s:
            raise PycLabError("a Timing needs at least one timed call")
        if self.gpu_s is not None and len(self.gpu_s) != len(self.cpu_s):
            raise PycLabError(f"a Timing has one GPU time per call: got {len(self.gpu_s)} "
                              f"GPU and {len(self.cpu_s)} CPU times")

    # -- statistics -----------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Number of timed calls."""
        return len(self.cpu_s)

    @property
    def _primary(self) -> tuple[float, ...]:
        return self.gpu_s if self.gpu_s is not None else self.cpu_s

    @property
    def median_s(self) -> float:
        """Median seconds per call: GPU time when measured, else host time."""
        return statistics.median(self._primary)

    @property
    def median_ms(self) -> float:
        """:attr:`median_s` in milliseconds."""
        return self.median_s * 1e3

    @property
    def cpu_median_s(self) -> float:
        """Median host seconds per call."""
        return statistics.median(self.cpu_s)

    @property
    def gpu_median_s(self) -> float | None:
        """Median GPU seconds per call (``None`` when timed on the host only)."""
        return None if self.gpu_s is None else statistics.median(self.gpu_s)

    @property
    def spread(self) -> float:
        """Relative spread of the primary times: interquartile range over the median
        (0.02 means the middle half of the calls lie within 2 % of the median's size)."""
        med = self.median_s
        return _iqr(self._primary) / med if med > 0 else 0.0

    # -- reports --------------------------------------------------------------------------
    def summary(self) -> str:
        """One line: median ± half the interquartile range per call, GPU then CPU, e.g.
        ``f: GPU 8.12 us ± 0.21 us, CPU 24.3 us ± 1.1 us per call (20 calls, 2 warm-up,
        L2 flushed; NVIDIA H200)``."""
        parts = []
        if self.gpu_s is not None:
            parts.append(f"GPU {_pm(self.gpu_s)}")
        parts.append(f"CPU {_pm(self.cpu_s)}")
        return f"{self.name}: {', '.join(parts)} per call ({self._conditions()})"

    def _conditions(self) -> str:
        calls = f"{self.n} call{'s' if self.n != 1 else ''}, {self.warmup} warm-up"
        return f"{calls}{', L2 flushed' if self.flushed_l2 else ''}; {self.device}"

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        rows = []
        for label, times in (("GPU", self.gpu_s), ("CPU", self.cpu_s)):
            if times is None:
                continue
            med = statistics.median(times)
            unit = _unit(med)
            cells = [_fmt(med, unit), _fmt(_iqr(times) / 2, unit, 2), _fmt(min(times), unit),
                     _fmt(max(times), unit),
                     f"{100 * _iqr(times) / med:.1f} %" if med > 0 else "-"]
            rows.append(f"<tr><th>{label}</th>" + "".join(f"<td>{c}</td>" for c in cells)
                        + "</tr>")
        return (
            "<table class='pyc-lab-timing'>"
            f"<caption>{html.escape(self.name)}: per call "
            f"({html.escape(self._conditions())})</caption>"
            "<tr><th></th><th>median</th><th>± IQR/2</th><th>min</th><th>max</th>"
            "<th>spread</th></tr>" + "".join(rows) + "</table>"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record (for benchmark results): the settings, the medians and
        every call's times."""
        return {
            "name": self.name, "device": self.device, "n": self.n, "warmup": self.warmup,
            "flushed_l2": self.flushed_l2, "median_s": self.median_s,
            "spread": self.spread, "cpu_median_s": self.cpu_median_s,
            "gpu_median_s": self.gpu_median_s, "cpu_s": list(self.cpu_s),
            "gpu_s": None if self.gpu_s is None else list(self.gpu_s),
        }


def _iqr(times: Sequence[float]) -> float:
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return q3 - q1


_UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))


def _unit(seconds: float) -> tuple[str, float]:
    for name, scale in _UNITS:
        if seconds >= scale:
            return name, scale
    return _UNITS[-1]


def _fmt(seconds: float, unit: tuple[str, float], digits: int = 3) -> str:
    """``seconds`` in ``unit`` to ``digits`` significant digits (``8.12 us``)."""
    name, scale = unit
    text = f"{seconds / scale:.{digits}g}"
    if "e" in text:  # 999.7 ms rounds to 1e+03
        text = f"{seconds / scale:.0f}"
    return f"{text} {name}"


def _pm(times: Sequence[float]) -> str:
    """``median ± IQR/2``, both in the median's unit."""
    med = statistics.median(times)
    unit = _unit(med)
    return f"{_fmt(med, unit)} ± {_fmt(_iqr(times) / 2, unit, 2)}"


# -- the primitive ------------------------------------------------------------------------
def benchmark(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    repeats: int = 20,
    warmup: int = 2,
    min_time_s: float | None = None,
    flush_l2: bool = False,
    spin: bool = True,
    gpu: bool | None = None,
    stream: Any = None,
    name: str | None = None,
) -> Timing:
    """Time ``fn(*args, **kwargs)``: host time of each call and, on a GPU, its device time.

    Parameters
    ----------
    fn, args, kwargs
        What to call. On a GPU, ``fn`` should queue its work asynchronously (as CuPy,
        PyTorch and CUTLASS launches do); the end event waits for it.
    repeats
        Timed calls (with ``min_time_s``: the most of them).
    warmup
        Untimed calls first (compilation, caches, clocks), then the device is
        synchronised.
    min_time_s
        When given, one call is timed first and the number of timed calls chosen so that
        they take about this long: at least 3, at most ``repeats``. For work whose cost
        varies over orders of magnitude (copies from 4 KiB to 1 GiB).
    flush_l2
        Flush the GPU's L2 cache before each timed call (outside the interval) by
        writing a buffer twice its size, so that each call starts cold as in a real
        pipeline. Ignored on the host.
    spin
        Queue a spin kernel before each start event, so that the host's launch gaps stay
        out of the GPU interval (see the module docstring). Leave it on to measure what
        the GPU spends on the work; turn it off to include the cost of issuing it, and
        for a ``fn`` that waits for the device (it would wait for the spin too).
    gpu
        ``None``: time on the GPU when CuPy can use a device, else on the host.
        ``True``: the GPU, or :class:`~pyc_lab.errors.DeviceUnavailableError`.
        ``False``: the host only.
    stream
        The CuPy stream the events (and the flush and spin) go to; it is made current
        during the calls, so CuPy work in ``fn`` goes there too. Default: the current
        stream. Ignored on the host.
    name
        Label of the result; ``fn``'s name by default.

    Returns
    -------
    Timing
        Every call's times, their medians and spread, and how they were taken.

    Raises
    ------
    PycLabError
        For a non-callable ``fn`` or arguments out of range.
    DeviceUnavailableError
        With ``gpu=True`` on a machine without a usable CUDA device.

    Examples
    --------
    >>> t = benchmark(cupy.matmul, (a, b), flush_l2=True)   # doctest: +SKIP
    >>> t.gpu_median_s, t.cpu_median_s                      # doctest: +SKIP
    """
    call = _check(fn, args, kwargs, repeats, warmup, min_time_s, gpu)
    label = name if name is not None else _name_of(fn)
    if gpu is False:
        cp, reason = None, "gpu=False asks for host timing"
    elif gpu is True:
        cp, reason = require_cupy("GPU timing (benchmark(gpu=True))"), "ok"
    else:
        cp, reason = cupy_status()
    if cp is None:
        if flush_l2:
            log.debug("benchmark(%s): no GPU (%s), so no L2 flush", label, reason)
        cpu = _host_times(call, repeats, warmup, min_time_s)
        timing = Timing(label, tuple(cpu), None, warmup, False, f"CPU (no GPU: {reason})")
    else:
        timing = _gpu_timing(cp, call, label, repeats, warmup, min_time_s, flush_l2, spin,
                             stream)
    log.debug("%s", timing.summary())
    return timing


def _check(fn: Any, args: Any, kwargs: Any, repeats: Any, warmup: Any, min_time_s: Any,
           gpu: Any) -> Callable[[], Any]:
    """Validate :func:`benchmark`'s arguments; return the call to time."""
    if not callable(fn):
        raise PycLabError(f"benchmark needs a callable, got {type(fn).__name__} {fn!r:.60}; "
                          "pass the function itself and its arguments apart: "
                          "benchmark(f, args=(x,))")
    if not isinstance(args, (tuple, list)):
        raise PycLabError(f"benchmark's args must be a tuple of positional arguments, got "
                          f"{type(args).__name__}; for one argument write args=(x,)")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise PycLabError(f"benchmark's kwargs must be a mapping or None, got "
                          f"{type(kwargs).__name__}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise PycLabError(f"repeats must be an integer >= 1 (timed calls), got {repeats!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise PycLabError(f"warmup must be an integer >= 0 (untimed calls), got {warmup!r}")
    if min_time_s is not None and (
        isinstance(min_time_s, bool) or not isinstance(min_time_s, (int, float))
        or not math.isfinite(min_time_s) or min_time_s <= 0
    ):
        raise PycLabError(f"min_time_s must be a number of seconds > 0, or None, got "
                          f"{min_time_s!r}")
    if gpu not in (None, True, False):
        raise PycLabError(f"gpu must be None (auto), True or False, got {gpu!r}")
    a, kw = tuple(args), dict(kwargs or {})
    return lambda: fn(*a, **kw)


def _name_of(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def _calls_for(first_s: float, min_time_s: float, repeats: int) -> int:
    """Timed calls that take about ``min_time_s`` if each takes ``first_s``."""
    return int(min(repeats, max(_MIN_CALLS, math.ceil(min_time_s / max(first_s, 1e-7)))))


# -- host ---------------------------------------------------------------------------------
def _host_times(call: Callable[[], Any], repeats: int, warmup: int,
                min_time_s: float | None) -> list[float]:
    def once() -> float:
        t0 = time.perf_counter()
        call()
        return time.perf_counter() - t0

    for _ in range(warmup):
        call()
    n = repeats if min_time_s is None else _calls_for(once(), min_time_s, repeats)
    return [once() for _ in range(n)]


# -- GPU ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _DeviceFacts:
    name: str
    clock_khz: int
    l2_bytes: int


_FACTS: dict[int, _DeviceFacts] = {}
_SPIN_KERNELS: dict[int, Any] = {}
_LOCK = threading.Lock()


def _device_facts(cp: Any, device_id: int) -> _DeviceFacts:
    """Name, SM clock (kHz) and L2 size of a device, read once per device."""
    with _LOCK:
        facts = _FACTS.get(device_id)
        if facts is None:
            attrs = cp.cuda.Device(device_id).attributes
            name = cp.cuda.runtime.getDeviceProperties(device_id)["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
            clock = int(attrs.get("ClockRate") or 0)
            l2 = int(attrs.get("L2CacheSize") or 0)
            if not clock or not l2:
                log.debug("GPU%d reports ClockRate=%s kHz, L2CacheSize=%s B; using %s kHz "
                          "and %s B where missing", device_id, clock, l2,
                          _FALLBACK_CLOCK_KHZ, _FALLBACK_L2_BYTES)
            facts = _DeviceFacts(name, clock or _FALLBACK_CLOCK_KHZ, l2 or _FALLBACK_L2_BYTES)
            _FACTS[device_id] = facts
        return facts


def _l2_flush_bytes(cp: Any, device_id: int) -> int:
    """Size of the L2 flush buffer: twice the device's L2 cache."""
    return 2 * _device_facts(cp, device_id).l2_bytes


def _flush_buffer(cp: Any, device_id: int) -> Any:
    """A device buffer of :func:`_l2_flush_bytes` (from CuPy's pool: the memory goes
    back to the pool when the benchmark ends)."""
    return cp.empty(_l2_flush_bytes(cp, device_id), dtype=cp.uint8)


def _spin_kernel(cp: Any, device_id: int) -> Any:
    """The ``pyc_spin`` kernel of ``native/spin.cu``, compiled once per device."""
    with _LOCK:
        kernel = _SPIN_KERNELS.get(device_id)
        if kernel is None:
            kernel = cp.RawKernel(native_source("spin.cu"), "pyc_spin")
            _SPIN_KERNELS[device_id] = kernel
        return kernel


def _spin_seconds(host_s: float) -> float:
    """How long to spin before a call that takes the host about ``host_s`` to issue."""
    return min(_SPIN_MAX_S, max(_SPIN_MIN_S, _SPIN_HOST_FACTOR * host_s))


def spin_ahead(cp: Any, host_s: float, stream: Any) -> None:
    """Queue the spin kernel on ``stream`` (a CuPy stream) for long enough that the host
    can issue a call taking it about ``host_s`` behind it (at least 100 us, twice
    ``host_s`` up to 50 ms): a start event recorded next then times the call's GPU work
    without the host's launch gaps. Used by timers other than :func:`benchmark` that
    bracket calls with their own events (the first-call races of library paths)."""
    device_id = stream.device_id if getattr(stream, "device_id", -1) >= 0 \
        else cp.cuda.Device().id
    cycles = round(_spin_seconds(host_s) * _device_facts(cp, device_id).clock_khz * 1e3)
    _spin_kernel(cp, device_id)((1,), (1,), (cp.int64(cycles),), stream=stream)


def _gpu_timing(cp: Any, call: Callable[[], Any], label: str, repeats: int, warmup: int,
                min_time_s: float | None, flush_l2: bool, spin: bool, stream: Any) -> Timing:
    device_id = getattr(stream, "device_id", -1) if stream is not None else -1
    if device_id is None or device_id < 0:
        device_id = cp.cuda.Device().id
    with cp.cuda.Device(device_id), (stream if stream is not None
                                     else contextlib.nullcontext()):
        s = stream if stream is not None else cp.cuda.get_current_stream()
        facts = _device_facts(cp, device_id)
        flush = _flush_buffer(cp, device_id) if flush_l2 else None
        kernel = _spin_kernel(cp, device_id) if spin else None
        if kernel is not None:  # compile and load it before anything is timed
            kernel((1,), (1,), (cp.int64(0),), stream=s)
        warm_host_s = []
        for _ in range(warmup):
            t0 = time.perf_counter()
            call()
            warm_host_s.append(time.perf_counter() - t0)
        cp.cuda.Device(device_id).synchronize()
        # Sized from the warm-up calls (no spin ahead of them), and fixed from then on: a
        # call that waits for the device would otherwise lengthen every next spin.
        spin_s = _spin_seconds(min(warm_host_s, default=0.0))
        spin_cycles = cp.int64(round(spin_s * facts.clock_khz * 1e3))
        start, end = cp.cuda.Event(), cp.cuda.Event()

        def once() -> tuple[float, float]:
            if flush is not None:
                flush.data.memset_async(0, flush.nbytes, s)
            if kernel is not None:
                kernel((1,), (1,), (spin_cycles,), stream=s)
            start.record(s)
            t0 = time.perf_counter()
            call()
            t1 = time.perf_counter()
            end.record(s)
            end.synchronize()
            return t1 - t0, float(cp.cuda.get_elapsed_time(start, end)) / 1e3

        n = repeats if min_time_s is None else _calls_for(once()[1], min_time_s, repeats)
        times = [once() for _ in range(n)]
    if spin and max(c for c, _ in times) > spin_s:
        log.debug("benchmark(%s): a call took longer on the host than the %.3g s spin "
                  "ahead of it; that call's launch gaps are inside its GPU interval",
                  label, spin_s)
    return Timing(label, tuple(c for c, _ in times), tuple(g for _, g in times), warmup,
                  flush_l2, facts.name)
