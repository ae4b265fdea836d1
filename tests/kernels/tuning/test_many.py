"""``autotune_many``: problems read from every accepted form, the replay mode over the
shipped H200 recording (no GPU), the summary table, the winner across CUTLASS and the
libraries, and ``pyc-lab tune many``."""

from __future__ import annotations

import json

import pytest

import pyc_lab as pl
from pyc_lab.cli import main
from pyc_lab.errors import PycLabError
from pyc_lab.kernels.tuning.keys import ProblemKey
from pyc_lab.kernels.tuning.many import GemmProblem, parse_problems, read_problems


def test_problems_in_every_form_are_read_and_deduplicated():
    key = ProblemKey("gemm", "bf16", "bf16", "bf16", "tn", 8, 4096, 4096)
    got = parse_problems([(4096, 4096, 4096), "4096x4096x4096", (1, 4096, 4096, "bf16"),
                          {"m": 2, "n": 8, "k": 8, "layout": "nt"}, key,
                          GemmProblem(3, 8, 8)])
    assert got == [GemmProblem(4096, 4096, 4096), GemmProblem(1, 4096, 4096, "bf16"),
                   GemmProblem(2, 8, 8, "f16", "nt"), GemmProblem(8, 4096, 4096, "bf16"),
                   GemmProblem(3, 8, 8)]
    assert parse_problems(["16x16x16"], dtype="bf16")[0].dtype == "bf16"


@pytest.mark.parametrize("bad, match", [([], "no problems"), (["4096x4096"], "MxNxK"),
                                        ([(0, 4, 4)], "positive"), ([(4, 4, 4, "f8")], "dtype"),
                                        ([object()], "cannot read")])
def test_bad_problems_are_clear_errors(bad, match):
    with pytest.raises(PycLabError, match=match):
        parse_problems(bad)


