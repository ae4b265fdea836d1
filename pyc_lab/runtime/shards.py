"""One belt over several GPUs: items dealt round robin to one belt per device, results
merged back in item order (``Pipeline(..., devices=[...])``).

Each device's belt is a whole :class:`~pyc_lab.runtime.pipeline.Pipeline` of its own:
its pinned pool on that GPU's NUMA node, its copy and compute streams, its prepare
workers, its ``depth`` slots. Item ``i`` goes to belt ``i % n``. The caller's thread
deals the items and takes the results in order, so every belt keeps its own ``depth``
items in flight while the caller waits on another's, and the items dealt ahead are
bounded by the belts' depths. One trace holds every belt's spans, item numbers global,
each lane named with its device (``gpu1 stream h2d``: a lane group per GPU on the
timeline). An item that fails stops every belt and is reported with its index in the
caller's input and its device.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

from ..profiling.trace import Trace

__all__ = ["ShardedPipeline", "check_devices"]

_ITEM = re.compile(r"^item (\d+)")


def check_devices(devices: Any, error: Callable[[str], Exception]) -> list[int]:
    """``devices`` as a list of distinct device ordinals (``error(message)`` raised for
    anything else)."""
    if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
        raise error(f"devices must be a list of GPU ordinals, e.g. [0, 1], got {devices!r}")
    out = list(devices)
    if not out:
        raise error("devices is empty; give at least one GPU ordinal")
    for d in out:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise error(f"devices must hold GPU ordinals (whole numbers >= 0), got {d!r}")
    if len(set(out)) != len(out):
        raise error(f"devices lists a GPU twice: {out}; each GPU gets one belt")
    return out


class _DeviceTrace:
    """What one device's belt records into: the shared trace, with the item's number in
    the caller's input and the lane named with its device."""

    def __init__(self, owner: ShardedPipeline, position: int, label: str) -> None:
        self.owner = owner
        self.position = position
        self.label = label

    def record(self, item: int, stage: str, lane: str, start_s: float, end_s: float,
               nbytes: int = 0, **meta: Any) -> Any:
        n = len(self.owner.shards)
        return self.owner._trace.record(item * n + self.position, stage,
                                       f"{self.label} {lane}", start_s, end_s,
                                       nbytes=nbytes, **meta)


class _Dealer:
    """Deals one iterator's items round robin to ``n`` lanes, pulling only when a lane
    asks (on the caller's thread, as the belts pull)."""

    def __init__(self, source: Iterator[Any], n: int) -> None:
        self.source = source
        self.queues: list[collections.deque[Any]] = [collections.deque() for _ in range(n)]
        self.dealt = 0
        self.exhausted = False

    def lane(self, k: int) -> Generator[Any, None, None]:
        queue = self.queues[k]
        while True:
            while not queue:
                if self.exhausted:
                    return
                try:
                    item = next(self.source)
                except StopIteration:
                    self.exhausted = True
                    return
                self.queues[self.dealt % len(self.queues)].append(item)
                self.dealt += 1
            yield queue.popleft()


