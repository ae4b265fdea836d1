"""The dynamic batcher and the server: order, identity, failures, queue, timeouts, close."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from pyc_lab.inference import zoo
from pyc_lab.inference.batcher import ServeOptions, default_buckets
from pyc_lab.inference.errors import (
    BadRequestError,
    InferenceError,
    QueueFullError,
    RequestTimeoutError,
    ServerClosedError,
)
from pyc_lab.inference.model import CompiledModel, load
from pyc_lab.inference.server import running_servers


class Gated(CompiledModel):
    """The affine model, whose runs wait for a gate (and fail on a poisoned row)."""

    def __init__(self, base: CompiledModel) -> None:
        super().__init__(base.name, base.compiled, base.inputs, base.outputs)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[int] = []

    def run(self, arrays):
        self.entered.set()
        assert self.gate.wait(10), "the test never opened the gate"
        x = arrays[0]
        self.batches.append(x.shape[0])
        if (x[:, 0] == 666).any():
            raise ValueError("poisoned row")
        return super().run(arrays)


def rows(n: int, start: int = 0) -> np.ndarray:
    return (np.arange(start, start + n * 4, dtype=np.float32).reshape(n, 4) + 0.5)


def test_options_and_buckets():
    assert default_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert default_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    o = ServeOptions(max_batch=16, buckets=(16, 4))
    assert o.bucket_sizes == (4, 16) and o.bucket_for(5) == 16 and o.bucket_for(3) == 4
    assert ServeOptions(max_batch=8, buckets=()).bucket_for(5) == 5
    for bad in ({"max_batch": 0}, {"max_delay_ms": -1}, {"max_queue": 0},
                {"timeout_s": 0}, {"timeout_s": "5"}, {"nan_policy": "ignore"},
                {"max_batch": 8, "buckets": (4,)}):
        with pytest.raises(InferenceError):
            ServeOptions(**bad)


def test_each_caller_gets_its_own_rows_under_threads(start, affine):
    server = start(affine, max_batch=16, max_delay_ms=1)

    def client(k: int) -> None:
        for j in range(25):
            n = 1 + (k + j) % 3
            x = rows(n, start=1000 * k + 10 * j)
            y = server.predict(x)
            np.testing.assert_array_equal(y, x * 2 + 1)
            one = server.predict(x[0])  # one row without the batch axis
            np.testing.assert_array_equal(one, x[0] * 2 + 1)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(client, range(16)))
    stats = server.stats()
    assert stats.requests == 16 * 25 * 2 and stats.failed == 0
    assert max(stats.batch_histogram()) > 1, "no request was ever batched with another"


def test_futures_resolve_in_order_and_to_their_own_rows(start, affine):
    server = start(affine, max_batch=8, max_delay_ms=5)
    xs = [rows(1 + k % 4, start=7 * k) for k in range(60)]
    futs = [server.submit(x) for x in xs]
    for x, f in zip(xs, futs, strict=True):
        np.testing.assert_array_equal(f.result(timeout=10), x * 2 + 1)


def test_asyncio_gather(start, affine):
    server = start(affine, max_batch=32, max_delay_ms=2)
    xs = [rows(1 + k % 2, start=k * 11) for k in range(200)]

    async def main():
        return await asyncio.gather(*[server.predict_async(x) for x in xs])

    for x, y in zip(xs, asyncio.run(main()), strict=True):
        np.testing.assert_array_equal(y, x * 2 + 1)


def test_dict_and_keyword_inputs(start, affine):
    server = start(affine, max_batch=4, max_delay_ms=0)
    x = rows(2)
    assert set(server.predict({"x": x})) == {"y"}
    np.testing.assert_array_equal(server.predict(x=x), x * 2 + 1)
    with pytest.raises(BadRequestError, match="unknown: z"):
        server.predict(z=x)


def test_triton_batching_takes_what_arrives_within_the_delay(start, affine):
    gated = Gated(affine)
    server = start(gated, max_batch=16, max_delay_ms=0)
    first = server.submit(rows(1))
    assert gated.entered.wait(5)
    futs = [server.submit(rows(1, start=k)) for k in range(10)]  # queue while it runs
    futs += [server.submit(rows(3, start=100))]                  # 13 rows -> bucket 16
    gated.gate.set()
    for f in [first, *futs]:
        f.result(timeout=10)
    assert gated.batches == [1, 16]
    st = server.stats()
    assert st.batch_histogram() == {1: 1, 13: 1} and st.padded_rows == 3


def test_max_batch_splits_and_delay_holds(start, affine):
    gated = Gated(affine)
    server = start(gated, max_batch=4, max_delay_ms=0, buckets=())
    first = server.submit(rows(1))
    assert gated.entered.wait(5)
    futs = [server.submit(rows(1, start=k)) for k in range(9)]
    gated.gate.set()
    for f in [first, *futs]:
        f.result(timeout=10)
    assert gated.batches == [1, 4, 4, 1]


def test_a_failing_request_fails_alone(start, affine):
    gated = Gated(affine)
    server = start(gated, max_batch=16, max_delay_ms=0)
    first = server.submit(rows(1))
    assert gated.entered.wait(5)
    xs = [rows(1, start=10 * k) for k in range(6)]
    xs[3][0, 0] = 666
    futs = [server.submit(x) for x in xs]
    gated.gate.set()
    first.result(timeout=10)
    for k, (x, f) in enumerate(zip(xs, futs, strict=True)):
        if k == 3:
            with pytest.raises(InferenceError, match="poisoned row"):
                f.result(timeout=10)
        else:
            np.testing.assert_array_equal(f.result(timeout=10), x * 2 + 1)
    assert server.stats().failed == 1
    np.testing.assert_array_equal(server.predict(rows(2)), rows(2) * 2 + 1)


def test_badly_formed_requests_fail_at_submit_and_never_reach_a_batch(start, affine):
    server = start(affine, max_batch=4, max_delay_ms=0)
    with pytest.raises(BadRequestError, match="axis 1 is 5, expected 4"):
        server.submit(np.ones((2, 5), np.float32))
    with pytest.raises(BadRequestError, match="cannot be converted"):
        server.submit(np.ones((2, 4), np.complex64))
    with pytest.raises(BadRequestError, match="larger than max_batch"):
        server.submit(rows(5))
    with pytest.raises(BadRequestError, match="takes 1 input"):
        server.submit(rows(1), rows(1))
    x64 = rows(2).astype(np.float64)  # converted (same kind)
    np.testing.assert_array_equal(server.predict(x64), rows(2) * 2 + 1)
    assert server.stats().rejected == 4 and server.stats().requests == 1
    with pytest.raises(BadRequestError, match="NaN"):  # refused in its batch (below)
        server.predict(np.full((2, 4), np.nan, np.float32))
    assert server.stats().rejected == 5 and server.stats().requests == 1
    allow = start(affine, max_batch=4, max_delay_ms=0, nan_policy="allow")
    assert np.isnan(allow.predict(np.full((1, 4), np.nan, np.float32))).all()


class Recording(CompiledModel):
    """A model that keeps a copy of every batch it is given."""

    def __init__(self, base: CompiledModel) -> None:
        super().__init__(base.name, base.compiled, base.inputs, base.outputs)
        self.seen: list[list[np.ndarray]] = []

    def run(self, arrays):
        self.seen.append([np.array(a) for a in arrays])
        return super().run(arrays)


@pytest.mark.parametrize("features", [3, 4, 9, 64])  # a few values (Python's sum) and more
def test_a_request_holding_nan_or_infinity_fails_alone_and_its_batch_runs_without_it(
        start, features):
    """Each non-finite value, anywhere in either input of a two-input model, in
    requests of one or several rows batched with finite ones: the request holding it
    gets ``BadRequestError`` naming the input, every other request its own answer,
    and the model never sees the value. -0.0 and float32's largest values pass."""
    def model(x, t):
        return x * np.float32(2) + t

    base = load(model, inputs={"x": ("float32", (None, features)), "t": ("float32", (None, 1))},
                outputs=["y"])
    rec = Recording(base)
    server = start(rec, max_batch=16, max_delay_ms=200)
    rng = np.random.default_rng(features)
    big = np.finfo(np.float32).max
    for bad in (np.nan, np.inf, -np.inf):
        for which, pos in (("x", (0, 0)), ("x", (1, features - 1)), ("t", (1, 0))):
            xs = [rng.standard_normal((1 + k % 2, features)).astype(np.float32)
                  for k in range(5)]
            ts = [rng.standard_normal((len(x), 1)).astype(np.float32) for x in xs]
            xs[0][0, 0] = -0.0
            xs[4][:] = big  # finite, whatever a sum of them does
            victim = 1  # two rows
            (xs if which == "x" else ts)[victim][pos] = bad
            futs = [server.submit(x, t) for x, t in zip(xs, ts, strict=True)]
            for k, (f, x, t) in enumerate(zip(futs, xs, ts, strict=True)):
                if k == victim:
                    with pytest.raises(BadRequestError, match=f"input '{which}' holds NaN"):
                        f.result(timeout=10)
                else:
                    with np.errstate(over="ignore"):  # float32's largest, doubled
                        want = x * np.float32(2) + t
                    np.testing.assert_array_equal(f.result(timeout=10), want)
    assert all(np.isfinite(a).all() for batch in rec.seen for a in batch)
    assert any(len(batch[0]) > 2 for batch in rec.seen), "the requests were never batched"
    assert server.stats().rejected == 9


