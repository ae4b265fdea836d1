"""The one timing primitive: ``benchmark`` and its ``Timing``.

The host path runs here; the GPU path runs against a recording fake of the few CuPy calls
it makes (the order of flush, spin, events and the call; sizes; caching per device), and
for real in the tests marked ``gpu``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import types

import pytest

from pyc_lab.errors import DeviceUnavailableError, PycLabError
from pyc_lab.hardware import device as device_mod
from pyc_lab.paths import native_dir, native_source
from pyc_lab.profiling import Timing, benchmark
from pyc_lab.profiling import timing as timing_mod

MS = 1e-3
US = 1e-6
TICK = 2.0**-10  # ~0.977 ms, exact in binary


class FakeClock:
    """``perf_counter`` that only moves when the timed function says so (by binary
    fractions of a second, so that every difference is exact)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing_mod, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


class Counter:
    """A function that counts its calls and advances the fake clock by ``cost_s``."""

    def __init__(self, clock: FakeClock | None = None, cost_s: float = 0.0) -> None:
        self.calls: list[tuple] = []
        self.clock, self.cost_s = clock, cost_s
        self.__name__ = "f"

    def __call__(self, *args, **kwargs) -> None:
        self.calls.append((args, kwargs))
        if self.clock is not None:
            self.clock.advance(self.cost_s)


# -- the host path ------------------------------------------------------------------------
def test_host_path_makes_warmup_plus_timed_calls_with_the_arguments():
    f = Counter()
    t = benchmark(f, (1, 2), {"k": 3}, repeats=5, warmup=3, gpu=False)
    assert len(f.calls) == 3 + 5
    assert all(c == ((1, 2), {"k": 3}) for c in f.calls)
    assert isinstance(t, Timing)
    assert t.n == 5 and len(t.cpu_s) == 5 and t.gpu_s is None
    assert t.warmup == 3 and t.flushed_l2 is False and t.name == "f"
    assert t.device == "CPU (no GPU: gpu=False asks for host timing)"
    assert all(s >= 0 for s in t.cpu_s)
    assert t.median_s == t.cpu_median_s and t.gpu_median_s is None


def test_auto_falls_back_to_the_host_and_says_why(monkeypatch):
    monkeypatch.setattr(timing_mod, "cupy_status", lambda: (None, "no driver (test)"))
    t = benchmark(Counter(), repeats=2, warmup=0, flush_l2=True)
    assert t.gpu_s is None and t.flushed_l2 is False
    assert t.device == "CPU (no GPU: no driver (test))"
    assert t.summary().endswith("per call (2 calls, 0 warm-up; CPU (no GPU: no driver (test)))")


def test_gpu_true_without_a_device_raises_naming_the_feature(monkeypatch):
    monkeypatch.setattr(device_mod, "cupy_status", lambda: (None, "no driver (test)"))
    f = Counter()
    with pytest.raises(DeviceUnavailableError) as err:
        benchmark(f, gpu=True)
    assert "benchmark(gpu=True)" in str(err.value)
    assert "needs a CUDA device: no driver (test)" in str(err.value)
    assert f.calls == []


@pytest.mark.parametrize("cost_s, min_time_s, repeats, expected", [
    (TICK, 10 * TICK, 50, 10),   # 10 calls of one tick make 10 ticks
    (TICK, 1.0, 50, 50),         # capped by repeats
    (TICK, 1e-6, 50, 3),         # at least 3
    (TICK, 1e-6, 2, 2),          # ... unless repeats says fewer
    (0.0, 0.010, 40, 40),        # an immeasurably fast call: as many as allowed
])
def test_min_time_chooses_the_number_of_timed_calls(clock, cost_s, min_time_s, repeats,
                                                    expected):
    f = Counter(clock, cost_s)
    t = benchmark(f, repeats=repeats, warmup=2, min_time_s=min_time_s, gpu=False)
    assert t.n == expected
    assert len(f.calls) == 2 + 1 + expected  # warm-up, the one call that sizes, timed


def test_fake_clock_gives_an_exact_deterministic_summary(clock):
    t = benchmark(Counter(clock, TICK), repeats=10, warmup=2, gpu=False)
    assert t.cpu_s == (TICK,) * 10
    assert t.median_s == TICK and t.spread == 0.0
    assert t.summary() == ("f: CPU 977 us ± 0 us per call (10 calls, 2 warm-up; "
                           "CPU (no GPU: gpu=False asks for host timing))")


def test_name_defaults_to_the_function_and_can_be_given():
    assert benchmark(lambda: None, repeats=1, warmup=0, gpu=False).name == "<lambda>"
    assert benchmark(Counter(), repeats=1, warmup=0, gpu=False, name="copy").name == "copy"


