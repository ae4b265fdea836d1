"""ModelStats counts a batch's requests from one BatchRecord as it would count them one by
one: counters, the latency histogram (Prometheus' ``le`` buckets), the sketches, the ring
of recent latencies and what observers see."""

from __future__ import annotations

import bisect

import numpy as np
import pytest

from pyc_lab.inference.stats import LATENCY_BUCKETS_S, BatchRecord, ModelStats


def _record(rng: np.random.Generator, n: int, rows: int, bucket: int,
            ok: bool = True) -> BatchRecord:
    queue = rng.uniform(1e-5, 3e-3, n)
    queue[0] = LATENCY_BUCKETS_S[2]  # a value on a bucket's bound counts in that bucket
    compute = float(rng.uniform(1e-4, 1e-3))
    return BatchRecord(queue, compute, queue + compute, rows, bucket, ok)


def test_a_batch_record_counts_each_of_its_requests():
    rng = np.random.default_rng(7)
    stats = ModelStats(max_batch=64, recent=50)
    seen: list[BatchRecord] = []
    stop = stats.observe(seen.append)
    batches = [_record(rng, n, rows=n * 2, bucket=64) for n in (1, 17, 32)]
    for rec in batches:
        stats.record_batch(rec)
    failed = BatchRecord(np.array([0.2]), 0.0, np.array([0.2]), 3, 3, ok=False)
    stats.record_failed(failed)
    stop()
    stats.record_batch(batches[0])  # no longer observed

    everything = np.concatenate([r.latency_s for r in [*batches, failed, batches[0]]])
    assert [id(r) for r in seen] == [id(r) for r in [*batches, failed]]
    assert stats.requests == len(everything) == 1 + 17 + 32 + 1 + 1
    assert stats.failed == 1 and stats.batches == 4
    assert stats.rows == 2 * (1 + 17 + 32) + 2
    assert stats.padded_rows == (64 - 2) + (64 - 34) + (64 - 64) + (64 - 2)
    assert stats.batch_histogram() == {2: 2, 34: 1, 64: 1}
    assert stats.latency_sum == pytest.approx(float(everything.sum()))
    expected = np.zeros(len(LATENCY_BUCKETS_S), dtype=np.int64)
    for v in everything:
        expected[bisect.bisect_left(LATENCY_BUCKETS_S, float(v))] += 1
    np.testing.assert_array_equal(stats.latency_buckets, expected)
    np.testing.assert_array_equal(stats.recent_latencies(), everything[-50:])
    assert stats.latency.count == stats.queue.count == stats.compute.count == len(everything)
    computes = [r.compute_s for r in batches for _ in range(r.requests)]
    computes += [0.0, batches[0].compute_s]
    assert stats.compute.total == pytest.approx(sum(computes))
    assert stats.latency.max == pytest.approx(float(everything.max()))
