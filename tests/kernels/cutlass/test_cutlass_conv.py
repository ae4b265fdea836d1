"""pyc_lab's CUTLASS 3 convolutions without a GPU: configurations, geometry, sources,
tuning keys, and (with nvcc) that the source builds Hopper code: TMA im2col loads and
warpgroup MMAs."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.kernels.conv_cutlass import conv_config_of, conv_problem_key
from pyc_lab.kernels.conv_im2col import out_size
from pyc_lab.kernels.cutlass.conv import (
    ConvConfig,
    ConvGeometry,
    ConvKernel,
    build_conv,
    conv_configs,
    emit_conv_source,
)
from pyc_lab.kernels.tuning.conv_tune import conv_geometry_of


def test_config_ids_and_dicts_round_trip():
    cfg = ConvConfig((64, 256, 64), (2, 1))
    assert cfg.id == "conv_t64x256x64_c2x1"
    assert ConvConfig.from_dict(cfg.to_dict()) == cfg
    for bad in ({}, {"tile": "64x64", "cluster": "1x1"}, {"tile": "a", "cluster": "1x1"}):
        with pytest.raises(PycLabError, match="not a convolution configuration"):
            ConvConfig.from_dict(bad)


def test_a_database_entry_names_its_family():
    from pyc_lab.kernels.cutlass.conv_2x import Conv2xConfig

    hopper = ConvConfig((128, 64, 64), (2, 1))
    ampere = Conv2xConfig((128, 64, 32), (64, 32, 32), 3, "fixed_channels", pad_to=4)
    assert conv_config_of(hopper.to_dict()) == hopper
    assert conv_config_of(ampere.to_dict()) == ampere
    with pytest.raises(PycLabError, match="not a convolution configuration"):
        conv_config_of({"tile": "128x64x64"})
    with pytest.raises(PycLabError, match="not a CUTLASS 2 convolution configuration"):
        conv_config_of({"tile": "128x64x32", "warp": "64x32x32"})


def test_kernel_ops_and_bad_kernels():
    assert ConvKernel("f16", 2).op == "conv2d_fprop"
    assert ConvKernel("bf16", 1, True).op == "conv1d_fprop_bias"
    assert ConvKernel("tf32", 3, True, "relu").op == "conv3d_fprop_bias_relu"
    assert ConvKernel("f16", 2, False, "silu").op == "conv2d_fprop_silu"
    assert ConvKernel("tf32").align == 4 and ConvKernel("bf16").align == 8
    with pytest.raises(PycLabError, match="take"):
        ConvKernel("f64")
    with pytest.raises(PycLabError, match="spatial"):
        ConvKernel("f16", 4)
    with pytest.raises(PycLabError, match="activation"):
        ConvKernel("f16", 2, False, "tanh")


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_geometry_matches_the_convolution_arithmetic(nd):
    rng = np.random.default_rng()
    n, c, k = (int(v) for v in rng.integers(1, 9, 3))
    spatial = tuple(int(v) for v in rng.integers(5, 30, nd))
    kernel = tuple(int(v) for v in rng.integers(1, 4, nd))
    stride = tuple(int(v) for v in rng.integers(1, 3, nd))
    pads = tuple(int(v) for v in rng.integers(0, 3, nd))
    dil = tuple(int(v) for v in rng.integers(1, 3, nd))
    g = ConvGeometry.from_channels_first((n, c, *spatial), (k, c, *kernel), stride, pads, dil)
    assert g.act == (n, *spatial, c) and g.flt == (k, *kernel, c)
    out = tuple(out_size(s + 2 * p, r, st, d)
                for s, r, st, d, p in zip(spatial, kernel, stride, dil, pads, strict=True))
    assert g.out == out and g.out_shape == (n, *out, k)
    assert g.gemm == (n * int(np.prod(out)), k, c * int(np.prod(kernel)))
    assert g.flops == 2 * g.gemm[0] * g.gemm[1] * g.gemm[2]
    assert g.spatial == nd
    assert [len(a) for a in g.arrays()] == [nd + 2, nd + 2, nd, nd, nd]


def test_geometry_says_what_a_kernel_cannot_take():
    g = ConvGeometry.from_channels_first((2, 12, 9, 9), (16, 12, 3, 3), (1, 1), (1, 1), (1, 1))
    assert "multiples of 8" in g.issue(ConvKernel("f16", 2))
    assert g.issue(ConvKernel("tf32", 2)) == ""  # 12 and 16 are multiples of 4
    assert "spatial" in g.issue(ConvKernel("tf32", 1))
    ok = ConvGeometry.from_channels_first((2, 16, 9, 9), (24, 16, 3, 3), (1, 1), (1, 1),
                                          (1, 1))
    assert ok.issue(ConvKernel("bf16", 2)) == ""
    assert ok.layout == "nhwc r3x3 s1x1 p1x1 d1x1"


def test_geometry_of_pl_conv_shapes_and_layouts():
    first = conv_geometry_of((8, 64, 56, 56), (64, 64, 3, 3), padding=1)
    last = conv_geometry_of((8, 56, 56, 64), (64, 64, 3, 3), padding="same",
                            layout="channels_last")
    assert first == last and first.gemm == (8 * 56 * 56, 64, 576)
    with pytest.raises(PycLabError, match="do not fit"):  # grouped weights: not tuned
        conv_geometry_of((8, 64, 56, 56), (64, 32, 3, 3), padding=1)
    with pytest.raises(PycLabError):
        conv_geometry_of((8, 64, 5, 5), (64, 64, 7, 7))  # the window does not fit


def test_problem_keys_name_the_op_window_and_implicit_gemm():
    g = conv_geometry_of((128, 256, 14, 14), (256, 256, 3, 3), padding=1)
    key = conv_problem_key(g, ConvKernel("bf16", 2, True, "relu"))
    assert key.op == "conv2d_fprop_bias_relu" and key.dtype_a == "bf16"
    assert key.layout == "nhwc r3x3 s1x1 p1x1 d1x1"
    assert (key.m, key.n, key.k) == (128 * 14 * 14, 256, 2304)


@pytest.mark.parametrize(("k_out", "widest"), [(64, 64), (96, 128), (256, 256), (2048, 256)])
def test_configurations_fit_the_problem(k_out, widest):
    g = conv_geometry_of((32, 64, 28, 28), (k_out, 64, 3, 3), padding=1)
    for dtype, k_tile in (("f16", 64), ("tf32", 32)):
        cfgs = conv_configs(g, ConvKernel(dtype, 2), sm_count=132)
        assert cfgs and len(set(cfgs)) == len(cfgs)
        m_tiles = {c.tile[0] for c in cfgs}
        assert max(c.tile[1] for c in cfgs) == widest and m_tiles <= {64, 128}
        assert all(c.tile[2] == k_tile for c in cfgs)  # a 128-byte K step
        for c in cfgs:  # a cluster divides the CTA grid
            assert -(-g.gemm[0] // c.tile[0]) % c.cluster[0] == 0
            assert -(-g.gemm[1] // c.tile[1]) % c.cluster[1] == 0


def test_a_small_problem_ranks_small_tiles_first():
    g = conv_geometry_of((1, 64, 14, 14), (64, 64, 3, 3), padding=1)  # 196 x 64
    assert conv_configs(g, ConvKernel("f16", 2))[0].tile[:2] == (64, 64)


def test_the_source_is_the_native_text_under_its_defines():
    cfg = ConvConfig((64, 128, 64), (1, 2))
    src = emit_conv_source(cfg, ConvKernel("bf16", 1, True, "gelu"))
    for line in ("#define PYC_ELEMENT cutlass::bfloat16_t", "#define PYC_SPATIAL 1",
                 "#define PYC_TILE_M 64", "#define PYC_TILE_N 128", "#define PYC_CLUSTER_N 2",
                 "#define PYC_BIAS 1", "#define PYC_ACT cutlass::epilogue::thread::GELU_taylor",
                 "KernelImplicitTmaWarpSpecializedSm90", 'extern "C"'):
        assert line in src
    plain = emit_conv_source(cfg, ConvKernel("f16", 2))
    assert "#define PYC_ACT cutlass::epilogue::thread::Identity" in plain
    assert emit_conv_source(cfg, ConvKernel("f16", 2)) == plain  # deterministic


def test_a_build_for_an_older_gpu_is_a_result_not_a_raise(tmp_path):
    from pyc_lab.kernels.cache import KernelCache

    res = build_conv(ConvConfig(), ConvKernel(), cc=80, cache=KernelCache(tmp_path))
    assert res.status == "compile_error" and not res.ok and "Hopper" in res.message


@pytest.mark.nvcc
def test_the_source_compiles_to_tma_im2col_and_warpgroup_mma(tmp_path):
    """The device code of one kernel (bf16, bias + ReLU): TMA's im2col mode loads the
    activations, wgmma does the products, and nvcc accepts the wrapper."""
    from pyc_lab.kernels.cutlass.nvcc import NVCC_FLAGS, _include_dirs, nvcc_path

    src = tmp_path / "conv.cu"
    src.write_text(emit_conv_source(ConvConfig((128, 128, 64), (1, 1)),
                                    ConvKernel("bf16", 2, True, "relu")))
    flags = [f for f in NVCC_FLAGS if f not in ("-shared", "-Xcompiler", "-fPIC")]
    res = subprocess.run([nvcc_path(), *flags, "-arch=sm_90a", "-ptx",
                          *(f"-I{d}" for d in _include_dirs()), str(src), "-o",
                          str(tmp_path / "conv.ptx")], capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    ptx = (tmp_path / "conv.ptx").read_text()
    assert "im2col" in ptx and "cp.async.bulk.tensor" in ptx
    assert "wgmma.mma_async" in ptx and ".bf16.bf16" in ptx
