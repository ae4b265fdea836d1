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

__all__ = ["ShardedBelt", "check_devices"]

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

    def __init__(self, owner: ShardedBelt, position: int, label: str) -> None:
        self.owner = owner
        self.position = position
        self.label = label

    def record(self, item: int, stage: str, lane: str, start_s: float, end_s: float,
               nbytes: int = 0, **meta: Any) -> Any:
        n = len(self.owner.shards)
        return self.owner.trace.record(item * n + self.position, stage,
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


class ShardedBelt:
    """Belts, one per device, run as one (see the module docstring).

    Parameters
    ----------
    make
        ``make(device, trace)`` returns the belt for one device recording into
        ``trace`` (a :class:`~pyc_lab.runtime.pipeline.Pipeline`).
    devices
        The device ordinals, in dealing order.
    new_trace
        Makes the shared trace of a run; ``None`` when the caller gave one trace for
        every run (``trace``).
    trace
        The trace every run records into when ``new_trace`` is ``None`` (``False``: the
        belts record nothing).
    labels
        A lane prefix per device (``"gpu0"``; ``"shard0"`` in CPU mode).
    """

    def __init__(self, make: Callable[[int, Any], Any], devices: Sequence[int], *,
                 new_trace: Callable[[], Any] | None, trace: Any,
                 labels: Sequence[str]) -> None:
        self.devices = list(devices)
        self._new_trace = new_trace
        self.trace = new_trace() if new_trace is not None else trace
        self.shards: list[Any] = []
        try:
            for k, (device, label) in enumerate(zip(self.devices, labels, strict=True)):
                target = False if self.trace is False else _DeviceTrace(self, k, label)
                self.shards.append(make(device, target))
        except BaseException:
            self.close()
            raise

    def run(self, items: Any) -> Generator[Any, None, None]:
        """Deal ``items`` to the belts; yield the results in item order."""
        if self._new_trace is not None:
            self.trace = self._new_trace()
        dealer = _Dealer(iter(items), len(self.shards))
        runs = [shard.run(dealer.lane(k)) for k, shard in enumerate(self.shards)]
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
        n = len(self.shards)
        whole = index * n + k
        message = _ITEM.sub(f"item {whole}", str(exc), count=1)
        try:
            return type(exc)(f"{message} (on device {self.devices[k]})", index=whole,
                             stage=exc.stage)
        except TypeError:
            return exc

    def close(self) -> None:
        """Close every belt (each frees its pool and threads)."""
        for shard in self.shards:
            shard.close()
