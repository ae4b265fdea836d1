"""pl.matmul's routing without a GPU: the never-slower rule against the library times of
the same tuning run, the library path per dtype, batched folding and layouts.

CuPy arrays are stood in for by objects with a CuPy module, shape, strides, dtype and
flags: choosing reads nothing else, and CuPy itself imports without a GPU.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels import cublaslt, matmul_tuned
from pyc_lab.kernels import cutlass as cg
from pyc_lab.kernels import matmul as mm
from pyc_lab.kernels.arrays import bf16_dtype
from pyc_lab.kernels.lt_algos import LtPick
from pyc_lab.kernels.lt_tuned import TunedLt
from pyc_lab.kernels.matmul_route import (
    BUCKET_MARGIN,
    EXACT_MARGIN,
    library_path,
    tuned_verdict,
)
from pyc_lab.kernels.tuning import database as tuning_db
from pyc_lab.kernels.tuning.keys import DeviceKey, Measurement, ProblemKey

pytest.importorskip("cupy")

DEVICE = DeviceKey("NVIDIA H200", "9.0", "580.00", "13.0")
CFG = cg.GemmConfig((128, 128, 64), (1, 2, 1), "TmaWarpSpecializedCooperative",
                    "TmaWarpSpecializedCooperative", "Default")


class FakeGpuArray:
    """What routing reads of a CuPy array: module, shape, strides, dtype, flags, device."""

    __module__ = "cupy._core.core"

    def __init__(self, shape: tuple[int, ...], dtype: str = "float16", order: str = "C"):
        self.dtype = bf16_dtype() if dtype == "bfloat16" else np.dtype(dtype)
        self.shape, self.ndim, self.order = tuple(shape), len(shape), order
        size = self.dtype.itemsize
        dims = self.shape if order == "C" else self.shape[::-1]
        strides, step = [], size
        for d in reversed(dims):
            strides.append(step)
            step *= d
        self.strides = tuple(reversed(strides)) if order == "C" else tuple(strides)
        self.flags = SimpleNamespace(c_contiguous=order == "C" or self.ndim == 1,
                                     f_contiguous=order == "F" or self.ndim == 1)
        self.device = SimpleNamespace(id=0)

    @property
    def T(self) -> FakeGpuArray:
        return FakeGpuArray(self.shape[::-1], self.dtype.name, "F" if self.order == "C" else "C")

    def reshape(self, *shape) -> FakeGpuArray:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        if shape == (-1,):
            shape = (int(np.prod(self.shape)),)
        return FakeGpuArray(shape, self.dtype.name)


class FakeKernel:
    """A loaded tuned kernel: records its launches."""

    def __init__(self) -> None:
        self.config = CFG
        self.calls: list[tuple] = []

    def __call__(self, a, b, out, alpha=1.0, beta=0.0, bias=None):
        self.calls.append((a.shape, b.shape, out.shape, alpha, beta, bias))
        return out


@pytest.fixture
def tuned_db(tmp_path, monkeypatch):
    """A private tuning database for this GPU, and a kernel 'loaded' for any winner."""
    monkeypatch.setattr(tuning_db, "default_path", lambda: tmp_path / "t.sqlite")
    monkeypatch.setattr(mm, "device_key", lambda index=0: (DEVICE, 90, 132))
    monkeypatch.setattr(matmul_tuned, "device_key", lambda index=0: (DEVICE, 90, 132))
    kernel = FakeKernel()
    monkeypatch.setattr(mm, "_load", lambda found, dtype, layout, epi, why, shape:
                        (kernel, why))
    mm.forget()
    yield kernel
    mm.forget()


def record(problem: ProblemKey, tuned_ms: float, baselines: dict[str, float],
           run_id: str = "run-1") -> None:
    with tuning_db.TuningDB() as db:
        db.record_many(DEVICE, problem, [
            Measurement(CFG.to_dict(), "ok", tuned_ms),
            *(Measurement({"baseline": name}, "baseline", ms) for name, ms in baselines.items())],
            run_id=run_id)


def gemm(m: int, n: int, k: int, dtype: str = "f16", layout: str = "tn",
         op: str = "gemm") -> ProblemKey:
    return ProblemKey(op, dtype, dtype, dtype, layout, m, n, k)


# -- the rule ---------------------------------------------------------------------------

def test_the_verdict_says_who_won_and_by_how_much():
    assert tuned_verdict(0.412, "exact", {"cublas": 0.398}) == (
        False, "tuned kernel 0.412 ms lost to cuBLAS 0.398 ms in its tuning run")
    assert tuned_verdict(0.380, "exact", {"cublas": 0.398, "torch": 0.2}) == (
        True, "tuned kernel 0.380 ms beat cuBLAS 0.398 ms in its tuning run")
    wins, why = tuned_verdict(0.391, "exact", {"cublas": 0.398})  # 1.8 %: within the spread
    assert not wins and "by less than 2%, within the spread between runs" in why
    wins, why = tuned_verdict(0.398, "exact", {"cublas": 0.398})
    assert not wins and "lost to cuBLAS" in why  # a tie goes to the library
    # the fastest library pl.matmul can call counts; torch is no path of pl.matmul's
    wins, why = tuned_verdict(0.39, "exact", {"cublas": 0.40, "cublaslt": 0.38})
    assert not wins and "lost to cuBLASLt 0.380 ms" in why
    wins, why = tuned_verdict(0.38, "exact", {"cublas": 0.40, "cublaslt": 0.37},
                              callable_libs=("cublas",))
    assert wins and "beat cuBLAS 0.400 ms" in why
    wins, why = tuned_verdict(0.1, "exact", {"torch": 0.2})
    assert not wins and "recorded no time of a library pl.matmul can call" in why


def test_a_bucket_match_must_win_by_a_margin():
    lib = 1.0
    assert not tuned_verdict(lib * (1 - BUCKET_MARGIN / 2), "bucket", {"cublas": lib})[0]
    wins, why = tuned_verdict(lib * (1 - 2 * BUCKET_MARGIN), "bucket", {"cublas": lib})
    assert wins and "by at least 3%" in why
    between = lib * (1 - (BUCKET_MARGIN + EXACT_MARGIN) / 2)
    assert tuned_verdict(between, "exact", {"cublas": lib})[0]
    assert not tuned_verdict(between, "bucket", {"cublas": lib})[0]
    assert not tuned_verdict(lib * (1 - EXACT_MARGIN / 2), "exact", {"cublas": lib})[0]


def test_the_library_path_per_dtype():
    assert library_path("float16", None, "")[0] == "cublas"
    assert library_path("bfloat16", None, "")[0] == "cublaslt"
    impl, why = library_path("bfloat16", None, "nvmath-python is not installed")
    assert impl == "cublas" and "nvmath-python is not installed" in why
    assert library_path("float16", "", "")[0] == "cublaslt"
    impl, why = library_path("float64", "dtypes ['float64']", "")
    assert impl == "cublas" and "CuPy for the epilogue" in why


def test_baselines_are_read_per_tuning_run(tmp_path):
    with tuning_db.TuningDB(tmp_path / "b.sqlite") as db:
        p = gemm(256, 256, 256)
        db.record_many(DEVICE, p, [Measurement({"baseline": "cublas"}, "baseline", 0.4),
                                   Measurement({"baseline": "torch"}, "baseline", 0.5)],
                       run_id="a")
        db.record_many(DEVICE, p, [Measurement({"baseline": "cublas"}, "baseline", 0.3)],
                       run_id="b")
        assert db.baselines(DEVICE, p, run_id="a") == {"cublas": 0.4, "torch": 0.5}
        assert db.baselines(DEVICE, p, run_id="b") == {"cublas": 0.3}
        assert db.baselines(DEVICE, p) == {"cublas": 0.3, "torch": 0.5}
        assert db.baselines(DEVICE, gemm(512, 256, 256)) == {}


# -- pl.matmul's choice -------------------------------------------------------------------

def test_a_losing_tuned_entry_routes_to_the_library(tuned_db):
    record(gemm(256, 384, 512), 0.412, {"cublas": 0.398, "torch": 0.5})
    a, w = FakeGpuArray((256, 512)), FakeGpuArray((384, 512))
    plan = pl.matmul_plan(a, w.T)
    assert plan.choice["impl"] == "cublas"
    assert plan.choice["reason"].startswith(
        "tuned kernel 0.412 ms lost to cuBLAS 0.398 ms in its tuning run; cuBLAS")
    assert plan.choice["match"] == "exact (256x384x512)"
    assert "lost to cuBLAS" in plan.explain()


def test_a_winning_tuned_entry_routes_to_the_tuned_kernel(tuned_db):
    record(gemm(256, 384, 512), 0.380, {"cublas": 0.398})
    a, w = FakeGpuArray((256, 512)), FakeGpuArray((384, 512))
    out = FakeGpuArray((256, 384))
    plan = pl.matmul_plan(a, w.T, out=out)
    assert plan.choice["impl"] == "cutlass", plan.choice
    assert "beat cuBLAS 0.398 ms" in plan.choice["reason"]
    assert plan.choice["config"] == CFG.id
    assert plan(a, w.T) is out  # launches the kernel into out, nothing else
    assert tuned_db.calls == [((256, 512), (512, 384), (256, 384), 1.0, 0.0, None)]


def test_the_winner_is_judged_against_its_own_runs_baselines(tuned_db):
    p = gemm(256, 384, 512)
    record(p, 0.50, {"cublas": 0.40}, run_id="old")  # a slow, older run
    record(p, 0.38, {"cublas": 0.39}, run_id="new")  # the winner and its own baseline
    a, w = FakeGpuArray((256, 512)), FakeGpuArray((384, 512))
    assert pl.matmul_plan(a, w.T).choice["impl"] == "cutlass"


def test_an_entry_without_library_times_is_not_trusted(tuned_db):
    with tuning_db.TuningDB() as db:
        db.record(DEVICE, gemm(256, 384, 512), Measurement(CFG.to_dict(), "ok", 0.01))
    plan = pl.matmul_plan(FakeGpuArray((256, 512)), FakeGpuArray((384, 512)).T)
    assert plan.choice["impl"] == "cublas" and "recorded no time" in plan.choice["reason"]


def test_a_bucket_match_needs_the_margin(tuned_db):
    record(gemm(256, 384, 512), 0.389, {"cublas": 0.398})  # wins, by less than the margin
    near = pl.matmul_plan(FakeGpuArray((200, 512)), FakeGpuArray((384, 512)).T)
    assert near.choice["impl"] == "cublas"
    assert near.choice["match"] == "bucket (256x384x512)"
    assert "a bucket match must win by 3%" in near.choice["reason"]
    exact = pl.matmul_plan(FakeGpuArray((256, 512)), FakeGpuArray((384, 512)).T)
    assert exact.choice["impl"] == "cutlass"
    mm.forget()
    record(gemm(256, 384, 512), 0.30, {"cublas": 0.398}, run_id="run-2")
    near = pl.matmul_plan(FakeGpuArray((200, 512)), FakeGpuArray((384, 512)).T)
    assert near.choice["impl"] == "cutlass" and near.choice["match"].startswith("bucket")


def test_a_kernel_that_refuses_the_actual_shape_is_not_used(tuned_db, monkeypatch):
    record(gemm(256, 384, 512), 0.30, {"cublas": 0.398})

    def refusing(found, dtype, layout, epi, why, shape):
        return None, f"tuned kernel {CFG.id} cannot take {'x'.join(map(str, shape))}"

    monkeypatch.setattr(mm, "_load", refusing)
    plan = pl.matmul_plan(FakeGpuArray((200, 512)), FakeGpuArray((384, 512)).T)
    assert plan.choice["impl"] == "cublas" and "cannot take 200x384x512" in plan.choice["reason"]


def test_cublaslt_times_count_only_where_nvmath_is(tuned_db, monkeypatch):
    record(gemm(256, 384, 512), 0.39, {"cublas": 0.40, "cublaslt": 0.38})
    a, b = FakeGpuArray((256, 512)), FakeGpuArray((384, 512)).T
    assert pl.matmul_plan(a, b).choice["impl"] == "cublas"
    monkeypatch.setattr(cublaslt, "status", lambda: (False, "nvmath-python is not installed"))
    mm.forget()
    assert pl.matmul_plan(a, b).choice["impl"] == "cutlass"


def test_bf16_goes_to_cublaslt_unless_a_tuned_kernel_won(tuned_db, monkeypatch):
    monkeypatch.setattr(cublaslt, "status", lambda: (True, "nvmath-python"))
    a, w = FakeGpuArray((256, 512), "bfloat16"), FakeGpuArray((384, 512), "bfloat16")
    plan = pl.matmul_plan(a, w.T)
    assert plan.choice["impl"] == "cublaslt"
    assert "no tuned kernel for 256x384x512 bf16 tn" in plan.choice["reason"]
    assert "cuBLASLt through nvmath-python" in plan.choice["reason"]
    record(gemm(256, 384, 512, "bf16"), 0.30, {"cublas": 0.398})
    mm.forget()
    assert pl.matmul_plan(a, w.T).choice["impl"] == "cutlass"
    monkeypatch.setattr(cublaslt, "status", lambda: (False, "nvmath-python is not installed"))
    mm.forget()
    plan = pl.matmul_plan(FakeGpuArray((64, 32), "bfloat16"), FakeGpuArray((32, 16), "bfloat16"))
    assert plan.choice["impl"] == "cublas" and "nvmath-python is not installed" in \
        plan.choice["reason"]


def test_unaligned_extents_reach_the_lower_alignment_kernels(tuned_db):
    """Extents that are multiples of 4 (not 8) are tuned with alignment-4 kernels; a
    winner among them serves pl.matmul. Odd extents fit no kernel and stay with the
    library, saying why."""
    record(gemm(1000, 4100, 4100), 0.30, {"cublas": 0.40})
    a, w = FakeGpuArray((1000, 4100)), FakeGpuArray((4100, 4100))
    plan = pl.matmul_plan(a, w.T)
    assert plan.choice["impl"] == "cutlass", plan.choice
    odd_a, odd_w = FakeGpuArray((7, 4099)), FakeGpuArray((4096, 4099))
    plan = pl.matmul_plan(odd_a, odd_w.T)
    assert plan.choice["impl"] == "cublas"
    assert "not a multiple of 8" in plan.choice["reason"], plan.choice


def test_a_batch_times_a_matrix_is_folded_into_one_tuned_problem(tuned_db, monkeypatch):
    monkeypatch.setattr(cublaslt, "status", lambda: (True, "nvmath-python"))
    record(gemm(4 * 64, 384, 512), 0.30, {"cublas": 0.398})
    a = FakeGpuArray((4, 64, 512))
    w = FakeGpuArray((384, 512))
    out = FakeGpuArray((4, 64, 384))
    plan = pl.matmul_plan(a, w.T, out=out)
    assert plan.choice["impl"] == "cutlass" and plan.choice["match"] == "exact (256x384x512)"
    plan(a, w.T)
    assert tuned_db.calls[-1][:3] == ((256, 512), (512, 384), (256, 384))
    # a batch times a batch is one strided-batched GEMM: cuBLASLt for 16-bit dtypes (CuPy
    # 14's batched matmul computes them in float32 copies), cuBLAS for float32
    plan = pl.matmul_plan(a, FakeGpuArray((4, 512, 384)))
    assert plan.choice["impl"] == "cublaslt" and "strided-batched" in plan.choice["reason"]
    plan = pl.matmul_plan(FakeGpuArray((4, 64, 512), "float32"),
                          FakeGpuArray((4, 512, 384), "float32"))
    assert plan.choice["impl"] == "cublas" and "batched" in plan.choice["reason"]


def test_layouts_reach_the_lookup(tuned_db, monkeypatch):
    seen = []

    def fake_winning(m, n, k, dtype, layout, epilogue=None):
        seen.append((m, n, k, dtype, layout, epilogue.name))
        return None, "no tuned kernel", {}

    monkeypatch.setattr(mm, "winning_kernel", fake_winning)
    x, w = FakeGpuArray((32, 16)), FakeGpuArray((64, 16))
    pl.matmul_plan(x, w.T)
    pl.matmul_plan(x.T.T, FakeGpuArray((16, 64)))
    pl.matmul_plan(FakeGpuArray((16, 32)).T, FakeGpuArray((16, 64)), tf32=False)
    pl.matmul_plan(FakeGpuArray((32, 16), "float32"), FakeGpuArray((16, 64), "float32"),
                   tf32=True, bias=FakeGpuArray((64,), "float32"), activation="gelu")
    assert seen == [(32, 64, 16, "f16", "tn", ""), (32, 64, 16, "f16", "tt", ""),
                    (32, 64, 16, "f16", "nt", ""), (32, 64, 16, "tf32", "tt", "bias_gelu")]
    plan = pl.matmul_plan(FakeGpuArray((32, 16), "float64"), FakeGpuArray((16, 64), "float64"))
    assert plan.choice["impl"] == "cublas" and "tuned kernels take one of" in \
        plan.choice["reason"]
    assert len(seen) == 4  # float64 never asks the database


def test_a_fused_epilogue_goes_to_cublaslt_when_nothing_tuned(tuned_db, monkeypatch):
    monkeypatch.setattr(cublaslt, "status", lambda: (True, "nvmath-python"))
    x, w = FakeGpuArray((32, 16)), FakeGpuArray((64, 16))
    bias = FakeGpuArray((64,))
    plan = pl.matmul_plan(x, w.T, bias=bias, activation="gelu")
    assert plan.choice["impl"] == "cublaslt"
    assert "cuBLASLt's epilogue (GELU_BIAS)" in plan.choice["reason"]
    plan = pl.matmul_plan(x, w.T, bias=bias, activation="silu")
    assert plan.choice["impl"] == "cublas" and "no silu epilogue" in plan.choice["reason"]


def test_a_repeated_call_takes_the_memoised_choice(tuned_db, monkeypatch):
    from pyc_lab.kernels import matmul_plan

    record(gemm(256, 384, 512), 0.30, {"cublas": 0.398})
    builds = []
    real = matmul_plan.build_launch
    monkeypatch.setattr(mm, "build_launch", lambda *a, **k: builds.append(1) or real(*a, **k))
    checks = []
    real_check = mm.check_inputs
    monkeypatch.setattr(mm, "check_inputs", lambda *a, **k: checks.append(1) or
                        real_check(*a, **k))
    a, w, out = FakeGpuArray((256, 512)), FakeGpuArray((384, 512)), FakeGpuArray((256, 384))
    for _ in range(3):
        assert pl.matmul(a, w.T, out=out) is out
    assert builds == [1] and checks == [1]
    assert mm.last_choice["impl"] == "cutlass" and len(tuned_db.calls) == 3
    # a tuning in this process is seen at once: the choice is made again
    # (a faster GPU clock: the kernel at 0.1 ms, but cuBLAS at 0.05 ms in that run)
    record(gemm(256, 384, 512), 0.10, {"cublas": 0.05}, run_id="run-2")
    import cupy

    monkeypatch.setattr(cupy, "matmul", lambda a, b, out=None: out)  # no GPU here
    monkeypatch.setattr(matmul_plan, "direct_for", lambda *a, **k: None)  # nor cuBLAS
    pl.matmul(a, w.T, out=out)
    assert len(builds) == 2 and mm.last_choice["impl"] == "cublas"
    assert "tuned kernel 0.100 ms lost to cuBLAS 0.050 ms" in mm.last_choice["reason"]


def test_last_choice_reads_like_the_dict_it_was():
    a = np.random.default_rng().uniform(-1, 1, (4, 3))
    pl.matmul(a, a.T)
    assert repr(mm.last_choice) == "{'impl': 'numpy', 'reason': 'NumPy arrays run on the CPU'}"
    assert dict(mm.last_choice) == {"impl": "numpy", "reason": "NumPy arrays run on the CPU"}
    assert mm.last_choice == {"impl": "numpy", "reason": "NumPy arrays run on the CPU"}


# -- the skinny GEMM's entries ------------------------------------------------------------

def record_skinny(problem: ProblemKey, tuned_ms: float, baselines: dict[str, float],
                  cfg: dict | None = None) -> None:
    from pyc_lab.kernels.skinny import SkinnyConfig

    cfg = cfg or SkinnyConfig(1, 8, 4).to_dict()
    with tuning_db.TuningDB() as db:
        db.record_many(DEVICE, problem, [
            Measurement(cfg, "ok", tuned_ms),
            *(Measurement({"baseline": name}, "baseline", ms) for name, ms in baselines.items())],
            run_id="skinny-run")


def test_a_winning_skinny_entry_serves_odd_n_that_no_cutlass_kernel_takes(tuned_db,
                                                                          monkeypatch):
    """N odd (a decode layer of 4099 outputs): no CUTLASS alignment fits, but the skinny
    GEMM reads whole 16-byte rows of w along K; its tuned win routes there, named so."""
    from pyc_lab.kernels.skinny import SkinnyConfig, SkinnyGemm

    monkeypatch.setattr(cublaslt, "status", lambda: (True, "nvmath-python"))
    monkeypatch.setattr(mm, "_load", tuning_load)
    record_skinny(gemm(7, 4099, 4096, "bf16"), 0.016, {"cublaslt": 0.058, "cublas": 0.060})
    a, w = FakeGpuArray((7, 4096), "bfloat16"), FakeGpuArray((4099, 4096), "bfloat16")
    plan = pl.matmul_plan(a, w.T)
    assert plan.choice["impl"] == "skinny", plan.choice
    assert plan.choice["config"] == SkinnyConfig(1, 8, 4).id
    assert "beat cuBLASLt 0.058 ms" in plan.choice["reason"]
    assert isinstance(mm._KERNELS[("skinny", SkinnyConfig(1, 8, 4), "bf16")], SkinnyGemm)


def tuning_load(found, dtype, layout, epi, why, shape):
    """matmul's own loader (the fixture replaces it with a fake CUTLASS kernel)."""
    from pyc_lab.kernels import matmul, matmul_tuned

    return matmul_tuned.load_tuned(found, dtype, layout, epi, why, shape, matmul._KERNELS,
                                   matmul._LOCK)


