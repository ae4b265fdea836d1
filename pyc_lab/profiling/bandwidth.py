"""Measured copy bandwidths beside the link's theoretical ones.

:func:`probe_bandwidth` times host-to-device and device-to-host copies from pageable and
from pinned (page-locked) host memory, device-to-device copies and, with several GPUs,
peer copies, over sizes from 4 KiB to 1 GiB. Copies are timed with CUDA events on a
non-blocking stream by :func:`~.timing.benchmark`, the one timing primitive; each figure
is the median of repeats after a warm-up, over random bytes. Without a CUDA device it
measures host ``memcpy`` and marks the rest as needing a GPU.

GB/s counts each byte once for a copy across a link (H2D, D2H, peer) and twice — read
plus write — for a copy within one memory (D2D, host memcpy), so that both compare with
their theoretical figures (PCIe/NVLink per direction; memory bandwidth).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PycLabError
from ..hardware.device import cupy_status
from ..hardware.profile import NVLINK_LINK_GBPS, HardwareProfile
from ..units import format_bytes
from .timing import Timing, benchmark

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["DEFAULT_SIZES", "KINDS", "bandwidth_summary", "probe_bandwidth"]

log = logging.getLogger(__name__)

KiB = 1024
#: 4 KiB, 16 KiB, ..., 1 GiB.
DEFAULT_SIZES = [4 * KiB * 4**k for k in range(10)]
#: What :func:`probe_bandwidth` can measure on a GPU.
KINDS = ("h2d_pageable", "h2d_pinned", "d2h_pageable", "d2h_pinned", "d2d", "peer")
_COLUMNS = [
    "kind", "device", "peer", "size_bytes", "size", "repeats", "median_ms", "gbps",
    "theoretical_gbps", "pct_of_theoretical", "timer", "status",
]


def _check_args(kinds: Sequence[str] | None, sizes: Sequence[int] | None, min_time_s: float,
                max_repeats: int) -> tuple[list, list]:
    if not (isinstance(min_time_s, (int, float)) and min_time_s > 0):
        raise PycLabError(f"min_time_s must be a number of seconds > 0, got {min_time_s!r}")
    if isinstance(max_repeats, bool) or not isinstance(max_repeats, int) or max_repeats < 1:
        raise PycLabError(f"max_repeats must be an integer >= 1, got {max_repeats!r}")
    kinds = list(KINDS if kinds is None else kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise PycLabError(f"unknown bandwidth kind(s) {bad}; choose from {list(KINDS)}")
    sizes = list(DEFAULT_SIZES if sizes is None else sizes)
    if not sizes or any(not isinstance(s, (int, np.integer)) or s <= 0 for s in sizes):
        raise PycLabError(
            f"sizes must be positive byte counts, got {sizes!r}; e.g. sizes=[4096, 2**20]"
        )
    return kinds, sorted(int(s) for s in sizes)


def probe_bandwidth(
    device: int = 0,
    *,
    kinds: Sequence[str] | None = None,
    sizes: Sequence[int] | None = None,
    min_time_s: float = 0.02,
    max_repeats: int = 50,
    profile: HardwareProfile | None = None,
) -> pd.DataFrame:
    """Measure copy bandwidths and compare them with the links' theoretical bandwidths.

    Parameters
    ----------
    device
        CUDA ordinal of the GPU to probe (peer copies go from it to every other GPU).
    kinds
        Subset of :data:`KINDS`; all by default. ``peer`` needs two or more GPUs.
    sizes
        Copy sizes in bytes; :data:`DEFAULT_SIZES` (4 KiB to 1 GiB) by default.
    min_time_s
        Repeats per size are chosen so that they take about this long (at least 3).
    max_repeats
        Upper bound on repeats per size.
    profile
        Hardware profile giving the theoretical figures; detected when ``None``.

    Returns
    -------
    pandas.DataFrame
        One row per (kind, size): ``median_ms``, ``gbps``, ``theoretical_gbps``,
        ``pct_of_theoretical``, ``repeats``, ``timer`` and ``status`` (``"ok"`` or why
        the row was not measured). ``df.attrs["device"]`` names what was measured.

    Raises
    ------
    PycLabError
        For an unknown kind, a non-positive size, ``min_time_s <= 0``,
        ``max_repeats < 1`` or a GPU index that does not exist.
    """
    import pandas as pd

    kinds, sizes = _check_args(kinds, sizes, min_time_s, max_repeats)
    cp, reason = cupy_status()
    rows: list[dict[str, Any]]
    if cp is None:
        rows = _probe_host(sizes, min_time_s, max_repeats)
        rows += [
            _row(k, device, None, None, status=f"needs a CUDA device: {reason}") for k in kinds
        ]
        attrs = {"device": "CPU only", "note": f"GPU copies need a CUDA device: {reason}"}
        log.info("probe_bandwidth: no CUDA device (%s); measured host memcpy only", reason)
    else:
        n = cp.cuda.runtime.getDeviceCount()
        if not 0 <= device < n:
            raise PycLabError(f"no CUDA device {device}: this machine has {n} (0..{n - 1})")
        if profile is None:
            from ..hardware.detect import detect_hardware

            profile = detect_hardware()
        rows = _probe_gpu(cp, device, kinds, sizes, min_time_s, max_repeats, profile)
        props = cp.cuda.runtime.getDeviceProperties(device)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        attrs = {"device": f"GPU{device}: {name}", "note": ""}
    frame = pd.DataFrame(rows, columns=_COLUMNS)
    frame.attrs.update(attrs)
    return frame


def _row(kind: str, device: int | None, peer: int | None, size: int | None, **kw: Any) -> dict:
    row = dict.fromkeys(_COLUMNS)
    row.update(kind=kind, device=device, peer=peer, size_bytes=size,
               size=None if size is None else format_bytes(size))
    row.update(kw)
    return row


def _finish(row: dict, timing: Timing, bytes_moved: int, theoretical: float | None) -> dict:
    med = timing.median_s
    gbps = bytes_moved / med / 1e9
    row.update(
        repeats=timing.n,
        median_ms=round(med * 1e3, 6),
        gbps=round(gbps, 3),
        theoretical_gbps=theoretical,
        pct_of_theoretical=None if not theoretical else round(100 * gbps / theoretical, 1),
        status="ok",
    )
    return row


# -- CPU ----------------------------------------------------------------------------------
def _probe_host(sizes: list[int], min_time_s: float, max_repeats: int) -> list[dict]:
    rng = np.random.default_rng()
    src = rng.integers(0, 256, max(sizes), dtype=np.uint8)
    dst = rng.integers(0, 256, max(sizes), dtype=np.uint8)
    rows = []
    for size in sizes:
        def copy(size: int = size) -> None:
            np.copyto(dst[:size], src[:size])

        timing = benchmark(copy, repeats=max_repeats, warmup=1, min_time_s=min_time_s,
                           gpu=False, name=f"host_memcpy {format_bytes(size)}")
        if not np.array_equal(dst[:size], src[:size]):  # pragma: no cover - sanity
            raise PycLabError("host memcpy produced wrong bytes; the probe is broken")
        rows.append(_finish(_row("host_memcpy", None, None, size, timer="perf_counter"),
                            timing, 2 * size, None))
    return rows


# -- GPU ----------------------------------------------------------------------------------
def _probe_gpu(cp: Any, device: int, kinds: list[str], sizes: list[int], min_time_s: float,
               max_repeats: int, profile: HardwareProfile) -> list[dict]:
    rt = cp.cuda.runtime
    gpu = next((g for g in profile.gpus if g.index == device), None)
    pcie = gpu.pcie_bandwidth_gbps if gpu else None
    hbm = gpu.memory_bandwidth_gbps if gpu else None
    biggest = max(sizes)
    rng = np.random.default_rng()
    rows: list[dict] = []
    with cp.cuda.Device(device):
        stream = cp.cuda.Stream(non_blocking=True)

        def gpu_times(fn: Callable[[], None]) -> Timing:
            # spin=False: a copy's figure includes what issuing it costs. A pageable
            # copy is staged through a pinned buffer by the host, which is part of its
            # real cost; a spin kernel ahead of the start event would let the first part
            # of that staging (and a small copy's launch) happen outside the interval.
            # flush_l2=False: back-to-back copies are what a copy loop sees. Both keep
            # the figures comparable with those the probe recorded before.
            return benchmark(fn, repeats=max_repeats, warmup=1, min_time_s=min_time_s,
                             flush_l2=False, spin=False, gpu=True, stream=stream)

        dev_src = cp.random.randint(0, 256, biggest, dtype=cp.uint8)
        dev_dst = cp.empty(biggest, dtype=cp.uint8)
        need_pageable = any(k.endswith("pageable") for k in kinds)
        need_pinned = any(k.endswith("pinned") for k in kinds)
        host_src = rng.integers(0, 256, biggest, dtype=np.uint8) if need_pageable else None
        host_dst = rng.integers(0, 256, biggest, dtype=np.uint8) if need_pageable else None
        pinned_mem = cp.cuda.alloc_pinned_memory(biggest) if need_pinned else None
        pinned = (np.frombuffer(pinned_mem, np.uint8, biggest) if need_pinned else None)
        if pinned is not None:
            pinned[:] = rng.integers(0, 256, biggest, dtype=np.uint8)

        h2d, d2h, d2d = rt.memcpyHostToDevice, rt.memcpyDeviceToHost, rt.memcpyDeviceToDevice
        plan: list[tuple[str, int, int, int, float | None, int]] = []
        for kind in kinds:
            if kind == "h2d_pageable":
                plan.append((kind, dev_dst.data.ptr, host_src.ctypes.data, h2d, pcie, 1))
            elif kind == "h2d_pinned":
                plan.append((kind, dev_dst.data.ptr, pinned.ctypes.data, h2d, pcie, 1))
            elif kind == "d2h_pageable":
                plan.append((kind, host_dst.ctypes.data, dev_src.data.ptr, d2h, pcie, 1))
            elif kind == "d2h_pinned":
                plan.append((kind, pinned.ctypes.data, dev_src.data.ptr, d2h, pcie, 1))
            elif kind == "d2d":
                plan.append((kind, dev_dst.data.ptr, dev_src.data.ptr, d2d, hbm, 2))
        for kind, dst, src, direction, theo, factor in plan:
            for size in sizes:
                timing = gpu_times(lambda dst=dst, src=src, size=size, direction=direction:
                                   rt.memcpyAsync(dst, src, size, direction, stream.ptr))
                rows.append(_finish(_row(kind, device, None, size, timer="cuda events"),
                                    timing, factor * size, theo))
        _verify_copies(cp, dev_src, dev_dst, pinned, host_dst, kinds, sizes)

        if "peer" in kinds:
            rows += _probe_peers(cp, device, sizes, gpu_times, stream, profile)
        del dev_src, dev_dst, pinned, pinned_mem
    return rows


def _verify_copies(cp: Any, dev_src: Any, dev_dst: Any, pinned: Any, host_dst: Any,
                   kinds: list[str], sizes: list[int]) -> None:
    """The last copies of each kind must have moved the right bytes, or nothing counts."""
    n = max(sizes)
    if "d2d" in kinds and not bool(cp.array_equal(dev_src[:n], dev_dst[:n])):
        raise PycLabError("device-to-device copy produced wrong bytes; results discarded")
    expect = None
    for kind, host in (("d2h_pinned", pinned), ("d2h_pageable", host_dst)):
        if kind in kinds and host is not None:
            expect = cp.asnumpy(dev_src[:n]) if expect is None else expect
            if not np.array_equal(host[:n], expect):
                raise PycLabError(f"{kind} copy produced wrong bytes; results discarded")


def _probe_peers(cp: Any, device: int, sizes: list[int], gpu_times: Callable,
                 stream: Any, profile: HardwareProfile) -> list[dict]:
    rt = cp.cuda.runtime
    rows = []
    n = rt.getDeviceCount()
    if n < 2:
        return [_row("peer", device, None, None, status="needs two or more GPUs")]
    for peer in range(n):
        if peer == device:
            continue
        if not rt.deviceCanAccessPeer(device, peer):
            rows.append(_row("peer", device, peer, None, status="no peer access"))
            continue
        link = profile.link(device, peer) if len(profile.gpus) > max(device, peer) else None
        theo = None
        if link is not None and link.nvlinks:
            version = profile.gpu(device).nvlink_version or 4
            theo = link.nvlinks * NVLINK_LINK_GBPS.get(version, 25.0)
        elif profile.gpus:
            theo = profile.gpu(device).pcie_bandwidth_gbps
        rows += _probe_one_peer(cp, device, peer, sizes, gpu_times, stream, theo)
    return rows


def _probe_one_peer(cp: Any, device: int, peer: int, sizes: list[int], gpu_times: Callable,
                    stream: Any, theoretical: float | None) -> list[dict]:
    rt = cp.cuda.runtime
    for a, b in ((device, peer), (peer, device)):
        with cp.cuda.Device(a), contextlib.suppress(Exception):  # already enabled is fine
            rt.deviceEnablePeerAccess(b)
    with cp.cuda.Device(peer):
        peer_dst = cp.empty(max(sizes), dtype=cp.uint8)
    src = cp.random.randint(0, 256, max(sizes), dtype=cp.uint8)
    rows = []
    for size in sizes:
        timing = gpu_times(lambda size=size: rt.memcpyPeerAsync(
            peer_dst.data.ptr, peer, src.data.ptr, device, size, stream.ptr))
        rows.append(_finish(_row("peer", device, peer, size, timer="cuda events"),
                            timing, size, theoretical))
    stream.synchronize()
    if not np.array_equal(cp.asnumpy(peer_dst), cp.asnumpy(src)):
        raise PycLabError(f"peer copy GPU{device}->GPU{peer} produced wrong bytes")
    return rows


def bandwidth_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per kind (and peer): the best measured GB/s, at which size, and % of theoretical."""
    import pandas as pd

    ok = frame[frame["status"] == "ok"]
    rows = []
    for (kind, peer), group in ok.groupby(["kind", ok["peer"].fillna(-1)], sort=False):
        best = group.loc[group["gbps"].idxmax()]
        rows.append(
            {
                "kind": kind if peer == -1 else f"{kind} ->GPU{int(peer)}",
                "best_gbps": best["gbps"],
                "at_size": best["size"],
                "theoretical_gbps": best["theoretical_gbps"],
                "pct_of_theoretical": best["pct_of_theoretical"],
                "note": "",
            }
        )
    skipped = frame[frame["status"] != "ok"]
    for status, group in skipped.groupby("status", sort=False):
        rows.append({"kind": ", ".join(dict.fromkeys(group["kind"])), "best_gbps": None,
                     "at_size": None, "theoretical_gbps": None, "pct_of_theoretical": None,
                     "note": status})
    columns = ["kind", "best_gbps", "at_size", "theoretical_gbps", "pct_of_theoretical"]
    if len(skipped):
        columns.append("note")
    return pd.DataFrame(rows, columns=columns)