def test_an_exception_in_fn_propagates_unchanged():
    def boom():
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        benchmark(boom, gpu=False)


@pytest.mark.parametrize("kwargs, message", [
    ({"fn": 3}, "benchmark needs a callable, got int 3"),
    ({"args": 5}, "args must be a tuple of positional arguments, got int"),
    ({"kwargs": [1]}, "kwargs must be a mapping or None"),
    ({"repeats": 0}, "repeats must be an integer >= 1"),
    ({"repeats": 2.5}, "repeats must be an integer >= 1"),
    ({"repeats": True}, "repeats must be an integer >= 1"),
    ({"warmup": -1}, "warmup must be an integer >= 0"),
    ({"min_time_s": 0}, "min_time_s must be a number of seconds > 0, or None"),
    ({"min_time_s": -1.0}, "min_time_s must be a number of seconds > 0, or None"),
    ({"min_time_s": math.nan}, "min_time_s must be a number of seconds > 0, or None"),
    ({"min_time_s": "1"}, "min_time_s must be a number of seconds > 0, or None"),
    ({"gpu": "yes"}, "gpu must be None"),
])
def test_bad_arguments_raise_clear_errors_before_any_call(kwargs, message):
    f = Counter()
    call = {"fn": f, **kwargs}
    with pytest.raises(PycLabError, match=message):
        benchmark(call.pop("fn"), **call)
    assert f.calls == []


# -- the Timing ---------------------------------------------------------------------------
def _h200_timing(name: str = "f") -> Timing:
    # medians 8.12 / 24.3 us; inclusive quartiles 7.91..8.33 and 23.2..25.4 us
    return Timing(name, cpu_s=(22.1 * US, 24.3 * US, 26.5 * US),
                  gpu_s=(7.70 * US, 8.12 * US, 8.54 * US), warmup=2, flushed_l2=True,
                  device="NVIDIA H200")


def test_summary_and_repr_are_one_line_gpu_then_cpu():
    t = _h200_timing()
    line = ("f: GPU 8.12 us ± 0.21 us, CPU 24.3 us ± 1.1 us per call "
            "(3 calls, 2 warm-up, L2 flushed; NVIDIA H200)")
    assert t.summary() == line and repr(t) == line


def test_statistics_use_gpu_times_when_present():
    t = _h200_timing()
    assert t.n == 3
    assert t.median_s == pytest.approx(8.12 * US) and t.gpu_median_s == t.median_s
    assert t.median_ms == pytest.approx(8.12e-3)
    assert t.cpu_median_s == pytest.approx(24.3 * US)
    assert t.spread == pytest.approx(0.42 / 8.12)


def test_one_call_has_no_spread_and_a_singular_count():
    t = Timing("g", cpu_s=(2.5,), gpu_s=None, warmup=0, flushed_l2=False, device="CPU (x)")
    assert t.spread == 0.0
    assert t.summary() == "g: CPU 2.5 s ± 0 s per call (1 call, 0 warm-up; CPU (x))"


def test_units_follow_the_median():
    def line(seconds: float) -> str:
        return Timing("h", (seconds,), None, 0, False, "d").summary().split(": ", 1)[1]

    assert line(3.2e-9).startswith("CPU 3.2 ns")
    assert line(45e-6).startswith("CPU 45 us")
    assert line(0.9999996).startswith("CPU 1000 ms")  # not "1e+03 ms"
    assert line(12.0).startswith("CPU 12 s")


def test_html_is_a_small_deterministic_escaped_table():
    a, b = _h200_timing("<lambda>")._repr_html_(), _h200_timing("<lambda>")._repr_html_()
    assert a == b
    assert a.startswith("<table class='pyc-lab-timing'><caption>&lt;lambda&gt;: per call")
    assert "<tr><th>GPU</th><td>8.12 us</td><td>0.21 us</td><td>7.7 us</td>" in a
    assert "<tr><th>CPU</th><td>24.3 us</td>" in a
    host = Timing("k", (1e-3, 2e-3), None, 1, False, "CPU (no GPU: x)")._repr_html_()
    assert "<th>GPU</th>" not in host and "CPU (no GPU: x)" in host


