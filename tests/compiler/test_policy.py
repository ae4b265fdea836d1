"""The policy's matmul choices (no GPU needed): cuBLASLt epilogues, cuBLAS plus a
generated epilogue, tuned CUTLASS, and the reasons recorded for each."""

from __future__ import annotations

import numpy as np
import pytest

from pyc_lab.compiler import Graph, policy
from pyc_lab.compiler.backend.executable import CupyExecutable
from pyc_lab.compiler.codegen import supports
from pyc_lab.kernels import cublaslt

F16, F32 = np.float16, np.float32


@pytest.fixture
def nvmath_present(monkeypatch):
    monkeypatch.setattr(cublaslt, "status", lambda: (True, "nvmath-python (test)"))


def matmul_graph(a_shape, b_shape, dtype=F16, bias=None, bias_dtype=None, act=None, **attrs):
    g = Graph(name="g")
    ins = [g.add("input", shape=a_shape, dtype=dtype).id,
           g.add("input", shape=b_shape, dtype=dtype).id]
    if bias is not None:
        ins.append(g.add("input", shape=bias, dtype=bias_dtype or dtype).id)
    if act:
        attrs["activation"] = act
    node = g.add("matmul", ins, attrs)
    g.outputs = [node.id]
    g.verify()
    return g, node


def decision(g, node, mode="balanced"):
    (d,) = [d for d in policy.choose(g, "cupy", mode, supports) if d.node == node.id]
    return d


@pytest.mark.parametrize("bias, act, epilogue", [((64,), "gelu", "GELU_BIAS"),
                                                 ((1, 64), "relu", "RELU_BIAS"),
                                                 ((64,), None, "BIAS"),
                                                 (None, "gelu", "GELU")])
def test_epilogues_cublaslt_can_fuse_choose_it(nvmath_present, bias, act, epilogue):
    g, node = matmul_graph((32, 16), (16, 64), bias=bias, act=act)
    d = decision(g, node)
    assert (d.choice, d.reason) == ("cublaslt", "CUBLASLT_EPILOGUE")
    assert "inside the GEMM" in d.detail and "heuristic" in d.detail
    exe = CupyExecutable(g, {node.id: d.choice})  # building needs no GPU
    (k,) = exe.kernels
    assert k["implementation"] == f"cuBLASLt (nvmath-python), epilogue {epilogue}"
    assert k["ops"][0] == "matmul" and (act is None or k["ops"][-1] == act)


def test_utilization_first_measures_the_algorithms(nvmath_present):
    g, node = matmul_graph((32, 16), (16, 64), bias=(64,), act="gelu")
    assert "measured at the first call" in decision(g, node, "utilization_first").detail
    exe = CupyExecutable(g, {node.id: "cublaslt"}, tune_gemms=True)
    assert exe._steps[0].autotune and "measured" in exe.kernels[0]["notes"]


@pytest.mark.parametrize("kwargs, why", [
    ({"act": "silu", "bias": (64,)}, "cuBLASLt has no silu epilogue"),
    ({"act": "gelu", "a_shape": (3, 32, 16)}, "batched matmul"),
    ({"bias": (64,), "bias_dtype": F32}, "the cuBLASLt path takes one dtype"),
    ({"act": "relu", "dtype": np.float64}, "the cuBLASLt path takes one dtype"),
])
def test_other_epilogues_keep_the_generated_kernel_and_say_why(nvmath_present, kwargs, why):
    a_shape = kwargs.pop("a_shape", (32, 16))
    g, node = matmul_graph(a_shape, (16, 64), **kwargs)
    d = decision(g, node)
    assert (d.choice, d.reason) == ("cublas", "CUBLAS_DEFAULT")
    assert "by a generated kernel" in d.detail and "(not cuBLASLt: " in d.detail
    assert why in d.detail


def test_a_plain_matmul_is_cublas_without_excuses(nvmath_present):
    g, node = matmul_graph((32, 16), (16, 64))
    d = decision(g, node)
    assert d.choice == "cublas" and "cuBLASLt" not in d.detail


def test_without_nvmath_the_reason_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(cublaslt, "status",
                        lambda: (False, "nvmath-python is not installed (pip install x)"))
    g, node = matmul_graph((32, 16), (16, 64), bias=(64,), act="gelu")
    d = decision(g, node)
    assert d.choice == "cublas" and "nvmath-python is not installed" in d.detail
    # an executable asked for cublaslt anyway falls back to cuBLAS + generated epilogue
    exe = CupyExecutable(g, {node.id: "cublaslt"})
    assert "cublaslt not used: nvmath-python is not installed" in exe._fallbacks[node.id]
    assert exe.kernels[0]["implementation"].startswith(
        "library GEMM (pl.matmul's path: cuBLAS, or cuBLASLt where it is faster) + "
        "generated epilogue; or the generated small GEMM")


def test_a_tuned_kernel_wins_over_cublaslt(nvmath_present, monkeypatch):
    monkeypatch.setattr(policy, "TUNED_LOOKUP", lambda node, graph: "cutlass_sm90_x")
    g, node = matmul_graph((32, 16), (16, 64), bias=(64,), act="gelu")
    d = decision(g, node)
    assert (d.choice, d.reason) == ("cutlass", "CUTLASS_TUNED") and "cutlass_sm90_x" in d.detail
    assert "bias+gelu inside its epilogue" in d.detail
    exe = CupyExecutable(g, {node.id: d.choice})  # the step holds its cuBLASLt fallback
    (k,) = exe.kernels
    assert k["kind"] == "cutlass" and "epilogue bias_gelu fused" in k["implementation"]
    assert "cuBLASLt" in k["implementation"]
    assert type(exe._steps[0].fallback).__name__ == "_LtStep"