def test_a_losing_skinny_entry_routes_to_the_library(tuned_db, monkeypatch):
    monkeypatch.setattr(cublaslt, "status", lambda: (True, "nvmath-python"))
    monkeypatch.setattr(mm, "_load", tuning_load)
    record_skinny(gemm(8, 4096, 4096, "bf16"), 0.020, {"cublaslt": 0.017})
    plan = pl.matmul_plan(FakeGpuArray((8, 4096), "bfloat16"),
                          FakeGpuArray((4096, 4096), "bfloat16").T)
    assert plan.choice["impl"] == "cublaslt"
    assert "lost to cuBLASLt 0.017 ms" in plan.choice["reason"]


def test_a_skinny_entry_is_not_bucketed_onto_another_kernel_instantiation(tuned_db,
                                                                         monkeypatch):
    """Tuned at 8 rows (one token tile), it wins by far; at 6 rows (the same kernel) the
    bucket serves it, at 12 rows (two token tiles: another kernel, never timed) not."""
    monkeypatch.setattr(cublaslt, "status", lambda: (True, "nvmath-python"))
    monkeypatch.setattr(mm, "_load", tuning_load)
    record_skinny(gemm(8, 4096, 4096, "bf16"), 0.010, {"cublaslt": 0.017})
    w = FakeGpuArray((4096, 4096), "bfloat16")
    near = pl.matmul_plan(FakeGpuArray((6, 4096), "bfloat16"), w.T)
    assert near.choice["impl"] == "skinny" and near.choice["match"].startswith("bucket")
    other = pl.matmul_plan(FakeGpuArray((12, 4096), "bfloat16"), w.T)
    assert other.choice["impl"] == "cublaslt"
    assert "tuned for 8 rows, a different kernel than 12 rows need" in other.choice["reason"]


