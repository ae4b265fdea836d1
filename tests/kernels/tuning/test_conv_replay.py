"""Replaying the H200's convolution tunings without a GPU: the shipped recording, the
search over it (same strategy and options as ``autotune_conv``), observers and stops, a
recording of one's own (a hung candidate ends the search), and every refusal; the script
that makes a recording from a ``bench_conv_cutlass`` run."""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path

import pytest

import pyc_lab as pl
from pyc_lab.kernels.tuning.conv_replay import recorded_conv_layers

LAYER = "resnet50 256->256 14x14 3x3 s1"
ROOT = Path(__file__).resolve().parents[3]


def _recorded(layer, dtype):
    rec = json.loads((ROOT / "pyc_lab/data/tuning/h200-conv.json").read_text())
    (found,) = [x for x in rec["layers"] if x["layer"] == layer and x["dtype"] == dtype]
    return rec, found


def test_the_shipped_recording_lists_its_layers():
    layers = recorded_conv_layers()
    assert len(layers) >= 10 and set(layers["dtype"]) == {"f16", "bf16"}
    assert (layers["candidates"] > 0).all() and (layers["cudnn_ms"] > 0).all()
    assert (layers["device"] == "NVIDIA H200").all()
    row = layers[(layers["layer"] == LAYER) & (layers["dtype"] == "bf16")].iloc[0]
    assert row["x_shape"] == (128, 256, 14, 14) and row["w_shape"] == (256, 256, 3, 3)
    assert (row["stride"], row["padding"]) == (1, 1)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_the_replay_finds_what_was_recorded(dtype):
    _, rec = _recorded(LAYER, dtype)
    seen = []
    res = pl.replay_autotune_conv(LAYER, dtype=dtype, max_candidates=None,
                                  observer=lambda row: seen.append(row["config"]))
    assert len(seen) == len(res.table) == len(rec["candidates"])
    ok = [c for c in rec["candidates"] if c["status"] == "ok"]
    fastest = min(ok, key=lambda c: c["ms"])
    assert res.best.time_ms == fastest["ms"]
    assert res.best.config == {"tile": fastest["tile"], "cluster": fastest["cluster"]}
    assert res.baselines == {"cudnn": rec["cudnn_ms"]}
    assert res.speedup == pytest.approx(rec["cudnn_ms"] / fastest["ms"])
    table = res.table.set_index("config")
    for c in rec["candidates"]:
        row = table.loc[f"conv_t{c['tile']}_c{c['cluster']}"]
        assert row["status"] == c["status"] and row["ms"] == c["ms"]
    assert res.problem.op == "conv2d_fprop" and res.problem.layout.startswith("nhwc r3x3")
    assert "NVIDIA H200" in res.replay.banner and "no kernel runs here" in res.replay.banner
    assert res.replay.label.startswith("recorded on NVIDIA H200")


def test_the_default_cut_is_the_live_tunings():
    _, rec = _recorded(LAYER, "f16")
    res = pl.replay_autotune_conv(LAYER)  # autotune_conv's defaults: the first 6, in order
    assert set(res.table["config"]) == {f"conv_t{c['tile']}_c{c['cluster']}"
                                        for c in rec["candidates"][:6]}


def test_a_paced_replay_stops_when_asked():
    stop = threading.Event()
    seen = []

    def observer(row):
        seen.append(row)
        stop.set()

    res = pl.replay_autotune_conv(LAYER, pace_s=30.0, stop=stop, observer=observer)
    assert len(seen) == 1 and res.stopped_by != "exhausted"


def test_a_recording_of_ones_own_and_a_hung_candidate(tmp_path):
    rec, layer = _recorded(LAYER, "f16")
    cands = [dict(c) for c in layer["candidates"][:4]]
    cands[1] = {**cands[1], "status": "timeout", "ms": None,
                "message": "the kernel did not finish"}
    own = {**rec, "layers": [{**layer, "candidates": cands}]}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(own))
    res = pl.replay_autotune_conv(LAYER, source=path)
    # the hung candidate ends the search, as it did live: nothing after it is evaluated
    assert "timeout" in set(res.table["status"]) and len(res.table) < len(cands)
    assert res.stopped_by != "exhausted"
    assert res.replay.source_label == str(path)


def test_refusals(tmp_path):
    with pytest.raises(pl.PycLabError, match=r"is not in .* it holds: resnet50"):
        pl.replay_autotune_conv("resnet50 9->9 1x1 1x1 s1")
    with pytest.raises(pl.PycLabError, match="pace_s"):
        pl.replay_autotune_conv(LAYER, pace_s=-1)
    with pytest.raises(pl.PycLabError, match="no convolution tuning recording"):
        pl.replay_autotune_conv(LAYER, source=tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"layers": [{"layer": 1}]}')
    with pytest.raises(pl.PycLabError, match="not a convolution tuning recording"):
        recorded_conv_layers(bad)
    with pytest.raises(pl.PycLabError, match="unknown GEMM tuning option"):
        pl.replay_autotune_conv(LAYER, colour="red")


def test_the_refresh_script_keeps_the_tuned_layers(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "refresh_conv_recording", ROOT / "scripts/refresh_conv_recording.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cand = {"config": "conv_t128x128x64_c1x1", "tile": "128x128x64", "cluster": "1x1",
            "status": "ok", "ms": 0.05, "error": 1e-3, "message": ""}
    run = {"environment": {"device": "NVIDIA H200", "driver": "580", "cuda_driver": "13.0",
                           "date": "2026-12-04T00:00:00", "git_sha": "abc"},
           "method": "m",
           "results": [
               {"layer": "l1", "dtype": "float16", "n": 2, "c": 16, "k": 32, "size": 9,
                "kernel": 3, "stride": 1, "tune": {"cudnn_ms": 0.04, "candidates": [cand]}},
               {"layer": "stem", "dtype": "bfloat16", "n": 2, "c": 3, "k": 64, "size": 9,
                "kernel": 7, "stride": 2, "tune": {"candidates": []}}]}
    src = tmp_path / "run.json"
    src.write_text(json.dumps(run))
    dest = tmp_path / "rec.json"
    assert mod.refresh(src, dest) == 1
    layers = recorded_conv_layers(dest)
    assert list(layers["layer"]) == ["l1"] and layers["padding"][0] == 1
    res = pl.replay_autotune_conv("l1", source=dest)
    assert res.best.time_ms == 0.05 and res.baselines == {"cudnn": 0.04}
    src.write_text(json.dumps({**run, "results": run["results"][1:]}))
    with pytest.raises(pl.PycLabError, match="no tuned convolution layer"):
        mod.refresh(src, dest)