def test_a_complex_request_holding_nan_fails_alone(start):
    def model(z):
        return z * np.complex64(2)

    m = load(model, inputs={"z": ("complex64", (None, 3))}, outputs=["y"])
    server = start(m, max_batch=4, max_delay_ms=50)
    z = np.array([[1 + 2j, 3, 4j]], np.complex64)
    bad = z.copy()
    bad[0, 1] = complex(0, np.nan)
    futs = [server.submit(z), server.submit(bad), server.submit(z * 3)]
    np.testing.assert_array_equal(futs[0].result(timeout=10), z * 2)
    with pytest.raises(BadRequestError, match="'z' holds NaN or infinity"):
        futs[1].result(timeout=10)
    np.testing.assert_array_equal(futs[2].result(timeout=10), z * 6)


def test_finite_values_whose_sum_overflows_are_served(start):
    """float64 values near its largest: the batch's quick test overflows, the exact
    test of each request passes, and the batch runs."""
    def model(x):
        return x * 0.5

    m = load(model, inputs={"x": ("float64", (None, 3))}, outputs=["y"])
    server = start(m, max_batch=4, max_delay_ms=0)
    x = np.full((2, 3), np.finfo(np.float64).max)
    np.testing.assert_array_equal(server.predict(x), x * 0.5)
    assert server.stats().rejected == 0