def test_a_skinny_entry_never_takes_what_it_cannot_compute(tuned_db, monkeypatch):
    monkeypatch.setattr(mm, "_load", tuning_load)
    record_skinny(gemm(8, 4096, 4096), 0.010, {"cublas": 0.017})
    # the same problem with a bias: the fused entry is another op, nothing tuned
    plan = pl.matmul_plan(FakeGpuArray((8, 4096)), FakeGpuArray((4096, 4096)).T,
                          bias=FakeGpuArray((4096,)))
    assert plan.choice["impl"] != "skinny"
    # b row-major (layout "tt"): another layout's entry, none tuned
    plan = pl.matmul_plan(FakeGpuArray((8, 4096)), FakeGpuArray((4096, 4096)))
    assert plan.choice["impl"] == "cublas"
    found = SimpleNamespace(measurement=Measurement({"kernel": "skinny", "rt": 1,
                                                     "warps": 8, "stages": 4}, "ok", 0.01),
                            match="exact", problem_matched=gemm(8, 4096, 4096))
    kernel, why = mm._load(found, "f16", "tn", cg.Epilogue(True, "relu"), "", (8, 4096, 4096))
    assert kernel is None and "plain 'tn' GEMMs only" in why
    kernel, why = mm._load(found, "f16", "tn", cg.Epilogue(), "", (8, 4096, 4100))
    assert kernel is None and "cannot take 8x4096x4100" in why


