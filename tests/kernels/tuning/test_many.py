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