def test_queue_full_is_a_clear_error(start, affine):
    gated = Gated(affine)
    server = start(gated, max_batch=2, max_delay_ms=0, max_queue=3)
    first = server.submit(rows(1))
    assert gated.entered.wait(5)
    futs = [server.submit(rows(1)) for _ in range(3)]
    with pytest.raises(QueueFullError, match="max_queue=3"):
        server.submit(rows(1))
    gated.gate.set()
    for f in [first, *futs]:
        f.result(timeout=10)
    assert server.stats().rejected == 1


def test_timeouts(start, affine):
    gated = Gated(affine)
    server = start(gated, max_batch=4, max_delay_ms=0)
    first = server.submit(rows(1))
    assert gated.entered.wait(5)
    late = server.submit(rows(1), timeout_s=0.05)
    with pytest.raises(RequestTimeoutError):
        server.predict(rows(1), timeout_s=0.1)
    time.sleep(0.1)
    gated.gate.set()
    first.result(timeout=10)
    with pytest.raises(RequestTimeoutError, match="past its timeout"):
        late.result(timeout=10)
    assert server.stats().timed_out >= 1
    np.testing.assert_array_equal(server.predict(rows(1)), rows(1) * 2 + 1)


def test_a_timeout_that_is_not_a_positive_number_is_a_bad_request(start, affine):
    server = start(affine, max_batch=4, max_delay_ms=0)
    for bad in (-1, 0, "5", True, float("nan")):
        with pytest.raises(BadRequestError, match="timeout_s must be a number of seconds"):
            server.predict(rows(1), timeout_s=bad)
        with pytest.raises(BadRequestError, match="timeout_s must be a number of seconds"):
            server.submit(rows(1), timeout_s=bad)
    assert server.stats().timed_out == 0  # none was queued
    np.testing.assert_array_equal(server.predict(rows(1), timeout_s=5), rows(1) * 2 + 1)