class ShardedPipeline:
    """A :class:`~pyc_lab.runtime.pipeline.Pipeline` over several devices (see the module
    docstring): what ``Pipeline(..., devices=[...])`` returns for two devices or more. It
    runs, traces and closes like a one-device belt.

    Parameters
    ----------
    belt
        The one-device belt class (``Pipeline``): ``belt(prepare, compute, device=...,
        trace=..., **settings)``.
    devices
        The device ordinals (:func:`check_devices`), in dealing order.
    prepare, compute, trace, pool, **settings
        As for ``Pipeline``; ``pool`` must be ``None`` (each belt makes its own).
    error
        The exception class raised for bad arguments and a closed belt.
    on_run
        Called with this front as each run starts (``last_pipeline`` remembers it).
    """

    def __init__(self, belt: Callable[..., Any], devices: Sequence[int], prepare: Any,
                 compute: Any, *, trace: Any = None, pool: Any = None,
                 error: Callable[[str], Exception] = ValueError,
                 on_run: Callable[[Any], None] | None = None, **settings: Any) -> None:
        if pool is not None:
            raise error("a PinnedPool serves one NUMA node: with devices= every belt makes "
                        "its own; leave pool out")
        self._error, self._on_run = error, on_run
        self.devices = list(devices)
        self.device = self.devices[0]
        probe = belt(prepare, compute, device=self.device, trace=False, **settings)
        probe.close()  # the settings checked, the mode known
        self.mode, self.mode_reason = probe.mode, probe.mode_reason
        for name in ("depth", "workers", "h2d", "d2h", "timeout_s", "trace_items"):
            setattr(self, name, getattr(probe, name))
        if self.mode == "gpu":
            _check_present(self.devices, error)
        self.traced = trace is not False
        self._own_trace = trace is None or trace is True
        self._trace = Trace(max_items=self.trace_items) if self._own_trace else trace
        self._closed = False
        self.shards: list[Any] = []
        try:
            for k, device in enumerate(self.devices):
                label = f"gpu{device}" if self.mode == "gpu" else f"shard{k}"
                target = _DeviceTrace(self, k, label) if self.traced else False
                self.shards.append(belt(prepare, compute, device=device, trace=target,
                                        **settings))
        except BaseException:
            self.close()
            raise

    @property
    def trace(self) -> Any:
        """The trace of the latest run (every belt's spans), as a one-device belt's."""
        return self._trace if self.traced else Trace()

    @property
    def dispatcher_metrics(self) -> dict[int, Any]:
        """Device -> that belt's prepare-worker metrics."""
        return {d: s.dispatcher_metrics for d, s in zip(self.devices, self.shards,
                                                        strict=True)}

    @property
    def live_slots(self) -> int:
        """Slots holding an item, over every belt (never more than ``depth`` per belt)."""
        return sum(s.live_slots for s in self.shards)

    def run(self, items: Any) -> Generator[Any, None, None]:
        """Deal ``items`` to the belts; yield the results in item order."""
        if self._closed:
            raise self._error("this Pipeline is closed; create a new one")
        if self._own_trace:
            self._trace = Trace(max_items=self.trace_items)
        dealer = _Dealer(iter(items), len(self.shards))
        runs = [shard.run(dealer.lane(k)) for k, shard in enumerate(self.shards)]
        if self._on_run is not None:
            self._on_run(self)
        return self._merge(runs)

    def _merge(self, runs: list[Generator[Any, None, None]]) -> Generator[Any, None, None]:
        n = len(runs)
        index = 0
        try:
            while True:
                k = index % n
                try:
                    result = next(runs[k])
                except StopIteration:  # item `index` does not exist: the input is done
                    return
                except Exception as exc:
                    raise self._globalised(exc, k) from exc
                yield result
                index += 1
        finally:
            for run in runs:
                run.close()

    def _globalised(self, exc: Exception, k: int) -> Exception:
        """``exc`` of belt ``k`` with its item's index in the caller's input and the
        device named (a belt's own errors carry ``index`` and ``stage``)."""
        index = getattr(exc, "index", None)
        if index is None or not hasattr(exc, "stage"):
            return exc
        whole = index * len(self.shards) + k
        message = _ITEM.sub(f"item {whole}", str(exc), count=1)
        try:
            return type(exc)(f"{message} (on device {self.devices[k]})", index=whole,
                             stage=exc.stage)
        except TypeError:
            return exc

    def close(self) -> None:
        """Close every belt (each frees its pool and threads)."""
        self._closed = True
        for shard in self.shards:
            shard.close()

    def __enter__(self) -> ShardedPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Pipeline(mode={self.mode!r}, devices={self.devices}, depth={self.depth}"
                f" per device, workers={self.workers}, h2d={self.h2d}, d2h={self.d2h})")


def _check_present(devices: Sequence[int], error: Callable[[str], Exception]) -> None:
    from ..hardware.device import cupy_status

    cp, _ = cupy_status()
    count = cp.cuda.runtime.getDeviceCount()
    missing = [d for d in devices if d >= count]
    if missing:
        raise error(f"devices {missing} do not exist: this machine has {count} GPU(s), "
                    f"ordinals 0-{count - 1}")
