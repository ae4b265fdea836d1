"""A pool of page-locked host buffers, sized without power-of-two waste and NUMA-aware.

:class:`PinnedPool` hands out :class:`PinnedBuffer` objects. Sizes are rounded by
:func:`size_class`: small requests to a power of two from 4 KiB, anything of 2 MiB or more
to the next multiple of 2 MiB (CuPy's pinned pool doubles instead: 234 GB asked, 256 GB
pinned). Released buffers are reused by later requests of the same class.

Buffers meant for GPU ``g`` are first touched (and, on a GPU, allocated) from a thread
bound to the CPUs of ``g``'s NUMA node, so the kernel places their pages there;
:meth:`PinnedPool.placement` reports where they actually landed (``move_pages(2)`` or
``/proc/self/numa_maps``). Without a usable GPU the pool hands out ordinary NumPy buffers
and its ``mode`` says so.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PycLabError
from ..hardware.cpulist import parse_cpulist
from ..hardware.device import cupy_status

if TYPE_CHECKING:  # pragma: no cover
    from ..hardware.profile import HardwareProfile

__all__ = ["PinnedBuffer", "PinnedPool", "is_page_locked", "parse_numa_maps", "size_class"]

log = logging.getLogger(__name__)

KIB = 1024
MIB = 1024 * KIB
SMALL_MIN = 4 * KIB
LARGE_STEP = 2 * MIB
PAGE = 4096


def size_class(nbytes: int) -> int:
    """The capacity a request of ``nbytes`` is served with.

    Requests below 2 MiB round up to a power of two (at least 4 KiB); larger ones round
    up to a multiple of 2 MiB, so the waste is under 2 MiB however large the request.

    Examples
    --------
    >>> size_class(1), size_class(5000), size_class(3 * 2**20)
    (4096, 8192, 4194304)
    >>> size_class(234 * 10**9) - 234 * 10**9 < 2**21
    True
    """
    n = int(nbytes)
    if n < 0:
        raise PycLabError(f"cannot allocate a negative size ({nbytes!r} bytes)")
    if n < LARGE_STEP:
        cap = SMALL_MIN
        while cap < n:
            cap *= 2
        return cap
    return -(-n // LARGE_STEP) * LARGE_STEP


def parse_numa_maps(text: str, address: int) -> dict[int, int]:
    """Pages per NUMA node of the mapping that holds ``address``, from ``numa_maps`` text.

    ``/proc/<pid>/numa_maps`` lists each mapping by its start address only, so the
    mapping taken is the one with the greatest start ``<= address``. The counts are for
    the whole mapping, which may hold more than one buffer.

    Parameters
    ----------
    text
        Contents of ``/proc/self/numa_maps``.
    address
        An address inside the buffer.

    Returns
    -------
    dict of int to int
        ``{node: pages}``; empty when no mapping starts at or below ``address`` or the
        mapping has no pages faulted in yet.
    """
    best_start = -1
    best_fields: list[str] = []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        try:
            start = int(parts[0], 16)
        except ValueError:
            continue
        if best_start < start <= address:
            best_start, best_fields = start, parts[1:]
    nodes: dict[int, int] = {}
    for f in best_fields:
        if len(f) > 1 and f[0] == "N" and "=" in f:
            key, _, val = f[1:].partition("=")
            if key.isdigit() and val.isdigit():
                nodes[int(key)] = nodes.get(int(key), 0) + int(val)
    return nodes


def _read_numa_maps() -> str | None:
    try:
        return Path("/proc/self/numa_maps").read_text()
    except OSError:
        return None


_MOVE_PAGES_NR = {"x86_64": 279, "aarch64": 239, "ppc64le": 301}


def _move_pages_nodes(address: int, nbytes: int, max_pages: int = 64) -> dict[int, int] | None:
    """Sample the buffer's pages with ``move_pages(2)`` (query only); ``None`` if refused."""
    nr = _MOVE_PAGES_NR.get(platform.machine())
    if nr is None or nbytes <= 0:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    first = address - address % PAGE
    n_pages = max(1, -(-(address + nbytes - first) // PAGE))
    step = max(1, n_pages // max_pages)
    addrs = [first + i * PAGE for i in range(0, n_pages, step)]
    count = len(addrs)
    pages = (ctypes.c_void_p * count)(*addrs)
    status = (ctypes.c_int * count)()
    rc = libc.syscall(
        ctypes.c_long(nr), ctypes.c_long(0), ctypes.c_ulong(count), pages,
        ctypes.c_void_p(None), status, ctypes.c_int(0),
    )
    if rc != 0:
        return None
    nodes: dict[int, int] = {}
    for s in status:
        if s >= 0:
            nodes[s] = nodes.get(s, 0) + step
    return nodes or None


def _node_cpus_sysfs(node: int) -> list[int] | None:
    try:
        return parse_cpulist(Path(f"/sys/devices/system/node/node{node}/cpulist").read_text())
    except (OSError, PycLabError):
        return None


def _run_bound(cpus: list[int] | None, fn: Callable[[], Any]) -> tuple[Any, str | None]:
    """Run ``fn`` on a fresh thread bound to ``cpus``; return (result, why unbound)."""
    box: dict[str, Any] = {}

    def target() -> None:
        if cpus:
            try:
                os.sched_setaffinity(0, cpus)
            except (AttributeError, OSError, ValueError) as exc:
                box["unbound"] = f"could not bind to CPUs {cpus}: {exc}"
        try:
            box["result"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=target, name="pyc-pinned-touch", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("result"), box.get("unbound")


class PinnedBuffer:
    """One buffer from a :class:`PinnedPool`: ``capacity`` bytes, ``nbytes`` of them asked.

    Use :meth:`array` for a typed view, :meth:`release` (or ``with``) to give it back.
    """

    def __init__(self, pool: PinnedPool, ident: int, raw: np.ndarray, handle: Any) -> None:
        self._pool = pool
        self.id = ident
        self._raw = raw
        self._handle = handle  # GPU: the hostAlloc pointer; CPU: None
        self.capacity = int(raw.nbytes)
        self.nbytes = 0
        self.wanted_node: int | None = None
        self.unbound_reason: str | None = None
        self.in_use = False

    @property
    def address(self) -> int:
        """The buffer's host address."""
        return int(self._raw.ctypes.data)

    @property
    def raw(self) -> np.ndarray:
        """The whole buffer as a 1-D ``uint8`` array of ``capacity`` bytes."""
        self._check()
        return self._raw

    def _check(self) -> None:
        if not self.in_use:
            raise PycLabError(
                f"pinned buffer {self.id} was released; acquire a new one from the pool"
            )

    def array(self, dtype: Any, shape: int | tuple[int, ...]) -> np.ndarray:
        """A C-contiguous view of the buffer with ``dtype`` and ``shape``.

        Raises
        ------
        PycLabError
            If the view needs more than ``capacity`` bytes or the buffer was released.
        """
        self._check()
        dt = np.dtype(dtype)
        shp = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
        need = int(np.prod(shp, dtype=np.int64)) * dt.itemsize
        if need > self.capacity:
            raise PycLabError(
                f"a {dt} array of shape {shp} needs {need} bytes; pinned buffer {self.id} "
                f"holds {self.capacity}; acquire a larger one"
            )
        return self._raw[:need].view(dt).reshape(shp)

    @property
    def numa_node(self) -> int | None:
        """The NUMA node holding most of the buffer's pages, or ``None`` if unknown."""
        return self._pool._where(self)[0]

    def release(self) -> None:
        """Give the buffer back to its pool for reuse (a second call does nothing)."""
        self._pool._release(self)

    def __enter__(self) -> PinnedBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "in use" if self.in_use else "free"
        return (
            f"PinnedBuffer(id={self.id}, nbytes={self.nbytes}, capacity={self.capacity}, "
            f"{state})"
        )


class PinnedPool:
    """Page-locked host buffers pooled by :func:`size_class`, placed on the GPU's NUMA node.

    Parameters
    ----------
    device
        The CUDA device the buffers feed; its NUMA node is where pages are placed.
        ``None``: no device preference.
    numa_node
        Place buffers on this node instead of the device's.
    profile
        A :class:`~pyc_lab.runtime.HardwareProfile` giving the GPU's NUMA node and the
        node's CPUs; without one, sysfs is read (on a GPU, via the device's PCI bus id).
    mode
        ``"auto"`` pins when a CUDA device is usable, else uses NumPy; ``"cpu"`` always
        uses NumPy buffers; ``"gpu"`` requires a device.

    Examples
    --------
    >>> with PinnedPool(device=None, mode="cpu") as pool:
    ...     with pool.acquire(1000) as buf:
    ...         buf.array("float32", (250,)).shape
    (250,)
    """

    def __init__(
        self,
        device: int | None = 0,
        numa_node: int | None = None,
        profile: HardwareProfile | None = None,
        *,
        mode: str = "auto",
    ) -> None:
        if mode not in ("auto", "cpu", "gpu"):
            raise PycLabError(f"PinnedPool mode must be 'auto', 'cpu' or 'gpu', not {mode!r}")
        self.device = device
        self._cp: Any = None
        if mode == "cpu":
            self.mode = "numpy (CPU mode requested)"
        else:
            cp, reason = cupy_status()
            if cp is None:
                if mode == "gpu":
                    from ..hardware.device import require_cupy

                    require_cupy("PinnedPool(mode='gpu')")
                self.mode = f"numpy (no GPU: {reason})"
            else:
                self._cp = cp
                self.mode = "cuda-pinned"
        self.wanted_node, self.node_cpus = self._target(numa_node, profile)
        self._lock = threading.Lock()
        self._free: dict[int, list[PinnedBuffer]] = {}
        self._all: dict[int, PinnedBuffer] = {}
        self._next_id = 0
        self._hits = 0
        self._misses = 0
        self._discarded = 0
        self._closed = False

    @property
    def pinned(self) -> bool:
        """Whether buffers are page-locked (CUDA host allocations)."""
        return self._cp is not None

    # -- placement target ---------------------------------------------------------
    def _target(
        self, numa_node: int | None, profile: HardwareProfile | None
    ) -> tuple[int | None, list[int] | None]:
        node = numa_node
        cpus: list[int] | None = None
        if node is None and profile is not None and self.device is not None:
            try:
                g = profile.gpu(self.device)
                node, cpus = g.numa_node, g.cpu_affinity
            except PycLabError:
                log.info("PinnedPool: profile has no GPU %s; no NUMA preference", self.device)
        if node is None and profile is None and self._cp is not None and self.device is not None:
            node, cpus = self._gpu_numa_sysfs()
        if node is None or node < 0:
            return None, None
        node_cpus = None
        if profile is not None:
            for n in profile.host.numa_nodes:
                if n.id == node and n.cpus:
                    node_cpus = list(n.cpus)
        if node_cpus is None and profile is None:
            node_cpus = _node_cpus_sysfs(node)
        return node, node_cpus or cpus

    def _gpu_numa_sysfs(self) -> tuple[int | None, list[int] | None]:  # pragma: no cover - GPU
        try:
            bus = str(self._cp.cuda.runtime.deviceGetPCIBusId(self.device)).lower()
            base = Path("/sys/bus/pci/devices") / bus
            node = int((base / "numa_node").read_text().strip())
            cpus = parse_cpulist((base / "local_cpulist").read_text())
            return (node if node >= 0 else None), cpus
        except Exception as exc:
            log.info("PinnedPool: NUMA node of GPU %s unknown: %s", self.device, exc)
            return None, None

    # -- allocation -----------------------------------------------------------------
    def _allocate(self, capacity: int) -> tuple[np.ndarray, Any, str | None]:
        cp = self._cp

        def touch(raw: np.ndarray) -> None:
            raw[::PAGE] = 0  # first touch: one write per page places it on this node
            if raw.size:
                raw[-1] = 0

        if cp is None:

            def alloc_cpu() -> tuple[np.ndarray, Any]:
                raw = np.empty(capacity, dtype=np.uint8)
                touch(raw)
                return raw, None

            (raw, handle), unbound = _run_bound(self.node_cpus, alloc_cpu)
            return raw, handle, unbound

        def alloc_gpu() -> tuple[np.ndarray, Any]:  # pragma: no cover - needs a GPU
            rt = cp.cuda.runtime
            dev = self.device if self.device is not None else 0
            with cp.cuda.Device(dev):
                ptr = rt.hostAlloc(capacity, rt.hostAllocPortable)
            raw = np.ctypeslib.as_array((ctypes.c_ubyte * capacity).from_address(ptr))
            touch(raw)
            return raw, ptr

        (raw, handle), unbound = _run_bound(self.node_cpus, alloc_gpu)
        return raw, handle, unbound

    def _free_memory(self, buf: PinnedBuffer) -> None:
        if buf._handle is not None and self._cp is not None:  # pragma: no cover - GPU
            try:
                self._cp.cuda.runtime.freeHost(buf._handle)
            except Exception as exc:
                log.warning("PinnedPool: freeHost of buffer %s failed: %s", buf.id, exc)
        buf._handle = None
        buf._raw = np.empty(0, dtype=np.uint8)

    def acquire(self, nbytes: int) -> PinnedBuffer:
        """A buffer of at least ``nbytes`` bytes, reused from the pool when one is free.

        Raises
        ------
        PycLabError
            If the pool is closed or ``nbytes`` is negative.
        """
        cap = size_class(nbytes)
        with self._lock:
            if self._closed:
                raise PycLabError("PinnedPool is closed; create a new one")
            free = self._free.get(cap)
            if free:
                buf = free.pop()
                self._hits += 1
                buf.in_use, buf.nbytes = True, int(nbytes)
                return buf
            self._misses += 1
            ident = self._next_id
            self._next_id += 1
        try:
            raw, handle, unbound = self._allocate(cap)
        except Exception as exc:
            raise PycLabError(
                f"could not allocate a {cap}-byte host buffer ({self.mode}): {exc}"
            ) from exc
        buf = PinnedBuffer(self, ident, raw, handle)
        buf.in_use, buf.nbytes = True, int(nbytes)
        buf.wanted_node, buf.unbound_reason = self.wanted_node, unbound
        with self._lock:  # closed while allocating: the buffer must not outlive the pool
            closed = self._closed
            if not closed:
                self._all[ident] = buf
        if closed:
            buf.in_use = False
            self._free_memory(buf)
            raise PycLabError("PinnedPool was closed while a buffer was being allocated; "
                              "create a new pool")
        return buf

    def _release(self, buf: PinnedBuffer) -> None:
        with self._lock:
            if not buf.in_use or self._all.get(buf.id) is not buf:
                return
            buf.in_use = False
            self._free.setdefault(buf.capacity, []).append(buf)

    def discard(self, buf: PinnedBuffer) -> None:
        """Drop ``buf`` from the pool without reusing it (a hung stage may still write it).

        NumPy memory goes when its last reference does; page-locked memory is leaked on
        purpose (freeing it under a running copy would corrupt memory) and counted in
        ``stats()["discarded"]``.
        """
        with self._lock:
            if self._all.pop(buf.id, None) is None:
                return
            if not buf.in_use:
                self._free.get(buf.capacity, []).remove(buf)
            buf.in_use = False
            self._discarded += 1
        if buf._handle is None:
            buf._raw = np.empty(0, dtype=np.uint8)

    def release_all(self) -> None:
        """Return every buffer to the pool and free (unpin) all of them.

        Buffers still held become unusable; their :meth:`PinnedBuffer.array` raises.
        """
        with self._lock:
            bufs = list(self._all.values())
            held = [b.id for b in bufs if b.in_use]
            self._all.clear()
            self._free.clear()
            for b in bufs:
                b.in_use = False
        if held:
            log.warning("PinnedPool.release_all: buffers %s were still in use", held)
        for b in bufs:
            self._free_memory(b)

    def trim(self) -> int:
        """Free buffers that are not in use; return the bytes freed."""
        with self._lock:
            idle = [b for lst in self._free.values() for b in lst]
            self._free.clear()
            for b in idle:
                self._all.pop(b.id, None)
        for b in idle:
            self._free_memory(b)
        return sum(b.capacity for b in idle)

    def close(self) -> None:
        """Refuse further requests, then free every buffer (an allocation under way when
        the pool closes frees its buffer and raises)."""
        with self._lock:
            self._closed = True
        self.release_all()

    def __enter__(self) -> PinnedPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reporting -------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Pool counters.

        Returns
        -------
        dict
            ``bytes_pinned`` (capacity held by the pool, in use or free), ``bytes_in_use``
            (capacity handed out), ``bytes_requested`` (what callers asked for, in use),
            ``hits``, ``misses``, ``buffers``, ``in_use``, ``discarded``, ``mode``,
            ``wanted_node``.
        """
        with self._lock:
            bufs = list(self._all.values())
            return {
                "mode": self.mode,
                "bytes_pinned": sum(b.capacity for b in bufs),
                "bytes_in_use": sum(b.capacity for b in bufs if b.in_use),
                "bytes_requested": sum(b.nbytes for b in bufs if b.in_use),
                "hits": self._hits,
                "misses": self._misses,
                "buffers": len(bufs),
                "in_use": sum(b.in_use for b in bufs),
                "discarded": self._discarded,
                "wanted_node": self.wanted_node,
            }

    def _where(self, buf: PinnedBuffer) -> tuple[int | None, str]:
        if buf.capacity == 0 or buf._raw.size == 0:
            return None, "buffer freed"
        nodes = _move_pages_nodes(buf.address, buf.capacity)
        how = "move_pages"
        if not nodes:
            text = _read_numa_maps()
            if text is None:
                return None, "no NUMA info: /proc/self/numa_maps unreadable and move_pages refused"
            nodes = parse_numa_maps(text, buf.address)
            how = "numa_maps (whole mapping)"
            if not nodes:
                return None, "no NUMA info: numa_maps lists no pages for the buffer"
        node = max(nodes, key=lambda n: nodes[n])
        if len(nodes) > 1:
            how += f", split {dict(sorted(nodes.items()))}"
        return node, how

    def placement(self) -> list[dict[str, Any]]:
        """Where each buffer's pages are: one dict per buffer.

        Keys: ``buffer`` (id), ``nbytes`` (capacity), ``in_use``, ``wanted_node``,
        ``actual_node`` (node holding most pages, ``None`` when unknown) and ``how``
        (``move_pages``, ``numa_maps`` or why nothing is known).
        """
        with self._lock:
            bufs = sorted(self._all.values(), key=lambda b: b.id)
        rows = []
        for b in bufs:
            node, how = self._where(b)
            if b.unbound_reason:
                how += f"; first touch unbound: {b.unbound_reason}"
            rows.append(
                {
                    "buffer": b.id,
                    "nbytes": b.capacity,
                    "in_use": b.in_use,
                    "wanted_node": b.wanted_node,
                    "actual_node": node,
                    "how": how,
                }
            )
        return rows

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"PinnedPool({s['mode']}, {s['buffers']} buffer(s), {s['bytes_pinned']} bytes, "
            f"{s['bytes_in_use']} in use, node {self.wanted_node})"
        )


def is_page_locked(array: np.ndarray, cupy: Any = None) -> bool:
    """Whether ``array``'s memory is page-locked host memory CUDA knows of.

    ``cudaHostAlloc`` / ``cudaHostRegister`` memory (a :class:`PinnedPool` buffer, CuPy's
    ``alloc_pinned_memory``, a pinned torch tensor's NumPy view) answers ``True``; pageable
    memory, or any array when no GPU is usable, ``False``.

    Parameters
    ----------
    array
        A NumPy array (only its data pointer is looked at).
    cupy
        The CuPy module, when the caller already has it.
    """
    cp = cupy
    if cp is None:
        cp, _reason = cupy_status()
        if cp is None:
            return False
    if not isinstance(array, np.ndarray) or array.nbytes == 0:
        return False
    try:  # pragma: no cover - needs a GPU
        attrs = cp.cuda.runtime.pointerGetAttributes(array.ctypes.data)
    except Exception:  # pageable memory on older runtimes raises instead of answering
        return False
    return int(getattr(attrs, "type", 0)) == 1  # pragma: no cover - cudaMemoryTypeHost
