"""Tuning sweeps over Dask, on the CPU: ``pl.cluster()`` with declared GPU resources and
the recorded (replay) runner, and the live path's merge with a stand-in tuner.

Covered: the cluster's GPU resources, a client passed in, bad arguments; a replayed sweep
over two workers gives the local sweep's answers in the problems' order; a problem that
cannot be tuned is an answer (not retried); a live sweep merges every worker's
measurements and winner into the caller's database under the worker's device; a live
sweep refuses a cluster without GPU workers; a worker process killed mid-sweep loses
only the problem it held, which runs again elsewhere; a client closed mid-sweep ends
the sweep with the problems left reported, not a hang. Skipped, with the reason,
without Dask's distributed package.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError
from pyc_lab.kernels.tuning import autotune as autotune_mod
from pyc_lab.kernels.tuning.database import TuningDB
from pyc_lab.kernels.tuning.keys import DeviceKey, Measurement, ProblemKey
from pyc_lab.kernels.tuning.result import TuneResult, config_name

distributed = pytest.importorskip("distributed", reason="needs Dask's distributed package "
                                                        "(pip install 'pyc-lab[cluster]')")

#: Problems in the shipped H200 recording, and one that is not.
RECORDED = [(512, 512, 512, "bf16"), (1024, 1024, 1024, "f16"), (2048, 2048, 2048, "bf16"),
            (512, 512, 512, "f16")]
MISSING = (3, 4096, 4096)


@pytest.fixture
def threads_client():
    client = pl.cluster(n_workers=2, gpus_per_worker=1, processes=False)
    yield client
    client.close()


def _columns(result):
    return result.summary[["problem", "winner", "winner_ms", "best_library", "speedup",
                           "candidates", "status"]]


def test_cluster_declares_gpu_resources_and_takes_a_client(threads_client):
    assert pl.distributed.gpu_count(threads_client) == 2
    assert pl.cluster(client=threads_client) is threads_client
    assert threads_client.dashboard_link.startswith("http")
    with pytest.raises(PycLabError, match=r"takes a distributed\.Client"):
        pl.cluster(client=object())
    for bad in (0, "4", 2.0, True):  # nothing is started for any of them
        with pytest.raises(PycLabError, match="n_workers"):
            pl.cluster(n_workers=bad)
    for bad in (-1, "1", 0.5):
        with pytest.raises(PycLabError, match="gpus_per_worker"):
            pl.cluster(gpus_per_worker=bad)


def test_a_replayed_sweep_over_workers_matches_the_local_one(threads_client):
    problems = [*RECORDED, MISSING]
    remote = pl.autotune_many(problems, client=threads_client, replay=True, budget_s=60)
    local = pl.autotune_many(problems, replay=True, budget_s=60)
    assert list(remote.summary["problem"]) == list(local.summary["problem"])  # in order
    assert _columns(remote).equals(_columns(local))
    assert set(remote.workers) == set(remote.problems)  # the missing one ran too
    assert len(set(remote.workers.values())) == 2  # both workers took problems
    missing = remote.problems[-1]
    assert remote.results[missing] is None
    assert "no recorded tuning" in remote.messages[missing]
    assert "worker" in remote.summary and "worker" not in local.summary


def test_the_chart_of_a_sweep_over_workers(threads_client):
    from pyc_lab.widgets import ManyTuningChart

    remote = pl.autotune_many(RECORDED, client=threads_client, replay=True, budget_s=60)
    chart = ManyTuningChart(remote, client=threads_client)
    assert "on 2 Dask worker(s)" in chart.to_text()
    assert "inproc://" not in chart.to_text()  # no addresses in the text repr
    assert "Dask dashboard" in chart.to_html() and threads_client.dashboard_link in \
        chart.to_html()
    assert list(chart.to_frame()["worker"]) == [remote.workers[p] for p in remote.problems]
    hover = chart.figure().data[0].customdata
    assert [row[2] for row in hover] == [remote.workers[p] for p in remote.problems]


def test_closing_the_client_stops_the_cluster_it_started():
    client = pl.cluster(n_workers=1, processes=False)
    cluster = client.cluster
    assert isinstance(client, distributed.Client)
    client.close()
    assert cluster.status.name == "closed"


def test_a_live_sweep_refuses_a_cluster_without_gpus():
    client = pl.cluster(n_workers=1, processes=False)
    try:
        assert pl.distributed.gpu_count(client) == 0
        with pytest.raises(PycLabError, match="no worker of this cluster declares a GPU"):
            pl.autotune_many([(64, 64, 64)], client=client)
        with pytest.raises(PycLabError, match="retries"):
            pl.autotune_many([(64, 64, 64)], client=client, replay=True, retries=-1)
    finally:
        client.close()
    with pytest.raises(PycLabError, match=r"takes a distributed\.Client"):
        pl.autotune_many([(64, 64, 64)], client="tcp://nowhere:1")


def _fake_autotune(m, n, k, *, options, db, **_):
    """A stand-in for the live tuner on a worker: two measurements and a winner written
    into the database it is given, as autotune_gemm writes them."""
    device = DeviceKey("Fake GPU", "9.0", "1.0", "13.0")
    problem = ProblemKey("gemm", options.dtype, options.dtype, options.dtype,
                         options.layout, m, n, k)
    fast = Measurement({"kind": "cutlass", "tile": [128, 128, 64], "m": m}, "ok", 0.5)
    slow = Measurement({"kind": "cutlass", "tile": [64, 64, 64], "m": m}, "ok", 0.9)
    db.record_many(device, problem, [fast, slow])
    db.set_winner(device, problem, fast.config_id)
    return TuneResult(problem, device, fast, table=None, baselines={"cublas": 0.6},
                      recorded=True)


def test_a_live_sweep_merges_every_measurement_into_the_callers_database(
        threads_client, monkeypatch, tmp_path):
    # threads of this process: the stand-in reaches the workers
    monkeypatch.setattr(autotune_mod, "autotune_gemm", _fake_autotune)
    db = TuningDB(tmp_path / "tuning.sqlite")
    res = pl.autotune_many([(64, 128, 256), (32, 32, 32, "bf16")], client=threads_client,
                           db=db, budget_s=10, cutlass=False)
    assert all(r is not None and r.recorded for r in res.results.values())
    rows = db.measurements()
    assert len(rows) == 4
    assert {r.device.gpu_name for r in rows} == {"Fake GPU"}  # the worker's device
    assert {(r.problem.m, r.problem.dtype_a) for r in rows} == {(64, "f16"), (32, "bf16")}
    winners = [r for r in rows if r.is_winner]
    assert len(winners) == 2 and all(w.measurement.time_ms == 0.5 for w in winners)


def test_a_killed_worker_loses_only_its_problem(tmp_path):
    client = pl.cluster(n_workers=2, gpus_per_worker=1, processes=True)
    try:
        problems = RECORDED[:3]
        local = pl.autotune_many(problems, replay=True, budget_s=60)
        done: dict = {}

        def sweep():
            done["result"] = pl.autotune_many(problems, client=client, replay=True,
                                              budget_s=60, pace_s=0.15)

        pids = client.run(os.getpid)
        thread = threading.Thread(target=sweep)
        thread.start()
        victim = None
        for _ in range(200):  # the first worker seen working on a problem
            busy = [addr for addr, keys in client.processing().items() if keys]
            if busy:
                victim = busy[0]
                break
            time.sleep(0.05)
        assert victim is not None, "no worker ever took a problem"
        os.kill(pids[victim], signal.SIGKILL)  # the nanny starts a new worker
        thread.join(timeout=120)
        assert not thread.is_alive(), "the sweep did not end after a worker died"
        remote = done["result"]
        assert _columns(remote).equals(_columns(local))
        assert all(remote.results[p] is not None for p in remote.problems), remote.messages
    finally:
        client.close()


def test_a_client_closed_mid_sweep_ends_the_sweep(threads_client):
    problems = RECORDED * 1
    done: dict = {}

    def sweep():
        done["result"] = pl.autotune_many(problems, client=threads_client, replay=True,
                                          budget_s=60, pace_s=0.2)

    thread = threading.Thread(target=sweep)
    thread.start()
    time.sleep(1.0)
    threads_client.close()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the sweep hung after its client closed"
    res = done["result"]
    lost = [p for p in res.problems if res.results[p] is None]
    assert lost, "every problem finished before the client closed: nothing was tested"
    assert all(res.messages[p] for p in lost)


def test_candidates_are_built_once_apart_and_shipped_to_the_measuring_task(
        threads_client, monkeypatch, tmp_path):
    # stand-ins (threads of this process reach the workers): the GPU facts, each
    # problem's candidates (overlapping), nvcc; the tuner checks its kernels are cached
    import hashlib

    from pyc_lab.distributed import builds as builds_mod
    from pyc_lab.kernels.cache import KernelCache
    from pyc_lab.kernels.cutlass import nvcc
    from pyc_lab.kernels.cutlass.nvcc import BuildResult
    from pyc_lab.kernels.tuning import gemm_runner

    monkeypatch.setenv("PYC_LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(builds_mod, "device_facts", lambda: (90, 132))
    wanted = {64: ["c1", "c2"], 32: ["c2", "c3"]}
    monkeypatch.setattr(gemm_runner, "candidates_for",
                        lambda m, n, k, opts, cc, sm: (wanted[m], {}))
    built = []

    def key_of(cfg):
        return hashlib.sha256(f"{cfg}-sm90".encode()).hexdigest()

    def fake_build(cfg, dtype, layout, cc, cache, epilogue=None):
        built.append(cfg)
        key = key_of(cfg)
        entry = cache.put(key, {"kernel.so": f"binary of {cfg}".encode(), "kernel.cu": cfg})
        return BuildResult(cfg, key, entry.file("kernel.so"), "built")

    monkeypatch.setattr(nvcc, "build", fake_build)
    found = {}

    def tuner(m, n, k, *, options, db, **_):
        cache = KernelCache()
        found[m] = [cache.get(key_of(c)) is not None for c in wanted[m]]
        return _fake_autotune(m, n, k, options=options, db=db)

    monkeypatch.setattr(autotune_mod, "autotune_gemm", tuner)
    res = pl.autotune_many([(64, 128, 256), (32, 32, 32)], client=threads_client,
                           db=TuningDB(tmp_path / "db.sqlite"), budget_s=10)
    assert sorted(built) == ["c1", "c2", "c3"]  # c2, wanted by both, built once
    assert (res.builds_requested, res.builds_distinct) == (4, 3)
    assert found == {64: [True, True], 32: [True, True]}


def test_shipped_builds_are_stored_verified_and_only_once(monkeypatch, tmp_path):
    import hashlib

    from pyc_lab.distributed.builds import install_builds
    from pyc_lab.kernels.cache import KernelCache

    monkeypatch.setenv("PYC_LAB_CACHE_DIR", str(tmp_path / "elsewhere"))
    key = hashlib.sha256(b"k").hexdigest()
    shipped = [{"key": key, "status": "built", "files": {"kernel.so": b"\x7fELF...",
                                                         "kernel.cu": "// source"}},
               {"key": "", "status": "compile_error", "files": None, "message": "nvcc: 1"}]
    assert install_builds(shipped) == 1
    entry = KernelCache().get(key)
    assert entry is not None and entry.file("kernel.so").read_bytes() == b"\x7fELF..."
    assert install_builds(shipped) == 0  # already there


def test_an_observer_hears_each_problem_as_it_finishes(threads_client):
    events = []
    problems = [*RECORDED, MISSING]
    res = pl.autotune_many(problems, client=threads_client, replay=True, budget_s=60,
                           observer=events.append)
    assert sorted(e["done"] for e in events) == list(range(1, len(problems) + 1))
    assert {e["total"] for e in events} == {len(problems)}
    assert sorted(e["problem"] for e in events) == sorted(p.label for p in res.problems)
    by_label = {e["problem"]: e for e in events}
    missing = res.problems[-1]
    assert by_label[missing.label]["status"] == "not tuned"
    assert "no recorded tuning" in by_label[missing.label]["message"]
    tuned = res.problems[0]
    assert by_label[tuned.label]["winner"] == res.results[tuned].winner
    assert by_label[tuned.label]["worker"] == res.workers[tuned]

    def broken(event):
        raise RuntimeError("a widget bug")

    again = pl.autotune_many(RECORDED, client=threads_client, replay=True, budget_s=60,
                             observer=broken)
    assert all(again.results[p] is not None for p in again.problems)
    with pytest.raises(PycLabError, match="observer"):
        pl.autotune_many(RECORDED, replay=True, observer=events.append)


def test_per_candidate_reports_reach_the_observer_between_problems(threads_client):
    events = []
    res = pl.autotune_many(RECORDED, client=threads_client, replay=True, budget_s=60,
                           observer=events.append, per_candidate=True)
    problems = [e for e in events if e["event"] == "problem"]
    candidates = [e for e in events if e["event"] == "candidate"]
    assert sorted(e["done"] for e in problems) == list(range(1, len(RECORDED) + 1))
    labels = {p.label for p in res.problems}
    assert candidates and {e["problem"] for e in candidates} == labels
    assert {e["worker"] for e in candidates} <= set(res.workers.values())
    for e in candidates:
        assert isinstance(e["config"], str) and e["config"]
        assert e["ms"] is None or e["ms"] > 0
    # each problem's best tuned kernel was reported as one of its candidates
    for p in res.problems:
        mine = {e["config"] for e in candidates if e["problem"] == p.label}
        best = res.results[p].best
        assert config_name(best.config, best.config_id) in mine
    with pytest.raises(PycLabError, match="per_candidate"):
        pl.autotune_many(RECORDED, client=threads_client, replay=True, per_candidate=True)


def test_sweep_progress_follows_a_sweep_per_worker(threads_client):
    from pyc_lab.widgets import SweepProgress

    progress = SweepProgress()
    assert "0 of ? problem(s)" in progress.to_text()
    bar_and_table = progress.widget()  # shown before the sweep: updated by every report
    res = pl.autotune_many([*RECORDED, MISSING], client=threads_client, replay=True,
                           budget_s=60, observer=progress)
    frame = progress.to_frame()
    assert int(frame["done"].sum()) == 5 and int(frame["not_tuned"].sum()) == 1
    assert set(frame["worker"]) == set(res.workers.values())
    assert "5 of 5 problem(s) finished on 2 worker(s)" in progress.to_text()
    assert "inproc://" not in progress.to_text() and "inproc://" not in progress.to_html()
    bar, table = bar_and_table.children
    assert (bar.value, bar.max) == (5, 5) and "inproc://" in table.value
    assert int(frame["candidates"].sum()) == 0  # no per-candidate reports asked for
    watched = SweepProgress()
    pl.autotune_many(RECORDED, client=threads_client, replay=True, budget_s=60,
                     observer=watched, per_candidate=True)
    frame = watched.to_frame()
    assert int(frame["done"].sum()) == len(RECORDED) and int(frame["candidates"].sum()) > 0
    assert set(frame["now"]) == {""}  # every problem finished
    assert len(watched.events) == len(RECORDED)  # problems only