@pytest.mark.parametrize("a, b, attrs, bias, act, want", [
    ((32, 16), (16, 64), {}, None, None, (32, 64, 16, "f16", "tt", "")),
    ((32, 16), (64, 16), {"transpose_b": True}, (64,), "gelu", (32, 64, 16, "f16", "tn",
                                                                 "bias_gelu")),
    ((16, 32), (16, 64), {"transpose_a": True}, (1, 64), "silu", (32, 64, 16, "f16", "nt",
                                                                  "bias_silu")),
])
def test_tuned_problem_reads_shape_layout_and_epilogue(a, b, attrs, bias, act, want):
    g, node = matmul_graph(a, b, bias=bias, act=act, **attrs)
    problem, why = policy.tuned_problem(node, g)
    assert why == "" and (*problem[:5], problem[5].name) == want


@pytest.mark.parametrize("kwargs, why", [
    ({"a_shape": (2, 32, 16), "b_shape": (16, 64)}, "batched"),
    ({"a_shape": (32, 16), "b_shape": (16, 64), "dtype": np.float64}, "float64"),
    ({"a_shape": (32, 16), "b_shape": (16, 64), "bias": (64,), "bias_dtype": F32},
     "float16 @ float16 -> float32"),
])
def test_tuned_problem_says_why_not(kwargs, why):
    g, node = matmul_graph(**kwargs)
    problem, got = policy.tuned_problem(node, g)
    assert problem is None and why in got


def test_the_default_lookup_asks_the_tuning_database(tmp_path, monkeypatch):
    from pyc_lab.hardware import device as gpu
    from pyc_lab.kernels import matmul
    from pyc_lab.kernels.cutlass import GemmConfig
    from pyc_lab.kernels.tuning import database as tuning_db

    device = tuning_db.DeviceKey("NVIDIA H200", "9.0", "580.00", "13.0")
    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "t.sqlite")
    monkeypatch.setattr(matmul, "device_key", lambda index=0: (device, 90, 132))
    cfg = GemmConfig((256, 128, 64), (2, 1, 1), "TmaWarpSpecializedCooperative",
                     "TmaWarpSpecializedCooperative", "Default")
    problem = tuning_db.ProblemKey("gemm_bias_gelu", "f16", "f16", "f16", "tn", 4096, 4096, 1024)
    with tuning_db.TuningDB() as db:  # the tuned kernel beat the library in its run
        db.record_many(device, problem, [
            tuning_db.Measurement(cfg.to_dict(), "ok", 0.1),
            tuning_db.Measurement({"baseline": "cublas"}, "baseline", 0.2),
            tuning_db.Measurement({"baseline": "cublaslt"}, "baseline", 0.15)], run_id="r1")
    g, node = matmul_graph((4096, 1024), (4096, 1024), bias=(4096,), act="gelu",
                           transpose_b=True)
    assert policy.tuned_lookup(node, g) is None  # no GPU here: never asks
    monkeypatch.setattr(gpu, "cupy_status", lambda: (object(), "ok"))
    assert policy.tuned_lookup(node, g).startswith(f"{cfg.id} (exact match (4096x4096x1024): "
                                                   "tuned kernel 0.100 ms beat")
    g2, near = matmul_graph((3000, 1024), (4096, 1024), bias=(4096,), act="gelu",
                            transpose_b=True)
    assert "bucket match (4096x4096x1024)" in policy.tuned_lookup(near, g2)
    g3, plain = matmul_graph((4096, 1024), (4096, 1024), transpose_b=True)
    assert policy.tuned_lookup(plain, g3) is None  # tuned with the epilogue only
    d = decision(g, node)
    assert (d.choice, d.reason) == ("cutlass", "CUTLASS_TUNED")
    # an entry that lost to the library in its tuning run is never chosen
    with tuning_db.TuningDB() as db:
        db.record_many(device, tuning_db.ProblemKey("gemm", "f16", "f16", "f16", "tn",
                                                    4096, 4096, 1024), [
            tuning_db.Measurement(cfg.to_dict(), "ok", 0.3),
            tuning_db.Measurement({"baseline": "cublas"}, "baseline", 0.2)], run_id="r2")
    matmul.forget()
    assert policy.tuned_lookup(plain, g3) is None


@pytest.mark.parametrize("args, why", [
    (((4, 8), (8, 6), F16, F16, F16, (6,), F16, "tanh"), "no tanh epilogue"),
    (((4, 8), (8, 6), F16, F16, F16, None, None, None), "no epilogue to fuse"),
    (((4, 8), (7, 6), F32, F32, F32, (6,), F32, None), "inner dimensions differ"),
    (((4, 8), (8, 6), F32, F32, F32, (4, 1), F32, None), "not a row vector of length 6"),
    (((0, 8), (8, 6), F32, F32, F32, (6,), F32, None), "an empty matrix"),
    (((4, 8), (8, 6), F32, F32, F32, (1, 6), F32, "relu"), ""),
])
def test_why_not(nvmath_present, args, why):
    got = cublaslt.why_not(*args)
    assert (why in got) if why else got == ""


def test_fused_gemm_refuses_an_epilogue_cublaslt_lacks():
    from pyc_lab.errors import PycLabError

    with pytest.raises(PycLabError, match="no cuBLASLt epilogue"):
        cublaslt.FusedGemm(None, has_bias=False)
