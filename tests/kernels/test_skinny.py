"""The skinny GEMM without a GPU: its configurations, what it takes, its launch geometry,
the fragment layout its loads produce (emulated in NumPy), its source under nvcc, and
how a tuned skinny entry is routed and named."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.kernels import skinny as sk
from pyc_lab.kernels.tuning.keys import Measurement
from pyc_lab.kernels.tuning.result import config_name, is_tuned_winner, kernel_family
from pyc_lab.paths import native_source


def test_a_configuration_round_trips_through_the_database_form():
    cfg = sk.SkinnyConfig(2, 8, 4, 2)
    d = cfg.to_dict()
    assert d == {"kernel": "skinny", "rt": 2, "warps": 8, "stages": 4, "splits": 2}
    assert sk.is_skinny(d) and not sk.is_skinny({"tile": [128, 128, 64]})
    assert sk.SkinnyConfig.from_dict(d) == cfg
    assert cfg.id == "skinny_rt2_w8_st4_s2" == config_name(d)
    assert kernel_family(d) == "skinny" and kernel_family({"tile": [1]}) == "cutlass"
    assert Measurement(d, "ok", 0.01).config_id  # storable as any configuration
    with pytest.raises(PycLabError, match="not a skinny GEMM configuration"):
        sk.SkinnyConfig.from_dict({"tile": [128, 128, 64]})
    with pytest.raises(PycLabError, match="incomplete"):
        sk.SkinnyConfig.from_dict({"kernel": "skinny", "rt": 2})
    assert is_tuned_winner("skinny:" + cfg.id) and is_tuned_winner("cutlass:x")
    assert not is_tuned_winner("cublas")


@pytest.mark.parametrize(("m", "n", "k", "dtype", "layout", "why"), [
    (1, 4096, 4096, "f16", "tn", ""),
    (64, 4099, 4096, "bf16", "tn", ""),
    (65, 4096, 4096, "f16", "tn", "1 to 64 rows"),
    (8, 4096, 4100, "f16", "tn", "multiple of 8"),
    (8, 4096, 4096, "f32", "tn", "f16 and bf16"),
    (8, 4096, 4096, "f16", "nn", "layout 'tn'"),
])
def test_what_the_skinny_gemm_takes(m, n, k, dtype, layout, why):
    got = sk.skinny_issue(m, n, k, dtype, layout)
    assert (got == "") if not why else (why in got), got


@pytest.mark.parametrize("m", [1, 7, 8, 9, 16, 17, 32, 33, 64])
def test_every_candidate_fits_the_hardware_limits(m):
    cands = sk.candidates(m, 4096, 8192)
    assert cands, m
    nt = sk.nt_for(m)
    assert nt * 8 >= m and (nt == 1 or nt * 4 < m)
    for cfg in cands:
        assert not cfg.issue(m)
        assert cfg.warps in (1, 2, 4, 8, 16, 32)
        if cfg.form == "warp":
            assert sk.smem_bytes(cfg.rt, nt, cfg.warps, cfg.stages) <= sk.SMEM_LIMIT
            assert cfg.rt * nt <= 32
        else:  # the GEMV form: registers only
            assert m <= sk.GEMV_MAX_M and cfg.smem(m) == 0 and cfg.splits == 1
            assert cfg.rt * cfg.stages <= 16 and cfg.rt * sk.mt_for(m) <= 32
    assert any(c.form == "gemv" for c in cands) == (m <= sk.GEMV_MAX_M)
    # splits only where each split keeps a long k range
    assert all(c.splits == 1 for c in sk.candidates(m, 4096, 2048))


def test_a_gemv_configuration_round_trips_and_launches_one_block_per_rows():
    cfg = sk.SkinnyConfig(2, 8, 4, 1, "gemv")
    d = cfg.to_dict()
    assert d == {"kernel": "skinny", "rt": 2, "warps": 8, "stages": 4, "splits": 1,
                 "form": "gemv"}
    assert sk.SkinnyConfig.from_dict(d) == cfg
    assert cfg.id == "skinny_v_rt2_w8_st4" == config_name(d)
    assert "form" not in sk.SkinnyConfig(2, 8, 4).to_dict()  # stored as it always was
    with pytest.raises(PycLabError, match="form 'tiles' is not one of"):
        sk.SkinnyConfig.from_dict({**d, "form": "tiles"})
    assert [sk.mt_for(m) for m in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    assert cfg.expression("bf16", 3) == "pyc_skinny_gemv<1,4,2,4>"
    assert sk.SkinnyConfig(2, 8, 4).expression("f16", 3) == "pyc_skinny_gemm<0,1,2,8,4>"
    geo = sk.geometry(cfg, 3, 5121, 4096)  # 16 rows a block, the last partly
    assert (geo.tiles, geo.splits, geo.work_floats, geo.smem) == (321, 1, 0, 0)
    assert 321 * 16 >= 5121 > 320 * 16


def test_impossible_configurations_say_why():
    assert "GEMV form takes 1 to 8 rows" in sk.SkinnyConfig(1, 8, 4, 1, "gemv").issue(9)
    assert "no splits" in sk.SkinnyConfig(1, 8, 4, 2, "gemv").issue(1)
    assert "64 registers" in sk.SkinnyConfig(4, 8, 8, 1, "gemv").issue(1)
    assert "32 accumulators" in sk.SkinnyConfig(8, 8, 2, 1, "gemv").issue(8)
    assert "not one of" in sk.SkinnyConfig(1, 8, 4, 1, "tiles").issue(1)
    assert "power of two" in sk.SkinnyConfig(1, 6, 4).issue(1)
    assert "accumulators" in sk.SkinnyConfig(8, 4, 3).issue(64)
    assert "shared memory" in sk.SkinnyConfig(8, 32, 8).issue(8)


@pytest.mark.parametrize(("k", "splits"), [(8, 1), (64, 2), (4096, 1), (4104, 3),
                                           (28672, 2), (200, 8)])
def test_the_split_ranges_cover_k_once_and_none_is_empty(k, splits):
    cfg = sk.SkinnyConfig(2, 8, 4, splits)
    geo = sk.geometry(cfg, 5, 4099, k)
    assert geo.k_per_split % 64 == 0
    starts = [s * geo.k_per_split for s in range(geo.splits)]
    assert all(start < k for start in starts)  # no split without work
    assert starts[-1] + geo.k_per_split >= k  # the last one reaches the end
    assert geo.splits <= splits
    assert geo.tiles * 16 * cfg.rt >= 4099 > (geo.tiles - 1) * 16 * cfg.rt
    assert geo.work_floats == (geo.tiles * geo.splits * cfg.rt * geo.nt * 4 * 32
                               if geo.splits > 1 else 0)


def _words(pieces: list[np.ndarray]) -> list[np.ndarray]:
    """The 32-bit words of a lane's 16-byte pieces, as the kernel's ``word()`` reads
    them: word i holds elements 2i and 2i + 1 of the pieces laid end to end."""
    flat = np.concatenate(pieces)
    return [flat[2 * i:2 * i + 2] for i in range(len(flat) // 2)]


def test_the_loaded_words_are_the_mma_fragments_of_a_permuted_k():
    """Emulate one warp and one 64-wide chunk: what each lane copies (row g and g + 8 of
    w, row g of a, 8 elements at tig * 8 and tig * 8 + 32), the registers handed to
    mma.m16n8k16 per k16 step, the PTX fragment layouts, and the accumulator-to-output
    mapping; the result must be w @ a.T exactly as the kernel stores it."""
    rng = np.random.default_rng()
    w = rng.integers(-8, 8, (16, 64)).astype(np.float64)  # exact in any order
    x = rng.integers(-8, 8, (8, 64)).astype(np.float64)
    d = np.zeros((16, 8))
    regs = {}
    for lane in range(32):
        g, tig = lane // 4, lane % 4
        wq = [[w[g + 8 * h, tig * 8 + q * 32:tig * 8 + q * 32 + 8] for q in (0, 1)]
              for h in (0, 1)]
        aq = [x[g, tig * 8 + q * 32:tig * 8 + q * 32 + 8] for q in (0, 1)]
        regs[lane] = (_words(wq[0]), _words(wq[1]), _words(aq))
    for s in range(4):
        a_frag, b_frag = np.full((16, 16), np.nan), np.full((16, 8), np.nan)
        for lane, (w_lo, w_hi, a_w) in regs.items():
            g, tig = lane // 4, lane % 4
            c = 2 * tig
            a_frag[g, c:c + 2] = w_lo[2 * s]            # a0, a1
            a_frag[g + 8, c:c + 2] = w_hi[2 * s]        # a2, a3
            a_frag[g, c + 8:c + 10] = w_lo[2 * s + 1]   # a4, a5
            a_frag[g + 8, c + 8:c + 10] = w_hi[2 * s + 1]  # a6, a7
            b_frag[c:c + 2, g] = a_w[2 * s]             # b0, b1
            b_frag[c + 8:c + 10, g] = a_w[2 * s + 1]    # b2, b3
        assert not np.isnan(a_frag).any() and not np.isnan(b_frag).any()
        d += a_frag @ b_frag
    out = np.full((8, 16), np.nan)  # out[m, n], as the kernel's epilogue writes it
    for lane in range(32):
        g, tig = lane // 4, lane % 4
        for i in range(4):
            row, col = g + (i >> 1) * 8, 2 * tig + (i & 1)  # the D fragment
            n, m = g + (i >> 1) * 8, tig * 2 + (i & 1)      # the kernel's store
            assert (row, col) == (n, m)
            out[m, n] = d[row, col]
    np.testing.assert_array_equal(out, x @ w.T)


@pytest.mark.nvcc
def test_the_source_builds_for_hopper_without_spills(tmp_path):
    from pyc_lab.kernels.cutlass.nvcc import nvcc_path

    src = tmp_path / "skinny.cu"
    inst = ("template __global__ void pyc_skinny_gemm<{},{},{},{},{}>(const unsigned short*, "
            "long long, const unsigned short*, long long, unsigned short*, long long, float, "
            "float, int, int, int, int, float*, int*);")
    shapes = [(0, 1, 1, 8, 4), (1, 2, 2, 4, 6), (1, 8, 2, 4, 4), (0, 4, 4, 8, 2)]
    gemv = ("template __global__ void {}(const unsigned short*, long long, const unsigned "
            "short*, long long, unsigned short*, long long, float, float, int, int, int);")
    exprs = sorted({cfg.expression(dt, m) for m in (1, 2, 4, 8) for dt in ("f16", "bf16")
                    for cfg in sk.candidates(m, 4096, 4096) if cfg.form == "gemv"})
    src.write_text(native_source("skinny_gemm.cuh") + "\n"
                   + "\n".join(inst.format(*s) for s in shapes) + "\n"
                   + "\n".join(gemv.format(e) for e in exprs) + "\n")
    res = subprocess.run([str(nvcc_path()), "-arch=sm_90", "-ptx", "-o",
                          str(tmp_path / "s.ptx"), str(src)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    ptx = (tmp_path / "s.ptx").read_text()
    assert "cp.async.cg.shared.global.L2::256B" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    res = subprocess.run([str(nvcc_path()), "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o",
                          str(tmp_path / "s.cubin"), str(src)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", res.stderr)
    assert len(frames) == len(shapes) + len(exprs), res.stderr
    assert all(f == ("0", "0") for f in frames), res.stderr
    assert "ld.global.nc.L1::no_allocate.L2::256B.v4.u32" in ptx


def test_skinny_gemm_refuses_what_it_cannot_run():
    with pytest.raises(PycLabError, match="dtype"):
        sk.SkinnyGemm(sk.SkinnyConfig(1, 8, 4), "f32")
    gemm = sk.SkinnyGemm(sk.SkinnyConfig(1, 8, 4), "bf16")
    assert gemm.can_implement(8, 4099, 4096) and not gemm.can_implement(65, 4096, 4096)
    assert not gemm.can_implement(8, 4096, 4100)
    assert repr(gemm) == "SkinnyGemm(skinny_rt1_w8_st4_s1, bf16)"
    with pytest.raises(PycLabError, match="call the kernel once first"):
        gemm.launch()
