"""load_test and sweep: perf_analyzer's report as a DataFrame (no timing assertions)."""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.inference.errors import InferenceError
from pyc_lab.inference.load_testing import COLUMNS, load_test, sweep


def test_load_test_reports_each_level(start, affine):
    server = start(affine, max_batch=8, max_delay_ms=1)
    seen = []
    frame = load_test(server, [1, 4], duration_s=0.2, warmup_s=0.05, on_level=seen.append)
    assert list(frame.columns) == COLUMNS
    assert list(frame["concurrency"]) == [1, 4] and len(seen) == 2
    assert (frame["requests"] > 0).all() and (frame["errors"] == 0).all()
    assert (frame["p50_ms"] <= frame["p99_ms"]).all()
    assert (frame["p50_ms"] <= frame["p90_ms"]).all()
    assert all(sum(h.values()) > 0 and max(h) <= 8 for h in frame["batch_hist"])
    assert sorted(frame.attrs["warmup_ms"]) == [1, 2, 4, 8]
    assert frame.attrs["model"] == "affine"


def test_load_test_with_given_inputs_and_errors(start, affine):
    server = start(affine, max_batch=4, max_delay_ms=0)
    frame = load_test(server, [2], duration_s=0.1, warmup_s=0.0,
                      inputs=[np.ones((3, 4), np.float32)])
    assert frame["rows_per_s"].iloc[0] == pytest.approx(3 * frame["throughput_rps"].iloc[0])
    with pytest.raises(InferenceError, match="concurrency"):
        load_test(server, [0])
    server.close()
    with pytest.raises(InferenceError, match="closed"):
        load_test(server, [1])


def test_sweep_serves_each_setting(affine):
    from pyc_lab.inference.server import running_servers

    frame = sweep(affine, max_batch=(1, 4), max_delay_ms=(0.0,), concurrency=(2,),
                  duration_s=0.1, warmup_s=0.0)
    assert list(frame["max_batch"]) == [1, 4]
    assert set(frame.attrs["warmup_ms"]) == {(1, 0.0), (4, 0.0)}
    assert not running_servers()


def test_face_names_are_the_functions_not_modules():
    import pyc_lab as pl
    import pyc_lab.inference.load_testing  # a submodule never shadows a name

    for name in ("load_test", "sweep", "load", "serve", "running_servers"):
        assert callable(getattr(pl.inference, name)) and \
            getattr(pl.inference, name).__name__ == name
    assert pl.serve is pl.inference.serve


@pytest.mark.parametrize("clients", ["loop", "workers"])
def test_refused_requests_are_counted_and_never_stall_the_clients(start, affine, clients):
    """Every request refused at once (a NaN under ``nan_policy="reject"``): the clients
    count the errors and keep trying, so the level still ends on time."""
    server = start(affine, max_batch=4, max_delay_ms=0, nan_policy="reject")
    bad = np.full((1, 4), np.nan, np.float32)
    frame = load_test(server, [3], duration_s=0.1, warmup_s=0.0, inputs=[bad],
                      clients=clients)
    assert frame["requests"].iloc[0] == 0 and frame["errors"].iloc[0] > 0
    assert frame["duration_s"].iloc[0] == pytest.approx(0.1, abs=0.08)


def test_timed_out_requests_are_errors_and_the_level_ends(start, affine):
    """A batch held open far past the clients' timeout: each request fails with a
    timeout, counted as an error, and the level ends once the last one has."""
    server = start(affine, max_batch=64, max_delay_ms=2000)
    frame = load_test(server, [2], duration_s=0.1, warmup_s=0.0, request_timeout_s=0.02)
    assert frame["errors"].iloc[0] > 0 and frame["requests"].iloc[0] == 0


def test_a_request_on_a_loop_forgets_its_timeout_when_answered(start, affine):
    import asyncio

    from pyc_lab.inference.waiters import timeouts_for

    server = start(affine, max_batch=4, max_delay_ms=0)

    async def one():
        loop = asyncio.get_running_loop()
        fut, forget = server.request_on_loop(loop, (np.ones((2, 4), np.float32),), {},
                                             timeout_s=5.0)
        assert len(timeouts_for(loop)) == 1
        y = await fut
        forget()
        assert len(timeouts_for(loop)) == 0
        return y

    np.testing.assert_array_equal(asyncio.run(one()), np.full((2, 4), 3, np.float32))


def test_clients_on_the_workers_report_each_level(start, affine):
    """``clients="workers"``: the clients are callbacks on the batcher's thread; the
    report is the same, every request answered, none lost when the level ends."""
    server = start(affine, max_batch=8, max_delay_ms=1)
    frame = load_test(server, [1, 8], duration_s=0.2, warmup_s=0.05, clients="workers")
    assert list(frame.columns) == COLUMNS and list(frame["clients"]) == ["workers"] * 2
    assert (frame["requests"] > 0).all() and (frame["errors"] == 0).all()
    assert all(sum(h.values()) > 0 and max(h) <= 8 for h in frame["batch_hist"])
    assert server._batcher(None).queued == 0  # every client stopped, nothing left
    assert server.stats().requests >= frame["requests"].sum()
    with pytest.raises(InferenceError, match="clients must be one of"):
        load_test(server, [1], clients="threads")


@pytest.mark.parametrize("clients", ["loop", "workers"])
def test_a_full_queue_refuses_and_the_clients_retry(start, affine, clients):
    """More clients than ``max_queue``: the refused requests are errors, sent again,
    and the level still ends on time with every client stopped."""
    server = start(affine, max_batch=2, max_delay_ms=5, max_queue=2)
    frame = load_test(server, [6], duration_s=0.2, warmup_s=0.0, clients=clients)
    assert frame["requests"].iloc[0] > 0 and frame["errors"].iloc[0] > 0
    assert frame["duration_s"].iloc[0] == pytest.approx(0.2, abs=0.1)
    assert server.stats().rejected > 0