def test_to_dict_is_json_able_and_complete():
    d = json.loads(json.dumps(_h200_timing().to_dict()))
    assert d["name"] == "f" and d["device"] == "NVIDIA H200" and d["n"] == 3
    assert d["warmup"] == 2 and d["flushed_l2"] is True
    assert d["median_s"] == pytest.approx(8.12e-6) and d["gpu_median_s"] == d["median_s"]
    assert d["cpu_median_s"] == pytest.approx(24.3e-6)
    assert d["spread"] == pytest.approx(0.42 / 8.12)
    assert len(d["cpu_s"]) == len(d["gpu_s"]) == 3
    host = Timing("k", (1e-3,), None, 0, False, "CPU")
    assert host.to_dict()["gpu_s"] is None and host.to_dict()["gpu_median_s"] is None


def test_timing_is_frozen_and_checks_its_lengths():
    with pytest.raises(AttributeError):
        _h200_timing().name = "other"
    with pytest.raises(PycLabError, match="at least one timed call"):
        Timing("x", (), None, 0, False, "CPU")
    with pytest.raises(PycLabError, match="one GPU time per call"):
        Timing("x", (1.0, 2.0), (1.0,), 0, False, "GPU")


# -- the package face and the native source -----------------------------------------------
def test_exported_lazily_without_importing_cupy():
    import pyc_lab.profiling as profiling

    assert "benchmark" in dir(profiling) and "Timing" in dir(profiling)
    code = ("import sys, pyc_lab.profiling as p; p.benchmark; p.Timing; "
            "assert 'cupy' not in sys.modules, 'cupy imported'")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_spin_kernel_source_ships_in_native():
    src = native_source("spin.cu")
    assert 'extern "C" __global__ void pyc_spin(long long cycles)' in src
    assert "clock64()" in src
    readme = (native_dir() / "README.md").read_text(encoding="utf-8")
    assert "| `spin.cu` |" in readme and "profiling/timing.py" in readme


def test_spin_length_covers_the_host_time_within_bounds():
    assert timing_mod._spin_seconds(0.0) == pytest.approx(100 * US)
    assert timing_mod._spin_seconds(20 * US) == pytest.approx(100 * US)
    assert timing_mod._spin_seconds(2 * MS) == pytest.approx(4 * MS)
    assert timing_mod._spin_seconds(1.0) == pytest.approx(50 * MS)


# -- the GPU path against a recording fake of CuPy --------------------------------------------
class FakeCupy:
    """The CuPy calls :func:`benchmark` makes, recorded in :attr:`log`."""

    uint8 = "uint8"
    CLOCK_KHZ = 1_000_000  # 1 GHz: 1 cycle per ns
    L2 = 50 << 20
    ELAPSED_MS = 0.5

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.current_device = 0
        fake = self

        class Stream:
            def __init__(self, name: str, device_id: int = -1) -> None:
                self.name, self.device_id = name, device_id

            def __enter__(self):
                fake.log.append(("enter stream", self.name))
                fake.current_stream = self
                return self

            def __exit__(self, *exc):
                fake.log.append(("exit stream", self.name))
                fake.current_stream = fake.default_stream

            def __repr__(self) -> str:
                return self.name

        class Device:
            def __init__(self, device_id: int | None = None) -> None:
                self.id = fake.current_device if device_id is None else device_id
                self.attributes = {"ClockRate": fake.CLOCK_KHZ, "L2CacheSize": fake.L2}

            def __enter__(self):
                self._prev, fake.current_device = fake.current_device, self.id
                return self

            def __exit__(self, *exc):
                fake.current_device = self._prev

            def synchronize(self) -> None:
                fake.log.append(("sync device", self.id))

        class Event:
            count = 0

            def __init__(self) -> None:
                Event.count += 1
                self.name = "start" if Event.count % 2 else "end"

            def record(self, stream=None) -> None:
                fake.log.append(("record", self.name, stream))

            def synchronize(self) -> None:
                fake.log.append(("wait", self.name))

        class MemPtr:
            def memset_async(self, value: int, size: int, stream=None) -> None:
                fake.log.append(("flush", size, stream))

        class Kernel:
            def __init__(self, source: str, name: str) -> None:
                fake.log.append(("compile", name, "pyc_spin" in source))

            def __call__(self, grid, block, args, stream=None) -> None:
                fake.log.append(("spin", int(args[0]), stream))

        self.Stream = Stream
        self.default_stream = Stream("default")
        self.current_stream = self.default_stream
        self.RawKernel = Kernel
        self.cuda = types.SimpleNamespace(
            Device=Device, Event=Event, Stream=Stream,
            get_current_stream=lambda: fake.current_stream,
            get_elapsed_time=lambda start, end: fake.ELAPSED_MS,
            runtime=types.SimpleNamespace(
                getDeviceProperties=lambda i: {"name": f"Fake GPU{i}".encode()}),
        )
        self.MemPtr = MemPtr

    def int64(self, value: int) -> int:
        return int(value)

    def empty(self, nbytes: int, dtype: str):
        return types.SimpleNamespace(nbytes=nbytes, data=self.MemPtr())