# -- tuned cuBLASLt picks ----------------------------------------------------------------

PICK = LtPick(0, tuple(range(1, 9)), 130100, 66, 20, 8, 1, 2)


def record_setting(problem: ProblemKey, tuned_ms: float, baselines: dict[str, float],
                   setting: LtPick) -> None:
    with tuning_db.TuningDB() as db:
        db.record_many(DEVICE, problem, [
            Measurement(setting.to_dict(), "ok", tuned_ms),
            *(Measurement({"baseline": name}, "baseline", ms) for name, ms in baselines.items())],
            run_id="lt-run")


def test_a_winning_cublaslt_pick_is_issued_directly_with_that_pick(tuned_db, monkeypatch):
    """A pick that beat both libraries in its tuning run runs as a direct cuBLASLt call
    carrying the pick (not raced again); one that lost routes to the library."""
    from pyc_lab.kernels import matmul_plan

    monkeypatch.setattr(cublaslt, "status", lambda: (True, "nvmath-python"))
    monkeypatch.setattr(mm, "_load", tuning_load)
    calls = []

    def fake_direct_for(a, b, out, impl, alpha, beta, result, race=False, **kw):
        calls.append((impl, race, kw.get("setting")))

    monkeypatch.setattr(matmul_plan, "direct_for", fake_direct_for)
    setting = PICK
    record_setting(gemm(64, 4096, 4096, "bf16"), 0.015, {"cublaslt": 0.0175, "cublas": 0.018},
                   setting)
    a, w = FakeGpuArray((64, 4096), "bfloat16"), FakeGpuArray((4096, 4096), "bfloat16")
    plan = pl.matmul_plan(a, w.T)
    assert plan.choice["impl"] == "cublaslt-tuned", plan.choice
    assert plan.choice["config"] == setting.id
    assert "beat cuBLASLt 0.018 ms" in plan.choice["reason"]
    assert calls[-1] == ("cublaslt", False, setting)
    assert isinstance(mm._KERNELS[("cublaslt", setting, "bf16")], TunedLt)
    # a pick that lost its run: the library, raced as usual
    record_setting(gemm(32, 4096, 4096, "bf16"), 0.0172, {"cublaslt": 0.0175}, setting)
    plan = pl.matmul_plan(FakeGpuArray((32, 4096), "bfloat16"), w.T)
    assert plan.choice["impl"] == "cublaslt"
    assert "within the spread between runs" in plan.choice["reason"]
    assert calls[-1] == ("cublaslt", True, None)


def test_a_cublaslt_pick_serves_only_the_shape_it_was_measured_on(tuned_db, monkeypatch):
    monkeypatch.setattr(cublaslt, "status", lambda: (True, "nvmath-python"))
    monkeypatch.setattr(mm, "_load", tuning_load)
    setting = PICK
    record_setting(gemm(64, 4096, 4096, "bf16"), 0.010, {"cublaslt": 0.0175}, setting)
    plan = pl.matmul_plan(FakeGpuArray((60, 4096), "bfloat16"),
                          FakeGpuArray((4096, 4096), "bfloat16").T)
    assert plan.choice["impl"] == "cublaslt"
    assert "was measured on 64x4096x4096, not this shape" in plan.choice["reason"]
    # nor a GEMM with an epilogue of the same shape (another op: nothing tuned for it)
    found = SimpleNamespace(measurement=Measurement(setting.to_dict(), "ok", 0.01),
                            match="exact", problem_matched=gemm(64, 4096, 4096, "bf16"))
    kernel, why = mm._load(found, "bf16", "tn", cg.Epilogue(True, "relu"), "", (64, 4096, 4096))
    assert kernel is None and "plain GEMMs only" in why