def test_close_finishes_queued_work(start, affine):
    gated = Gated(affine)
    server = start(gated, max_batch=2, max_delay_ms=0)
    first = server.submit(rows(1))
    assert gated.entered.wait(5)
    futs = [server.submit(rows(1, start=k)) for k in range(7)]
    closer = threading.Thread(target=server.close)
    closer.start()
    time.sleep(0.05)
    with pytest.raises(ServerClosedError):
        server.submit(rows(1))
    gated.gate.set()
    closer.join(10)
    assert not closer.is_alive()
    for k, f in enumerate([first, *futs]):
        assert f.done()
        np.testing.assert_array_equal(f.result(), (rows(1) if k == 0 else
                                                   rows(1, start=k - 1)) * 2 + 1)
    assert server not in running_servers()


def test_close_without_draining_fails_the_queue(start, affine):
    gated = Gated(affine)
    server = start(gated, max_batch=1, max_delay_ms=0)
    first = server.submit(rows(1))
    assert gated.entered.wait(5)
    futs = [server.submit(rows(1)) for _ in range(4)]
    closer = threading.Thread(target=server.close, kwargs={"drain": False})
    closer.start()
    time.sleep(0.05)
    gated.gate.set()
    closer.join(10)
    first.result(timeout=5)
    for f in futs:
        with pytest.raises(ServerClosedError):
            f.result(timeout=5)


def test_several_models_at_once(start, affine):
    mlp = load(zoo.build("astro_mlp"))
    server = start({"affine": affine, "mlp": mlp}, max_batch=8, max_delay_ms=1)
    x = zoo.example_inputs("astro_mlp", 3)["x"]
    np.testing.assert_allclose(server.predict(x, model="mlp"), mlp(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(server.predict(rows(2), model="affine"), rows(2) * 2 + 1)
    with pytest.raises(InferenceError, match="say which"):
        server.predict(x)
    with pytest.raises(InferenceError, match="no model 'nope'"):
        server.predict(x, model="nope")
    assert set(server.summary()["model"]) == {"affine", "mlp"}
    assert "2 model(s)" in repr(server)


def test_registry_lists_open_servers(start, affine):
    a = start(affine, name="alpha")
    assert a in running_servers() and a.name == "alpha"
    a.close()
    assert a not in running_servers()
    a.close()  # twice is fine
    with pytest.raises(ServerClosedError):
        a.predict(rows(1))


def test_warm_up_runs_every_bucket(start, affine):
    server = start(affine, max_batch=8, max_delay_ms=0)
    assert sorted(server.warm_up()) == [1, 2, 4, 8]
    assert affine.compiled.cache_info()["signatures"] >= 4


def test_stats_stay_bounded_over_a_long_run(start, affine):
    # the bursts queue faster than a busy two-core machine serves them: a queue that
    # holds a whole burst keeps this about the statistics, not about QueueFullError
    server = start(affine, max_batch=64, max_delay_ms=0.5, max_queue=16_384)
    x = rows(1)

    def burst(n: int) -> None:
        futs = [server.submit(x) for _ in range(n)]
        for f in futs:
            f.result(timeout=30)

    burst(5_000)
    before = server.stats().footprint()
    burst(15_000)
    after = server.stats().footprint()
    st = server.stats()
    assert st.requests == 20_000
    assert after["recent"] == before["recent"] == 4096
    for key in ("batch_sizes", "latency_buckets", "observers"):
        assert after[key] == before[key]
    for key in ("latency_bins", "queue_bins", "compute_bins"):
        assert after[key] <= 1450, "a sketch grew with the run's length"
    assert server._batcher(None).queued == 0
