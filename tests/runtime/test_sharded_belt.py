"""``Pipeline(..., devices=[...])`` in CPU mode: one belt per device, items dealt round
robin, results in item order; a failing item reported with its index in the input and
its device; early stops, reruns, bounded dealing, the shared trace with a lane group per
belt, and bad arguments. The two-GPU half is test_sharded_belt_gpu.py."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from pyc_lab.profiling.trace import Trace
from pyc_lab.runtime.pipeline import Pipeline, PipelineError


def _prepare(i: int) -> np.ndarray:
    time.sleep(random.random() * 0.002)  # items finish out of order
    return np.full(8, i, dtype=np.float32)


def _compute(x: np.ndarray) -> np.ndarray:
    return x * 2 + 1


def _values(results) -> list[float]:
    return [float(r[0]) for r in results]


@pytest.mark.parametrize("devices", [[0, 1], [2, 0, 1]])
def test_results_come_back_in_item_order(devices):
    with Pipeline(_prepare, _compute, mode="cpu", devices=devices, depth=3) as pipe:
        got = _values(pipe.run(range(53)))
        assert got == [2.0 * i + 1 for i in range(53)]
        assert pipe.live_slots == 0
        assert _values(pipe.run(range(4))) == [1.0, 3.0, 5.0, 7.0]  # runs again
        assert pipe.devices == devices and "devices=" in repr(pipe)


def test_an_item_failing_is_reported_with_its_index_in_the_input():
    def prepare(i):
        if i == 7:
            raise ValueError("bad item")
        return np.full(4, i, dtype=np.float32)

    with Pipeline(prepare, _compute, mode="cpu", devices=[0, 1, 2], depth=2) as pipe:
        seen = []
        with pytest.raises(PipelineError) as info:
            for r in pipe.run(range(20)):
                seen.append(float(r[0]))
        err = info.value
        assert err.index == 7 and err.stage == "prepare"
        assert str(err).startswith("item 7") and "(on device 1)" in str(err)
        assert seen == [2.0 * i + 1 for i in range(7)]  # every item before it, in order
        assert _values(pipe.run(range(3))) == [1.0, 3.0, 5.0]  # the belt runs again


def test_a_run_stopped_early_frees_its_slots_and_the_next_run_starts_clean():
    with Pipeline(_prepare, _compute, mode="cpu", devices=[0, 1], depth=2) as pipe:
        for k, _ in enumerate(pipe.run(range(100))):
            if k == 5:
                break
        assert pipe.live_slots == 0
        assert _values(pipe.run(range(6))) == [2.0 * i + 1 for i in range(6)]


def test_items_are_dealt_only_as_the_belts_ask():
    pulled = []

    def source():
        for i in range(1000):
            pulled.append(i)
            yield i

    with Pipeline(_prepare, _compute, mode="cpu", devices=[0, 1, 2], depth=2) as pipe:
        run = pipe.run(source())
        assert float(next(run)[0]) == 1.0
        # each belt holds at most `depth` items, and the dealer what it dealt ahead
        assert len(pulled) <= 3 * 2 + 3
        run.close()


def test_one_trace_with_a_lane_group_per_belt_and_global_item_numbers():
    with Pipeline(_prepare, _compute, mode="cpu", devices=[0, 1], depth=2) as pipe:
        list(pipe.run(range(10)))
        trace = pipe.trace
        assert sorted({s.item for s in trace.spans}) == list(range(10))
        assert {lane.split(" ")[0] for lane in trace.lanes} == {"shard0", "shard1"}
        assert {s.item % 2 for s in trace.spans if s.lane.startswith("shard1")} == {1}
        stages = {s.stage for s in trace.spans}
        assert {"prepare", "h2d", "compute", "d2h"} <= stages
        first = trace
        list(pipe.run(range(2)))
        assert pipe.trace is not first  # a new trace per run, as a one-device belt
    shared = Trace()
    with Pipeline(_prepare, _compute, mode="cpu", devices=[0, 1], trace=shared) as pipe:
        list(pipe.run(range(4)))
        list(pipe.run(range(4)))
        assert pipe.trace is shared and len({(s.item, s.stage) for s in shared.spans}) == 16
    with Pipeline(_prepare, _compute, mode="cpu", devices=[0, 1], trace=False) as pipe:
        list(pipe.run(range(4)))
        assert len(pipe.trace) == 0


@pytest.mark.parametrize("devices, match", [([], "empty"), ([0, 0], "twice"),
                                            ([-1, 0], "ordinals"), ("01", "list"),
                                            ([0, 1.5], "ordinals")])
def test_bad_devices_are_clear_errors(devices, match):
    with pytest.raises(PipelineError, match=match):
        Pipeline(_prepare, _compute, mode="cpu", devices=devices)


def test_a_pool_cannot_be_shared_and_one_device_is_a_plain_belt():
    from pyc_lab.runtime.pinned import PinnedPool

    with PinnedPool(device=None, mode="cpu") as pool, pytest.raises(PipelineError,
                                                                    match="NUMA"):
        Pipeline(_prepare, _compute, mode="cpu", devices=[0, 1], pool=pool)
    with Pipeline(_prepare, _compute, mode="cpu", devices=[1]) as pipe:
        assert pipe.device == 1 and "devices" not in repr(pipe)
        assert _values(pipe.run(range(3))) == [1.0, 3.0, 5.0]


def test_a_closed_sharded_belt_refuses_to_run():
    pipe = Pipeline(_prepare, _compute, mode="cpu", devices=[0, 1])
    pipe.close()
    with pytest.raises(PipelineError, match="closed"):
        pipe.run(range(3))


def test_the_last_pipeline_is_the_sharded_front_with_its_whole_trace():
    from pyc_lab.runtime.pipeline import last_pipeline

    with Pipeline(_prepare, _compute, mode="cpu", devices=[0, 1]) as pipe:
        list(pipe.run(range(6)))
        last = last_pipeline()
        assert last is pipe and last.traced  # what %pyc_timeline reads
        assert sorted({s.item for s in last.trace.spans}) == list(range(6))
