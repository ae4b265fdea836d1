"""PinnedPool: size classes, reuse, stats, release, NUMA placement (NumPy path here)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.hardware.device import cupy_status
from pyc_lab.hardware.profile import GPUInfo, HardwareProfile, HostInfo, NumaNode
from pyc_lab.runtime import pinned
from pyc_lab.runtime.pinned import PinnedPool, parse_numa_maps, size_class

MIB = 2**20
HAS_GPU = cupy_status()[0] is not None


@pytest.mark.parametrize(
    ("asked", "cap"),
    [
        (0, 4096),
        (1, 4096),
        (4096, 4096),
        (4097, 8192),
        (1_000_000, 2**20),
        (2 * MIB - 1, 2 * MIB),
        (2 * MIB, 2 * MIB),
        (2 * MIB + 1, 4 * MIB),
        (3 * MIB, 4 * MIB),
        (65 * MIB, 66 * MIB),
    ],
)
def test_size_class(asked: int, cap: int) -> None:
    assert size_class(asked) == cap


def test_size_class_never_doubles_large_requests() -> None:
    asked = 234 * 10**9
    cap = size_class(asked)
    assert cap % (2 * MIB) == 0
    assert asked <= cap < asked + 2 * MIB
    assert cap < 256 * 10**9  # CuPy's pinned pool would use the next power of two


def test_size_class_negative() -> None:
    with pytest.raises(PycLabError, match="negative"):
        size_class(-1)


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU fallback")
def test_no_gpu_mode_says_so() -> None:
    pool = PinnedPool(device=0)
    assert pool.mode.startswith("numpy (no GPU: ")
    assert not pool.pinned
    assert pool.stats()["mode"] == pool.mode


def test_cpu_mode_requested() -> None:
    pool = PinnedPool(device=None, mode="cpu")
    assert pool.mode == "numpy (CPU mode requested)"
    with pytest.raises(PycLabError, match="mode"):
        PinnedPool(mode="tpu")


def test_acquire_view_reuse_and_stats() -> None:
    with PinnedPool(device=None, mode="cpu") as pool:
        buf = pool.acquire(3 * MIB)
        assert buf.capacity == 4 * MIB and buf.nbytes == 3 * MIB
        a = buf.array(np.float32, (MIB // 4, 3))
        a[:] = 1.5
        assert a.shape == (MIB // 4, 3) and a.dtype == np.float32
        assert a.flags.c_contiguous
        with pytest.raises(PycLabError, match="needs"):
            buf.array(np.float64, (MIB,))
        s = pool.stats()
        assert (s["misses"], s["hits"], s["buffers"], s["in_use"]) == (1, 0, 1, 1)
        assert s["bytes_pinned"] == s["bytes_in_use"] == 4 * MIB
        assert s["bytes_requested"] == 3 * MIB

        buf.release()
        buf.release()  # idempotent
        assert pool.stats()["bytes_in_use"] == 0
        with pytest.raises(PycLabError, match="released"):
            buf.array(np.uint8, 1)

        again = pool.acquire(3 * MIB + 5)  # same class: a hit, same memory
        assert again is buf
        other = pool.acquire(1000)  # a different class: a miss
        s = pool.stats()
        assert (s["hits"], s["misses"], s["buffers"]) == (1, 2, 2)
        assert s["bytes_pinned"] == 4 * MIB + 4096
        other.release()
        again.release()
        assert pool.stats()["bytes_in_use"] == 0


def test_buffer_context_manager_and_trim() -> None:
    pool = PinnedPool(device=None, mode="cpu")
    with pool.acquire(10) as b:
        assert b.in_use
    assert not b.in_use
    keep = pool.acquire(3 * MIB)
    assert pool.trim() == 4096
    s = pool.stats()
    assert s["buffers"] == 1 and s["bytes_pinned"] == 4 * MIB
    keep.release()
    pool.close()


def test_release_all_and_close() -> None:
    pool = PinnedPool(device=None, mode="cpu")
    held = pool.acquire(5000)
    pool.acquire(100).release()
    pool.release_all()
    s = pool.stats()
    assert s["bytes_pinned"] == 0 and s["bytes_in_use"] == 0 and s["buffers"] == 0
    with pytest.raises(PycLabError, match="released"):
        held.array(np.uint8, 10)
    pool.close()
    with pytest.raises(PycLabError, match="closed"):
        pool.acquire(1)


def test_discard() -> None:
    pool = PinnedPool(device=None, mode="cpu")
    b = pool.acquire(100)
    pool.discard(b)
    s = pool.stats()
    assert s["buffers"] == 0 and s["bytes_in_use"] == 0 and s["discarded"] == 1
    assert pool.acquire(100) is not b


def test_threads_share_the_pool() -> None:
    pool = PinnedPool(device=None, mode="cpu")
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(50):
                with pool.acquire(8192) as b:
                    b.array(np.uint8, 8192)[:] = 7
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors
    s = pool.stats()
    assert s["bytes_in_use"] == 0 and s["hits"] + s["misses"] == 200 and s["buffers"] <= 4


FAKE_MAPS = """\
00400000 default file=/usr/bin/python3 mapped=10 N0=10 kernelpagesize_kB=4
7f0000000000 default anon=512 dirty=512 N0=300 N1=212 kernelpagesize_kB=4
7f0000200000 interleave:0-1 anon=4 dirty=4 N1=4 kernelpagesize_kB=4
7f0000400000 default file=/lib/libc.so.6
not-an-address garbage
"""


def test_parse_numa_maps() -> None:
    assert parse_numa_maps(FAKE_MAPS, 0x7F0000000000) == {0: 300, 1: 212}
    assert parse_numa_maps(FAKE_MAPS, 0x7F0000001234) == {0: 300, 1: 212}
    assert parse_numa_maps(FAKE_MAPS, 0x7F0000200010) == {1: 4}
    assert parse_numa_maps(FAKE_MAPS, 0x7F0000400000) == {}  # no pages faulted in
    assert parse_numa_maps(FAKE_MAPS, 0x1000) == {}  # below every mapping
    assert parse_numa_maps("", 0x1000) == {}


def _two_node_profile() -> HardwareProfile:
    host = HostInfo(numa_nodes=[NumaNode(0, [0, 1]), NumaNode(1, [4096, 4097])])
    return HardwareProfile(host=host, gpus=[GPUInfo(0, numa_node=1, cpu_affinity=[4096])])


def test_placement_with_faked_topology(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = PinnedPool(device=0, profile=_two_node_profile(), mode="cpu")
    assert pool.wanted_node == 1 and pool.node_cpus == [4096, 4097]
    buf = pool.acquire(3 * MIB)
    assert buf.wanted_node == 1
    assert buf.unbound_reason and "4096" in buf.unbound_reason  # no such CPUs here

    text = f"{buf.address - 4096:x} default anon=768 dirty=768 N1=700 N0=68 kernelpagesize_kB=4\n"
    monkeypatch.setattr(pinned, "_move_pages_nodes", lambda *a, **k: None)
    monkeypatch.setattr(pinned, "_read_numa_maps", lambda: text)
    (row,) = pool.placement()
    assert row["buffer"] == buf.id and row["nbytes"] == 4 * MIB
    assert row["wanted_node"] == 1 and row["actual_node"] == 1
    assert row["how"].startswith("numa_maps") and "first touch unbound" in row["how"]
    assert buf.numa_node == 1

    monkeypatch.setattr(pinned, "_read_numa_maps", lambda: None)
    (row,) = pool.placement()
    assert row["actual_node"] is None and row["how"].startswith("no NUMA info")
    buf.release()
    pool.close()


def test_explicit_numa_node_wins() -> None:
    pool = PinnedPool(device=0, numa_node=0, profile=_two_node_profile(), mode="cpu")
    assert pool.wanted_node == 0 and pool.node_cpus == [0, 1]


def test_profile_without_that_gpu() -> None:
    pool = PinnedPool(device=3, profile=_two_node_profile(), mode="cpu")
    assert pool.wanted_node is None


def test_placement_on_this_machine() -> None:
    with PinnedPool(device=None, mode="cpu") as pool, pool.acquire(3 * MIB):
        (row,) = pool.placement()
        assert row["wanted_node"] is None
        assert row["actual_node"] is None or row["actual_node"] >= 0
        assert isinstance(row["how"], str) and row["how"]


@pytest.mark.gpu
def test_gpu_pool_pins_and_reuses() -> None:  # pragma: no cover - needs a GPU
    import cupy

    with PinnedPool(device=0) as pool:
        assert pool.mode == "cuda-pinned" and pool.pinned
        buf = pool.acquire(3 * MIB)
        host = buf.array(np.float32, (MIB // 4,))
        host[:] = 2.0
        dev = cupy.empty_like(host)
        stream = cupy.cuda.Stream(non_blocking=True)
        dev.set(host, stream=stream)
        stream.synchronize()
        assert float(dev.sum()) == 2.0 * host.size
        buf.release()
        assert pool.acquire(3 * MIB) is buf
        assert pool.placement()[0]["wanted_node"] == pool.wanted_node


@pytest.mark.gpu
def test_gpu_pools_place_buffers_on_each_gpus_numa_node() -> None:  # pragma: no cover
    """For every visible GPU: the pool's buffers land on that GPU's NUMA node (when the
    machine says which node that is and where pages are)."""
    import cupy

    for g in range(cupy.cuda.runtime.getDeviceCount()):
        with PinnedPool(device=g) as pool:
            buf = pool.acquire(8 * MIB)
            buf.raw[:] = 1  # every page touched (and pinned) already; write anyway
            (row,) = pool.placement()
            assert row["wanted_node"] == pool.wanted_node
            if pool.wanted_node is not None and row["actual_node"] is not None:
                assert row["actual_node"] == pool.wanted_node, (g, row)
            buf.release()


def test_a_buffer_allocated_while_the_pool_closes_is_freed_not_left_in_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pool = PinnedPool(device=None, mode="cpu")
    allocating, closed = threading.Event(), threading.Event()
    real = pool._allocate

    def slow_allocate(capacity: int):  # the allocation is under way when close() runs
        allocating.set()
        assert closed.wait(5)
        return real(capacity)

    monkeypatch.setattr(pool, "_allocate", slow_allocate)
    box: dict[str, object] = {}

    def acquire() -> None:
        try:
            box["buf"] = pool.acquire(1000)
        except PycLabError as exc:
            box["exc"] = exc

    t = threading.Thread(target=acquire, daemon=True)
    t.start()
    assert allocating.wait(5)
    pool.close()
    closed.set()
    t.join(5)
    assert not t.is_alive()
    assert "buf" not in box and "closed while a buffer was being allocated" in str(box["exc"])
    assert pool.stats()["buffers"] == 0  # nothing outlives the closed pool
    with pytest.raises(PycLabError, match="closed"):
        pool.acquire(10)