@pytest.fixture
def fake_cupy(monkeypatch):
    fake = FakeCupy()
    monkeypatch.setattr(timing_mod, "cupy_status", lambda: (fake, "ok"))
    monkeypatch.setattr(timing_mod, "require_cupy", lambda feature: fake)
    monkeypatch.setattr(timing_mod, "_FACTS", {})
    monkeypatch.setattr(timing_mod, "_SPIN_KERNELS", {})
    return fake


def test_gpu_call_order_flush_spin_start_call_end(fake_cupy, clock):
    f = Counter(clock, TICK / 64)  # ~15 us: the spin stays at its 100 us minimum
    f_logging = lambda: (fake_cupy.log.append(("call",)), f())  # noqa: E731
    t = benchmark(f_logging, repeats=2, warmup=1, flush_l2=True, name="f")
    d = fake_cupy.default_stream
    one_call = [("flush", 2 * FakeCupy.L2, d), ("spin", 100_000, d), ("record", "start", d),
                ("call",), ("record", "end", d), ("wait", "end")]
    assert fake_cupy.log == [
        ("compile", "pyc_spin", True), ("spin", 0, d),   # compiled and loaded up front
        ("call",),                                       # warm-up
        ("sync device", 0),
        *one_call, *one_call,
    ]
    assert t.gpu_s == (0.5 * MS, 0.5 * MS) and t.cpu_s == (TICK / 64, TICK / 64)
    assert t.device == "Fake GPU0" and t.flushed_l2 is True and t.warmup == 1
    assert t.summary() == ("f: GPU 500 us ± 0 us, CPU 15.3 us ± 0 us per call "
                           "(2 calls, 1 warm-up, L2 flushed; Fake GPU0)")


def test_gpu_spin_covers_a_slow_launcher_and_can_be_turned_off(fake_cupy, clock):
    benchmark(Counter(clock, 2 * TICK), repeats=1, warmup=2, gpu=True)
    spins = [e[1] for e in fake_cupy.log if e[0] == "spin"]
    assert spins == [0, 3_906_250]  # twice the 1.95 ms host time, at 1 cycle per ns
    fake_cupy.log.clear()
    benchmark(Counter(clock, 2 * TICK), repeats=3, warmup=0, spin=False, gpu=True)
    kinds = {e[0] for e in fake_cupy.log}
    assert "spin" not in kinds and "compile" not in kinds and "flush" not in kinds


def test_gpu_spin_compiles_and_device_facts_are_read_once_per_device(fake_cupy, monkeypatch):
    reads = []
    real = fake_cupy.cuda.runtime.getDeviceProperties
    monkeypatch.setattr(fake_cupy.cuda.runtime, "getDeviceProperties",
                        lambda i: (reads.append(i), real(i))[1])
    for _ in range(3):
        benchmark(Counter(), repeats=1, warmup=0)
    assert [e for e in fake_cupy.log if e[0] == "compile"] == [("compile", "pyc_spin", True)]
    assert reads == [0]
    with fake_cupy.cuda.Device(1):
        t = benchmark(Counter(), repeats=1, warmup=0)
    assert t.device == "Fake GPU1" and reads == [0, 1]
    assert len([e for e in fake_cupy.log if e[0] == "compile"]) == 2


def test_gpu_stream_is_used_and_made_current(fake_cupy):
    s = fake_cupy.Stream("mine", device_id=1)
    seen = []
    t = benchmark(lambda: seen.append((fake_cupy.current_stream, fake_cupy.current_device)),
                  repeats=2, warmup=1, flush_l2=True, stream=s)
    assert seen == [(s, 1)] * 3
    streams = {e[-1] for e in fake_cupy.log if e[0] in ("flush", "spin", "record")}
    assert streams == {s}
    assert fake_cupy.log[0] == ("enter stream", "mine")
    assert fake_cupy.log[-1] == ("exit stream", "mine")
    assert ("sync device", 1) in fake_cupy.log and t.device == "Fake GPU1"
    assert fake_cupy.current_stream is fake_cupy.default_stream  # restored


def test_gpu_min_time_sizes_from_the_gpu_time(fake_cupy):
    f = Counter()
    t = benchmark(f, repeats=50, warmup=1, min_time_s=0.01, gpu=True)  # 0.5 ms each
    assert t.n == 20 and len(f.calls) == 1 + 1 + 20


