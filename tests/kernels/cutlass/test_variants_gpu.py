"""The wider space's kernels on a GPU: swapped narrow tiles (GEMV-like M), split-K,
Stream-K, raster/swizzle and alignment-2 kernels against float64 on fresh random data
(never zeros) into NaN-poisoned outputs, launched twice (Stream-K's workspace reset),
in f16 and bf16.

``python tests/kernels/cutlass/test_variants_gpu.py DIR`` builds them into ``DIR``
without a GPU (as ``test_cutlass_gemm_gpu.py`` does), for ``$PYC_LAB_TEST_KERNEL_CACHE``.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import os
import sys

import numpy as np
import pytest

from pyc_lab.kernels import cutlass as cg
from pyc_lab.kernels.cache import KernelCache
from pyc_lab.kernels.tuning.gemm_reference import TOLERANCE, as_float32, gemm_inputs

cp = pytest.importorskip("cupy")
pytest.importorskip("cutlass_library")
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

_COOP, _PP, _NOSMEM = ("TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong",
                       "NoSmemWarpSpecialized")
#: (name, config, dtype, (m, n, k)): one kernel of each new kind and the problem it runs.
CASES = [
    ("swap-narrow-pingpong", cg.GemmConfig((64, 16, 128), (1, 1, 1), _PP, _NOSMEM, "Default",
                                           swap=True), "f16", (1, 4096, 1024)),
    ("swap-narrow-coop", cg.GemmConfig((128, 32, 128), (1, 1, 1), _COOP, _NOSMEM, "Default",
                                       swap=True), "bf16", (24, 1000, 2048)),
    ("swap-split-k", cg.GemmConfig((128, 16, 128), (1, 1, 1), _COOP, _NOSMEM, "StreamK",
                                   splits=4, decomposition="SplitK", swap=True),
     "f16", (8, 2048, 4096)),
    ("split-k", cg.GemmConfig((128, 128, 64), (1, 1, 1), _COOP, _NOSMEM, "StreamK",
                              splits=4, decomposition="SplitK"), "bf16", (256, 512, 4096)),
    ("stream-k", cg.GemmConfig((128, 128, 64), (1, 1, 1), _COOP, _NOSMEM, "StreamK",
                               decomposition="StreamK"), "f16", (384, 640, 3072)),
    ("raster-swizzle", cg.GemmConfig((256, 256, 64), (2, 1, 1), _COOP, _COOP, "Default",
                                     raster="AlongM", swizzle=4), "f16", (1024, 1536, 512)),
    ("align2", cg.GemmConfig((128, 128, 64), (1, 1, 1), "CpAsyncWarpSpecialized", _NOSMEM,
                             "Default", alignment=2), "f16", (1000, 1002, 998)),
    ("align4-bf16", cg.GemmConfig((128, 128, 64), (1, 1, 1), "CpAsyncWarpSpecialized",
                                  _NOSMEM, "Default", alignment=4), "bf16", (300, 1004, 996)),
]


def _build_all(cache: KernelCache) -> dict:
    with cf.ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 2))) as pool:
        futures = {name: pool.submit(cg.build, cfg, dtype, "tn", 90, cache)
                   for name, cfg, dtype, _shape in CASES}
        return {name: fut.result() for name, fut in futures.items()}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return _build_all(KernelCache(os.environ.get("PYC_LAB_TEST_KERNEL_CACHE")
                                  or tmp_path_factory.mktemp("variant-kernels")))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_variant_kernel_matches_float64_twice(built, case):
    name, cfg, dtype, (m, n, k) = case
    res = built[name]
    assert res.ok, res.message
    gemm = cg.CutlassGemm(res.library, cfg, dtype, "tn")
    assert gemm.can_implement(m, n, k)
    seed = int(np.random.default_rng().integers(1_000_000))
    a, b, out = gemm_inputs(m, n, k, dtype, "tn", seed=seed)  # out poisoned with NaN
    want = cp.asnumpy(as_float32(a, dtype)).astype(np.float64) @ \
        cp.asnumpy(as_float32(b, dtype)).astype(np.float64)
    for _ in range(2):  # a second launch: Stream-K/split-K workspaces must be reset
        out.view(cp.uint16).fill(0x7FFF)
        gemm(a, b, out)
        cp.cuda.Device().synchronize()
        got = cp.asnumpy(as_float32(out, dtype)).astype(np.float64)
        assert np.isfinite(got).all()
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert err < TOLERANCE[dtype], f"{name}: max rel error {err}"


def test_the_swapped_kernel_refuses_a_bias():
    cfg = dataclasses.replace(CASES[0][1])
    with pytest.raises(Exception, match="per-column bias"):
        cg.emit_source(cfg, epilogue=cg.Epilogue(bias=True))


if __name__ == "__main__":
    for key, result in _build_all(KernelCache(sys.argv[1])).items():
        print(result.status, key, result.config.id, result.message[:300], flush=True)
