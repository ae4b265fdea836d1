"""The convolution gradient kernels without a GPU: what a dgrad or wgrad kernel is, the
GEMM it runs, its refusals, its candidates (the Hopper family's and the CUTLASS 2 one's
with split-K), its sources, a search space over both families, and (with nvcc) that a
split-K wgrad kernel builds with the common ``extern "C"`` functions."""

from __future__ import annotations

import ctypes
import math

import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.kernels.cache import KernelCache
from pyc_lab.kernels.cutlass.conv import (
    ConvConfig,
    ConvGeometry,
    ConvKernel,
    _declare_conv,
    conv_configs,
    emit_conv_source,
)
from pyc_lab.kernels.cutlass.conv_2x import (
    Conv2xConfig,
    build_conv2x,
    conv2x_grad_configs,
    conv2x_widths,
    emit_conv2x_source,
)
from pyc_lab.kernels.tuning.kernel_rows import listed_space

#: ResNet-50's 64 -> 64 3x3 layer at batch 32 (forward geometry).
LAYER = ConvGeometry.from_channels_first((32, 64, 56, 56), (64, 64, 3, 3), (1, 1), (1, 1),
                                         (1, 1))
#: A stride-2 downsampling 1x1 layer.
DOWN = ConvGeometry.from_channels_first((32, 1024, 14, 14), (2048, 1024, 1, 1), (2, 2),
                                        (0, 0), (1, 1))


def test_a_gradient_kernel_is_named_and_refuses_an_epilogue():
    assert ConvKernel("bf16", 2, direction="dgrad").op == "conv2d_dgrad"
    assert ConvKernel("f16", 1, direction="wgrad").op == "conv1d_wgrad"
    assert ConvKernel("f16", 2, True, "relu").op == "conv2d_fprop_bias_relu"
    with pytest.raises(PycLabError, match="no bias, residual or activation"):
        ConvKernel("f16", 2, True, direction="wgrad")
    with pytest.raises(PycLabError, match="no bias, residual or activation"):
        ConvKernel("f16", 2, activation="relu", direction="dgrad")
    with pytest.raises(PycLabError, match="direction"):
        ConvKernel("f16", 2, direction="backward")
    assert ConvKernel(direction="wgrad").defines == {
        "PYC_OP": "cutlass::conv::Operator::kWgrad", "PYC_OP_ID": 2}


def test_each_direction_has_its_operands_and_gemm():
    act, flt, out = LAYER.act, LAYER.flt, LAYER.out_shape
    assert ConvKernel(direction="fprop").operands(LAYER) == (act, flt, out)
    assert ConvKernel(direction="dgrad").operands(LAYER) == (out, flt, act)
    assert ConvKernel(direction="wgrad").operands(LAYER) == (out, act, flt)
    assert LAYER.gemm_of("fprop") == LAYER.gemm == (32 * 56 * 56, 64, 64 * 9)
    assert LAYER.gemm_of("dgrad") == (32 * 56 * 56, 64, 64 * 9)  # input pixels x C
    assert LAYER.gemm_of("wgrad") == (64, 64 * 9, 32 * 56 * 56)  # the filter, long K
    assert DOWN.gemm_of("dgrad") == (32 * 14 * 14, 1024, 2048)
    assert DOWN.gemm_of("wgrad") == (2048, 1024, 32 * 7 * 7)
    for d in ("fprop", "dgrad", "wgrad"):  # the same work each way at unit stride
        assert math.prod(LAYER.gemm_of(d)) == math.prod(LAYER.gemm)


def test_the_hopper_dgrad_takes_unit_strides_only():
    dgrad = ConvKernel("bf16", 2, direction="dgrad")
    assert LAYER.issue(dgrad) == ""
    assert "unit strides" in DOWN.issue(dgrad)
    assert DOWN.issue(ConvKernel("bf16", 2, direction="wgrad")) == ""
    assert DOWN.issue(ConvKernel("bf16", 2)) == ""


def test_sources_carry_the_direction():
    hopper = emit_conv_source(ConvConfig(), ConvKernel("f16", 2, direction="wgrad"))
    assert "#define PYC_OP cutlass::conv::Operator::kWgrad\n" in hopper
    assert "#define PYC_OP_ID 2\n" in hopper and "conv2d_wgrad" in hopper.splitlines()[0]
    cfg = Conv2xConfig((128, 64, 32), (64, 32, 32), 3, "optimized", 0, 8)
    ampere = emit_conv2x_source(cfg, ConvKernel("bf16", 2, direction="wgrad"), 8, 8)
    assert "#define PYC_SPLIT_K 8\n" in ampere and "#define PYC_OP_ID 2\n" in ampere
    fwd = emit_conv2x_source(Conv2xConfig(), ConvKernel("bf16", 2), 8, 8)
    assert "#define PYC_SPLIT_K 1\n" in fwd and "#define PYC_OP_ID 0\n" in fwd
    assert fwd != emit_conv2x_source(Conv2xConfig(), ConvKernel("bf16", 2, direction="dgrad"),
                                     8, 8)