def test_gpu_uses_fallbacks_when_the_device_hides_clock_and_l2(fake_cupy, clock):
    real = fake_cupy.cuda.Device

    class Quiet(real):
        def __init__(self, device_id=None):
            super().__init__(device_id)
            self.attributes = {}

    fake_cupy.cuda.Device = Quiet
    benchmark(Counter(clock, 0.0), repeats=1, warmup=1, flush_l2=True)
    flush = next(e for e in fake_cupy.log if e[0] == "flush")
    spin = [e for e in fake_cupy.log if e[0] == "spin"][-1]
    assert flush[1] == 2 * timing_mod._FALLBACK_L2_BYTES
    assert spin[1] == 198_000  # 100 us at 1.98 GHz


# -- on a real GPU ----------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_times_are_positive_and_name_the_device():
    import cupy as cp

    x = cp.random.default_rng(0).random(1 << 20, dtype=cp.float32)
    t = benchmark(cp.sin, (x,), repeats=5, warmup=1, gpu=True, name="sin")
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    assert t.device == name and t.gpu_s is not None and t.n == 5
    assert all(g > 0 for g in t.gpu_s) and all(c > 0 for c in t.cpu_s)
    assert t.summary().startswith("sin: GPU ")
    json.dumps(t.to_dict())


@pytest.mark.gpu
def test_gpu_auto_picks_the_gpu():
    import cupy as cp

    x = cp.ones(1024, dtype=cp.float32)
    assert benchmark(lambda: x * 2, repeats=3).gpu_s is not None


@pytest.mark.gpu
def test_gpu_l2_flush_buffer_is_twice_the_l2(monkeypatch):
    import cupy as cp

    sizes = []
    real = timing_mod._flush_buffer

    def spy(cp_, device_id):
        buf = real(cp_, device_id)
        sizes.append(buf.nbytes)
        return buf

    monkeypatch.setattr(timing_mod, "_flush_buffer", spy)
    x = cp.ones(1 << 20, dtype=cp.float32)
    t = benchmark(lambda: x * 2, repeats=3, flush_l2=True, gpu=True)
    l2 = cp.cuda.Device().attributes["L2CacheSize"]
    assert l2 > 0 and sizes == [2 * l2] and t.flushed_l2


@pytest.mark.gpu
def test_gpu_spin_keeps_a_slow_hosts_launch_gap_out_of_the_interval():
    """A 2 ms host sleep before a tiny kernel: with the spin, the GPU finds the kernel
    queued when it reaches the start event, so GPU time is the kernel's (microseconds);
    without it, the GPU waits inside the interval for the host. The margins are wide
    (0.5 ms vs 2 ms): this checks what is inside the interval, not how fast anything is."""
    import cupy as cp

    y = cp.zeros(256, dtype=cp.float32)

    def slow_launch():
        time.sleep(0.002)
        y.fill(1.0)

    with_spin = benchmark(slow_launch, repeats=5, warmup=2, gpu=True)
    without = benchmark(slow_launch, repeats=5, warmup=2, gpu=True, spin=False)
    assert with_spin.cpu_median_s > 0.0019 and without.cpu_median_s > 0.0019
    assert with_spin.gpu_median_s < 0.0005
    assert without.gpu_median_s > 0.0015


@pytest.mark.gpu
def test_gpu_stream_is_current_during_the_calls():
    import cupy as cp

    s = cp.cuda.Stream(non_blocking=True)
    x = cp.ones(1024, dtype=cp.float32)
    seen = []

    def fn():
        seen.append(cp.cuda.get_current_stream().ptr)
        return x * 2

    t = benchmark(fn, repeats=3, warmup=1, stream=s, gpu=True)
    assert set(seen) == {s.ptr} and all(g > 0 for g in t.gpu_s)


def test_spin_ahead_sizes_the_spin_from_the_host_time(fake_cupy):
    """``spin_ahead`` (what the first-call races queue before a start event): at least
    100 us, twice the host time above that, on the given stream's device."""
    s = fake_cupy.Stream("race", device_id=-1)
    timing_mod.spin_ahead(fake_cupy, 10e-6, s)
    timing_mod.spin_ahead(fake_cupy, 1e-3, s)
    timing_mod.spin_ahead(fake_cupy, 10.0, s)
    spins = [e[1:] for e in fake_cupy.log if e[0] == "spin"]
    assert spins == [(100_000, s), (2_000_000, s), (50_000_000, s)]  # 1 cycle per ns
    assert [e for e in fake_cupy.log if e[0] == "compile"] == [("compile", "pyc_spin", True)]