def test_problem_files_text_and_json(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("# model shapes\n4096x4096x4096\n1x4096x4096 bf16  # decode\n"
                    "8x8x8 f16 nt\n")
    assert read_problems(text) == [GemmProblem(4096, 4096, 4096),
                                   GemmProblem(1, 4096, 4096, "bf16"),
                                   GemmProblem(8, 8, 8, "f16", "nt")]
    js = tmp_path / "p.json"
    js.write_text(json.dumps([[512, 512, 512, "bf16"], "8x8x8"]))
    assert read_problems(js) == [GemmProblem(512, 512, 512, "bf16"), GemmProblem(8, 8, 8)]
    bad = tmp_path / "bad.txt"
    bad.write_text("4096 x\n")
    with pytest.raises(PycLabError, match=r"bad\.txt:1"):
        read_problems(bad)


def test_replay_many_gives_a_summary_with_winners_and_speedups():
    res = pl.autotune_many([(4096, 4096, 4096), (2048, 2048, 2048, "bf16"),
                            (1, 4096, 4096)], replay=True, budget_s=60)
    frame = res.summary
    assert list(frame["problem"]) == ["f16 tn 4096x4096x4096", "bf16 tn 2048x2048x2048",
                                      "f16 tn 1x4096x4096"]
    tuned = frame.iloc[0]
    assert tuned["candidates"] > 0 and tuned["best_library"] in ("cublas", "torch")
    assert tuned["speedup"] == pytest.approx(tuned["best_library_ms"]
                                             / tuned["best_cutlass_ms"])
    # the winner is the faster of the best CUTLASS candidate and the best library
    cutlass_wins = tuned["best_cutlass_ms"] < tuned["best_library_ms"]
    assert tuned["winner"].startswith("cutlass:") == cutlass_wins
    assert tuned["winner_ms"] == min(tuned["best_cutlass_ms"], tuned["best_library_ms"])
    missing = frame.iloc[2]
    assert missing["status"] == "not tuned" and missing["winner"] == "library"
    assert "no recorded tuning" in missing["message"]
    assert frame.attrs["budget_s"] == 60 and frame.attrs["replay"] is True
    assert res.total_seconds < 60
    assert "3 problems, 2 replayed" in repr(res)


def test_the_result_winner_is_the_library_when_cutlass_loses():
    res = pl.replay_autotune(4096, 4096, 4096, dtype="f16")
    lib_name, lib_ms = res.best_library
    assert lib_ms == min(res.baselines.values())
    if res.best.time_ms >= lib_ms:
        assert res.winner == lib_name and res.speedup <= 1
    else:
        assert res.winner.startswith("cutlass:") and res.speedup > 1


def test_live_many_without_a_gpu_is_a_clear_error():
    with pytest.raises(PycLabError):
        pl.autotune_many([(128, 128, 128)], budget_s=1)


def test_cli_tune_many_replays_and_prints_the_summary(capsys, tmp_path):
    assert main(["tune", "many", "--problems", "4096x4096x4096,1x4096x4096",
                 "--replay"]) == 0
    out = capsys.readouterr().out
    assert "2 problem(s) replayed from a recording" in out and "not tuned" in out
    f = tmp_path / "p.txt"
    f.write_text("2048x2048x2048 bf16\n")
    assert main(["tune", "many", str(f), "--replay", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["problem"] == "bf16 tn 2048x2048x2048" and rows[0]["candidates"] > 0


@pytest.mark.parametrize("argv, message", [
    (["tune", "many"], "give a FILE or --problems"),
    (["tune", "many", "--problems", "4x4"], "MxNxK"),
    (["tune", "many", "--problems", "8x8x8"], "live tuning needs a CUDA device"),
])
def test_cli_tune_many_errors_are_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_shared_builds_build_each_kernel_once(monkeypatch):
    from pyc_lab.kernels import cutlass as cg
    from pyc_lab.kernels.cutlass.nvcc import BuildResult
    from pyc_lab.kernels.tuning import builds

    calls = []

    def fake_build(cfg, dtype, layout, cc, cache, epilogue=None):
        calls.append((cfg.id, dtype))
        return BuildResult(cfg, "key", None, "compile_error", 0.0, "fake")

    monkeypatch.setattr(builds, "build", fake_build)
    a = cg.GemmConfig((128, 128, 64), (1, 1, 1), "TmaWarpSpecializedCooperative",
                      "NoSmemWarpSpecialized", "Default")
    b = cg.GemmConfig((128, 16, 128), (1, 1, 1), "TmaWarpSpecializedCooperative",
                      "NoSmemWarpSpecialized", "Default", swap=True)
    shared = builds.SharedBuilds(workers=2)
    first = shared.submit([a, b], "f16", "tn", 90)
    second = shared.submit([b, a], "f16", "tn", 90)
    other = shared.submit([a], "bf16", "tn", 90)
    assert first[a] is second[a] and first[b] is second[b] and other[a] is not first[a]
    assert [f.result().status for f in (first[a], first[b], other[a])] == ["compile_error"] * 3
    shared.shutdown(wait=True)
    assert shared.requested == 5 and shared.distinct == 3 and len(calls) == 3


def test_live_many_splits_the_budget_fairly_and_reports_failures(monkeypatch):
    from pyc_lab.kernels.tuning import autotune, many
    from pyc_lab.kernels.tuning.keys import DeviceKey, Measurement

    class FakeShared:
        requested, distinct = 7, 4

        def shutdown(self, wait=False):
            self.closed = True

    shares = []
    fake_clock = [0.0]
    monkeypatch.setattr(many.time, "perf_counter", lambda: fake_clock[0])
    monkeypatch.setattr(many, "_start_builds", lambda *a, **k: FakeShared())

    def fake_tune(m, n, k, *, options, db, cache, stop, builds):
        shares.append(options.budget_s)
        fake_clock[0] += options.budget_s / 2  # each problem uses half its share
        if m == 3:
            raise PycLabError("no CUTLASS configuration left")
        dev = DeviceKey("NVIDIA H200", "9.0", "580", "13.0")
        prob = ProblemKey("gemm", options.dtype, options.dtype, options.dtype,
                          options.layout, m, n, k)
        best = Measurement({"tile": [128, 128, 64], "cluster": [1, 1, 1],
                            "kernel_schedule": "TmaWarpSpecializedCooperative",
                            "epilogue_schedule": "NoSmemWarpSpecialized",
                            "tile_scheduler": "Default"}, "ok", 1.0)
        import pandas as pd

        return autotune.TuneResult(prob, dev, best, pd.DataFrame({"status": ["ok"]}),
                                   {"cublas": 1.1, "torch": 1.3}, 1.0, "max_seconds")

    monkeypatch.setattr(autotune, "autotune_gemm", fake_tune)
    res = many.autotune_many([(1, 8, 8), (3, 8, 8), (2, 8, 8, "bf16")], budget_s=90)
    assert shares == pytest.approx([30.0, 37.5, 56.25])  # leftovers roll forward
    frame = res.summary
    assert list(frame["status"]) == ["max_seconds", "not tuned", "max_seconds"]
    assert frame["winner"][0] == "cutlass:128x128x64_c1x1x1_TmaCoop_NoSmemWS_Default"
    assert frame["speedup"][0] == pytest.approx(1.1)
    assert frame["best_library"][0] == "cublas"
    assert "no CUTLASS configuration" in frame["message"][1]
    assert (res.builds_requested, res.builds_distinct) == (7, 4)


def test_waiting_for_a_build_stops_at_the_deadline():
    """A build still compiling when the tuning budget ends is given up (None), not
    waited for; a finished one is returned; no deadline waits."""
    import concurrent.futures as cf
    import threading
    import time

    from pyc_lab.kernels.tuning.builds import wait_for_build

    release = threading.Event()
    with cf.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(lambda: release.wait(5) and "built")
        t0 = time.perf_counter()
        assert wait_for_build(slow, time.perf_counter() + 0.05) is None
        assert time.perf_counter() - t0 < 1.0
        assert wait_for_build(slow, time.perf_counter() - 1.0) is None  # already past
        release.set()
        assert wait_for_build(slow, None) == "built"
        assert wait_for_build(slow, time.perf_counter()) == "built"  # done: no wait
    cancelled: cf.Future = cf.Future()
    cancelled.cancel()
    assert wait_for_build(cancelled, None) is None


def test_problems_carry_their_epilogue():
    from pyc_lab.kernels.tuning.many import GemmProblem, parse_problems

    (p,) = parse_problems([{"m": 8, "n": 128, "k": 64, "bias": True, "activation": "relu"}])
    assert (p.bias, p.activation, p.label) == (True, "relu", "f16 tn 8x128x64 +bias_relu")
    assert GemmProblem(8, 128, 64).label == "f16 tn 8x128x64"
    with pytest.raises(pl.PycLabError, match="activation"):
        GemmProblem(8, 128, 64, activation="tanh")