def test_split_k_is_a_wgrad_configuration_field():
    cfg = Conv2xConfig((128, 64, 32), (64, 32, 32), 3, "optimized", 0, 8)
    assert cfg.id.endswith("_optimized_k8") and Conv2xConfig().id.endswith("_optimized")
    assert Conv2xConfig.from_dict(cfg.to_dict()) == cfg
    assert Conv2xConfig.from_dict({k: v for k, v in Conv2xConfig().to_dict().items()
                                   if k != "split_k"}) == Conv2xConfig()  # older entries
    with pytest.raises(PycLabError):
        Conv2xConfig.from_dict({**cfg.to_dict(), "split_k": 0})
    wgrad, dgrad = ConvKernel("f16", 2, direction="wgrad"), ConvKernel("f16", 2, direction="dgrad")
    assert cfg.issue(wgrad, 64, 8, 64, 8) == ""
    assert "wgrad" in cfg.issue(dgrad, 64, 8, 64, 8)
    assert "wgrad" in cfg.issue(ConvKernel("f16", 2), 64)
    assert "forward one" in Conv2xConfig(iterator="few_channels").issue(dgrad, 8, 8, 8, 8)
    assert "forward matter" in Conv2xConfig(pad_to=4).issue(wgrad, 3, 1, 64, 1)
    # a gradient's operands have C and K channels; its result C
    assert "align 8" in Conv2xConfig().issue(dgrad, 64, 8, 36, 8)
    assert "align_out 8" in Conv2xConfig().issue(dgrad, 36, 4, 64, 8)
    assert conv2x_widths(Conv2xConfig(), dgrad, 36, 64) == (4, 4)
    assert conv2x_widths(Conv2xConfig(), wgrad, 64, 24) == (8, 8)


def test_wgrad_candidates_split_a_long_reduction_to_about_a_wave():
    wgrad = ConvKernel("bf16", 2, direction="wgrad")
    configs = conv2x_grad_configs(wgrad, LAYER, 132)
    assert configs and all(c.iterator == "optimized" and not c.pad_to for c in configs)
    m, n, depth = LAYER.gemm_of("wgrad")
    for c in configs:
        assert c.split_k & (c.split_k - 1) == 0 and 1 < c.split_k <= 32  # 4 tiles: split
        ctas = -(-m // c.tile[0]) * -(-n // c.tile[1])
        assert ctas * c.split_k <= 2 * 132 and depth // c.split_k >= 16 * c.tile[2]
        assert c.issue(wgrad, 64, 8, 64, 8) == ""
    first = configs[0]
    assert first.tile[0] <= 64  # a 64-row filter is not padded to a 128-row tile first
    # a filter with tiles for a whole wave is not split
    big = ConvGeometry.from_channels_first((32, 512, 14, 14), (2048, 512, 3, 3), (1, 1),
                                           (1, 1), (1, 1))
    assert any(c.split_k == 1 for c in conv2x_grad_configs(wgrad, big, 132))


def test_dgrad_candidates_take_any_stride_without_split():
    dgrad = ConvKernel("f16", 2, direction="dgrad")
    configs = conv2x_grad_configs(dgrad, DOWN, 132)
    assert configs and all(c.split_k == 1 and c.iterator == "optimized" for c in configs)
    assert conv_configs(LAYER, dgrad)  # unit stride: the Hopper kernels too
    odd = ConvGeometry.from_channels_first((4, 36, 9, 9), (20, 36, 3, 3), (1, 1), (1, 1),
                                           (1, 1))
    assert all(conv2x_widths(c, dgrad, 36, 20) == (4, 4)
               for c in conv2x_grad_configs(dgrad, odd, 132))


def test_a_space_of_both_families_lists_exactly_their_configurations():
    wgrad = ConvKernel("bf16", 2, direction="wgrad")
    mixed = [*conv_configs(LAYER, wgrad)[:2], *conv2x_grad_configs(wgrad, LAYER)[:2]]
    space = listed_space(mixed)
    assert {"tile", "cluster", "warp", "split_k"} <= set(space.params)
    dicts = [{**{n: None for n in space.params}, **c.to_dict()} for c in mixed]
    assert all(space.is_valid(d) for d in dicts) and len(space) == len(mixed)
    crossed = {**dicts[0], "warp": dicts[2]["warp"]}  # a Hopper tile with a warp tile
    assert not space.is_valid(crossed)
    from pyc_lab.kernels.tuning.conv_runner import _AnyConfig

    assert [_AnyConfig.from_dict(c) for c in space] and \
        sorted(_AnyConfig.from_dict(c).id for c in space) == sorted(c.id for c in mixed)


@pytest.mark.nvcc
def test_a_split_k_wgrad_kernel_builds_with_the_common_functions(tmp_path):
    kernel = ConvKernel("f16", 2, direction="wgrad")
    cfg = Conv2xConfig((128, 64, 32), (64, 32, 32), 3, "optimized", 0, 4)
    res = build_conv2x(cfg, kernel, 8, cc=90, cache=KernelCache(tmp_path), align_out=8)
    assert res.ok and res.status == "built", res.message
    lib = ctypes.CDLL(str(res.library))
    _declare_conv(lib)
    assert lib.pyc_conv_op() == 2 and lib.pyc_conv_has_bias() == 0
    g = ConvGeometry.from_channels_first((4, 32, 15, 15), (32, 32, 3, 3), (2, 2), (1, 1),
                                         (1, 1))
    assert lib.pyc_conv_can_implement(*g.arrays()) == 0
    assert lib.pyc_conv_workspace_size(*g.arrays(), 132) > 0  # the split's semaphores
    odd = ConvGeometry.from_channels_first((4, 36, 15, 15), (32, 36, 3, 3), (2, 2), (1, 1),
                                           (1, 1))
    assert lib.pyc_conv_can_implement(*odd.arrays()) != 0  # C not a multiple of 8
