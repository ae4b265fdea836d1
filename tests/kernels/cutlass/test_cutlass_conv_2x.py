"""pyc_lab's CUTLASS 2 (Ampere-class) convolutions without a GPU: configurations, their
refusals, candidate lists, sources, and (with nvcc) that a stem kernel for three input
channels builds into a library with the Hopper kernels' ``extern "C"`` functions, whose
host-side ``can_implement`` takes ``C = 3``."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from dataclasses import replace
from math import prod

import pytest

from pyc_lab.errors import PycLabError
from pyc_lab.kernels.cache import KernelCache
from pyc_lab.kernels.cutlass.conv import ConvGeometry, ConvKernel, _declare_conv
from pyc_lab.kernels.cutlass.conv_2x import (
    Conv2xConfig,
    CutlassConv2x,
    build_conv2x,
    cached_conv2x,
    conv2x_align,
    conv2x_configs,
    conv2x_pad,
    conv2x_widths,
    emit_conv2x_source,
    padded_geometry,
)

SYMBOLS = ("pyc_conv_can_implement", "pyc_conv_workspace_size", "pyc_conv_create",
           "pyc_conv_destroy", "pyc_conv_initialize", "pyc_conv_run", "pyc_conv_has_bias",
           "pyc_conv_spatial")
STEM = Conv2xConfig((64, 64, 32), (32, 32, 32), 2, "few_channels")


def test_config_ids_and_dicts_round_trip():
    cfg = Conv2xConfig((128, 64, 32), (64, 32, 32), 4, "few_channels")
    assert cfg.id == "conv2x_t128x64x32_w64x32x32_s4_few_channels"
    assert cfg.warps == 4
    assert Conv2xConfig.from_dict(cfg.to_dict()) == cfg
    assert Conv2xConfig.from_dict(Conv2xConfig().to_dict()) == Conv2xConfig()
    padded = Conv2xConfig((128, 64, 32), (64, 32, 32), 3, "fixed_channels", pad_to=4)
    assert padded.id == "conv2x_t128x64x32_w64x32x32_s3_fixed_channels_c4"
    assert Conv2xConfig.from_dict(padded.to_dict()) == padded
    assert padded.channels(3) == 4 and cfg.channels(3) == 3
    # the iterators that fold the window into the reduction read pixels past it
    assert cfg.reads_outside_window and padded.reads_outside_window
    assert not Conv2xConfig().reads_outside_window  # optimized
    assert not Conv2xConfig(iterator="analytic").reads_outside_window
    # an entry written before pad_to existed reads back as unpadded
    old = {k: v for k, v in cfg.to_dict().items() if k != "pad_to"}
    assert Conv2xConfig.from_dict(old) == cfg
    for bad in ({}, {"tile": "64x64", "warp": "32x32x32", "stages": 3, "iterator": "optimized"},
                {"tile": "a", "warp": "32x32x32", "stages": 3, "iterator": "optimized"},
                {"tile": "64x64x32", "warp": "32x32x32", "stages": 3, "iterator": "fast"},
                {**cfg.to_dict(), "pad_to": -4}, {**cfg.to_dict(), "pad_to": "four"}):
        with pytest.raises(PycLabError, match="not a CUTLASS 2 convolution configuration"):
            Conv2xConfig.from_dict(bad)


def test_the_widest_access_that_divides_the_channels():
    assert [conv2x_align("f16", c) for c in (3, 4, 6, 8, 12, 64)] == [1, 4, 2, 8, 4, 8]
    assert [conv2x_align("tf32", c) for c in (3, 6, 8)] == [1, 2, 4]


def test_issue_refuses_what_cannot_compile_or_run():
    f16 = ConvKernel("f16", 2)
    assert Conv2xConfig().issue(f16, 64) == ""
    assert Conv2xConfig().issue(f16, 12) == ""  # align 4: 8-byte cp.async
    assert "not a multiple of align 8" in Conv2xConfig().issue(f16, 12, align=8)
    # one 2-byte element per access cannot be a cp.async: two stages only
    assert "need 2 stages" in Conv2xConfig(stages=3, iterator="few_channels").issue(f16, 3)
    assert Conv2xConfig(stages=3, iterator="few_channels").issue(f16, 6) == ""  # 4 bytes
    assert STEM.issue(f16, 3) == "" and STEM.issue(ConvKernel("tf32", 2), 3) == ""
    assert "C == align" in Conv2xConfig(stages=2, iterator="fixed_channels").issue(f16, 3)
    assert Conv2xConfig(iterator="fixed_channels").issue(f16, 4) == ""
    assert "align_out" in Conv2xConfig().issue(f16, 64, out_channels=12)
    assert Conv2xConfig().issue(f16, 64, out_channels=12, align_out=4) == ""
    assert "1, 2, 4 or 8" in Conv2xConfig().issue(ConvKernel("tf32", 2), 64, align=8)
    assert "does not divide" in Conv2xConfig((128, 128, 32), (48, 64, 32)).issue(f16, 64)
    assert "mma.sync" in Conv2xConfig((64, 64, 32), (32, 32, 8)).issue(f16, 64)
    assert "warps" in Conv2xConfig((256, 128, 32), (32, 32, 32)).issue(f16, 64)
    assert "shared memory" in Conv2xConfig((256, 256, 64), (128, 64, 64), 8).issue(f16, 64)
    assert "stages" in Conv2xConfig(stages=1).issue(f16, 64)
    assert "spatial" in Conv2xConfig().issue(ConvKernel("f16", 3), 64)
    assert "iterator" in Conv2xConfig(iterator="fast").issue(f16, 64)


def test_padding_widens_channels_that_are_not_an_access_width():
    assert [conv2x_pad("f16", c) for c in (1, 2, 3, 4, 5, 7, 8, 12, 64)] == \
        [0, 0, 4, 0, 8, 8, 0, 0, 0]
    assert [conv2x_pad("tf32", c) for c in (3, 4, 6)] == [4, 0, 0]
    f16 = ConvKernel("f16", 2)
    padded = Conv2xConfig((128, 64, 32), (64, 32, 32), 3, "fixed_channels", pad_to=4)
    assert padded.issue(f16, 3) == ""  # reads 4 channels: 8-byte cp.async, C == align
    assert "does not widen" in padded.issue(f16, 4)
    assert "does not widen" in padded.issue(f16, 6)
    assert conv2x_widths(padded, f16, 3, 64) == (4, 8)
    assert conv2x_widths(Conv2xConfig(), f16, 12, 36) == (4, 4)
    stem = ConvGeometry.from_channels_first((2, 3, 9, 11), (64, 3, 7, 7), (2, 2), (3, 3),
                                            (1, 1))
    read = padded_geometry(stem, 4)
    assert read.act == (2, 9, 11, 4) and read.flt == (64, 7, 7, 4)
    assert read.out == stem.out and read.pad == stem.pad and read.stride == stem.stride
    # one library serves a padded configuration and the unpadded one on those channels
    unpadded = Conv2xConfig((128, 64, 32), (64, 32, 32), 3, "fixed_channels")
    assert emit_conv2x_source(padded, f16, 4) == emit_conv2x_source(unpadded, f16, 4)


def test_candidates_for_few_channels_and_for_wide_ones():
    stem = conv2x_configs(ConvKernel("bf16", 2, True, "relu"), 3, 64)
    assert stem and len(set(stem)) == len(stem)
    # padded to 4 first (fixed- then few-channels, 8-byte cp.async), then as given
    assert stem[0].pad_to == 4 and stem[0].iterator == "fixed_channels"
    assert {c.stages for c in stem if c.pad_to} == {3, 4}
    as_given = [c for c in stem if not c.pad_to]
    assert as_given and stem.index(as_given[0]) == len(stem) - len(as_given)
    assert {c.iterator for c in as_given} == {"few_channels"}  # 3 is not an access width
    assert {c.stages for c in as_given} == {2} and max(c.tile[1] for c in stem) == 64
    odd_k = conv2x_configs(ConvKernel("f16", 2), 64, 36)  # epilogue accesses of 4
    assert odd_k and all(not c.issue(ConvKernel("f16", 2), 64, None, 36, 4) for c in odd_k)
    four = conv2x_configs(ConvKernel("f16", 2), 4)
    assert four[0].iterator == "fixed_channels" and four[-1].iterator == "few_channels"
    assert {c.stages for c in four} == {3, 4}
    wide = conv2x_configs(ConvKernel("f16", 2), 64, 256)
    assert {c.iterator for c in wide} == {"optimized"} and wide[0].tile == (128, 128, 32)
    assert all(c.tile[2] == 16 for c in conv2x_configs(ConvKernel("tf32", 2), 64))
    for kernel, c in ((ConvKernel("f16", 1), 3), (ConvKernel("tf32", 2), 6)):
        assert all(not cfg.issue(kernel, c) for cfg in conv2x_configs(kernel, c))


def test_the_source_is_the_native_text_under_its_defines():
    src = emit_conv2x_source(STEM, ConvKernel("bf16", 2, True, "gelu"), 1)
    for line in ("#define PYC_ELEMENT cutlass::bfloat16_t", "#define PYC_ALIGN 1",
                 "#define PYC_ALIGN_OUT 8", "#define PYC_SPATIAL 2", "#define PYC_TILE_M 64",
                 "#define PYC_WARP_K 32", "#define PYC_STAGES 2",
                 "#define PYC_ITERATOR cutlass::conv::IteratorAlgorithm::kFewChannels",
                 "#define PYC_BIAS 1",
                 "#define PYC_ACT cutlass::epilogue::thread::GELU_taylor",
                 "DefaultConv2dFprop", "ImplicitGemmConvolution", 'extern "C"',
                 *SYMBOLS):
        assert line in src
    plain = emit_conv2x_source(Conv2xConfig(), ConvKernel("f16", 1), 8, 4)
    assert "#define PYC_ACT cutlass::epilogue::thread::Identity" in plain
    assert "#define PYC_ALIGN_OUT 4" in plain and "#define PYC_SPATIAL 1" in plain
    assert emit_conv2x_source(Conv2xConfig(), ConvKernel("f16", 1), 8, 4) == plain
    with pytest.raises(PycLabError, match="need 2 stages"):
        emit_conv2x_source(Conv2xConfig(iterator="few_channels"), ConvKernel("f16", 2), 1)


def test_builds_that_cannot_happen_are_results_not_raises(tmp_path):
    cache = KernelCache(tmp_path)
    old = build_conv2x(STEM, ConvKernel(), 1, cc=75, cache=cache)
    assert old.status == "compile_error" and not old.ok and "sm_80" in old.message
    bad = build_conv2x(Conv2xConfig(stages=3), ConvKernel(), 1, cache=cache)
    assert bad.status == "compile_error" and "need 2 stages" in bad.message


def test_the_pre_checks_are_this_familys_not_tmas():
    conv = CutlassConv2x.__new__(CutlassConv2x)  # no library: only the checks
    conv.kernel, conv.config, conv.align, conv.align_out = ConvKernel("f16", 2), STEM, 1, 0
    stem = ConvGeometry.from_channels_first((2, 3, 32, 32), (64, 3, 7, 7), (2, 2), (3, 3),
                                            (1, 1))
    assert "multiples of 8" in stem.issue(conv.kernel)  # what the Hopper kernels say
    assert conv._issue(stem) == ""
    # a padded configuration is checked on the channels it reads
    conv.config, conv.align = Conv2xConfig((128, 64, 32), (64, 32, 32), 3, "fixed_channels",
                                           pad_to=4), 4
    assert conv._issue(padded_geometry(stem, 4)) == ""
    assert "not a multiple of align 4" in conv._issue(stem)
    conv.config, conv.align = STEM, 1
    odd_k = ConvGeometry.from_channels_first((2, 3, 32, 32), (12, 3, 7, 7), (2, 2), (3, 3),
                                             (1, 1))
    assert "align_out" in conv._issue(odd_k)
    tiny = ConvGeometry.from_channels_first((2, 3, 4, 4), (64, 3, 7, 7), (1, 1), (0, 0),
                                            (1, 1))
    assert "does not fit" in conv._issue(tiny)
    conv.config = None
    assert conv._issue(stem) == "" and "multiples of 1 and 8" in conv._issue(odd_k)


def test_the_cache_is_asked_never_built_from(tmp_path):
    cache = KernelCache(tmp_path)
    assert cached_conv2x(STEM, ConvKernel("bf16", 2), 1, cache=cache) is None  # empty
    assert cached_conv2x(STEM, ConvKernel("bf16", 2), 1, cc=75, cache=cache) is None
    assert cached_conv2x(Conv2xConfig(stages=3), ConvKernel(), 1, cache=cache) is None
    assert not any(tmp_path.iterdir())


@pytest.mark.nvcc
def test_a_stem_kernel_builds_with_the_hopper_kernels_c_functions(tmp_path):
    """bf16, three input channels (one-element accesses, few-channels iterator, two
    stages), bias + ReLU: nvcc builds it for sm_90a through the kernel cache, the library
    exports the same ``extern "C"`` functions as the CUTLASS 3 kernels, and its host-side
    ``can_implement`` (no GPU needed) takes the stem and refuses what it must."""
    kernel = ConvKernel("bf16", 2, True, "relu")
    res = build_conv2x(STEM, kernel, 1, cc=90, cache=KernelCache(tmp_path))
    assert res.ok and res.status == "built", res.message
    assert cached_conv2x(STEM, kernel, 1, cache=KernelCache(tmp_path)) == res.library
    if shutil.which("nm"):
        out = subprocess.run(["nm", "-D", "--defined-only", str(res.library)],
                             capture_output=True, text=True, check=True).stdout
        exported = {ln.split()[-1] for ln in out.splitlines() if ln.strip()}
        assert set(SYMBOLS) <= exported
    lib = ctypes.CDLL(str(res.library))
    _declare_conv(lib)  # the Hopper kernels' signatures
    assert lib.pyc_conv_has_bias() == 1 and lib.pyc_conv_spatial() == 2
    stem = ConvGeometry.from_channels_first((8, 3, 224, 224), (64, 3, 7, 7), (2, 2),
                                            (3, 3), (1, 1))
    assert lib.pyc_conv_can_implement(*stem.arrays()) == 0
    assert lib.pyc_conv_workspace_size(*stem.arrays(), 132) == 0
    odd_k = ConvGeometry.from_channels_first((8, 3, 224, 224), (12, 3, 7, 7), (2, 2),
                                             (3, 3), (1, 1))
    assert lib.pyc_conv_can_implement(*odd_k.arrays()) != 0  # K not a multiple of 8
    handle = lib.pyc_conv_create()
    assert handle
    lib.pyc_conv_destroy(handle)


def test_float32_at_its_own_accuracy_is_3xtf32_in_this_family_only(tmp_path):
    """``f32`` kernels are the tf32 ones with CUTLASS's 3xTF32 MMA operator; the TF32
    kernels keep CUTLASS's default; the Hopper family refuses ``f32`` before nvcc."""
    from pyc_lab.kernels.cutlass.conv import (
        ConvConfig,
        build_conv,
        cached_conv,
        emit_conv_source,
    )

    exact = emit_conv2x_source(Conv2xConfig(), ConvKernel("f32", 2), 4, 4)
    tf32 = emit_conv2x_source(Conv2xConfig(), ConvKernel("tf32", 2), 4, 4)
    assert "#define PYC_MATH cutlass::arch::OpMultiplyAddFastF32" in exact
    assert "#define PYC_ELEMENT float" in exact and "#define PYC_ELEMENT float" in tf32
    assert "#define PYC_MATH cutlass::arch::OpMultiplyAddFastF32" not in tf32  # the default
    assert exact != tf32
    assert conv2x_align("f32", 64) == 4 and conv2x_align("f32", 6) == 2
    configs = conv2x_configs(ConvKernel("f32", 2), 64, 256)
    assert configs and all(c.tile[2] == 16 for c in configs)  # 64-byte K rows of floats
    g = ConvGeometry.from_channels_first((2, 16, 9, 9), (24, 16, 3, 3), (1, 1), (1, 1),
                                         (1, 1))
    assert "3xTF32" in g.issue(ConvKernel("f32", 2)) and g.issue(ConvKernel("tf32", 2)) == ""
    with pytest.raises(PycLabError, match="3xTF32"):
        emit_conv_source(ConvConfig(), ConvKernel("f32", 2))
    res = build_conv(ConvConfig(), ConvKernel("f32", 2), cache=KernelCache(tmp_path))
    assert res.status == "compile_error" and "3xTF32" in res.message
    assert cached_conv(ConvConfig(), ConvKernel("f32", 2), cache=KernelCache(tmp_path)) is None


@pytest.mark.nvcc
def test_a_3xtf32_kernel_builds(tmp_path):
    """nvcc builds an f32 (3xTF32) kernel with bias and ReLU for sm_90a, and its
    host-side ``can_implement`` takes a ResNet layer."""
    kernel = ConvKernel("f32", 2, True, "relu")
    cfg = conv2x_configs(kernel, 64, 64)[0]
    res = build_conv2x(cfg, kernel, 4, cc=90, cache=KernelCache(tmp_path), align_out=4)
    assert res.ok and res.status == "built", res.message
    lib = ctypes.CDLL(str(res.library))
    _declare_conv(lib)
    layer = ConvGeometry.from_channels_first((8, 64, 56, 56), (64, 64, 3, 3), (1, 1),
                                             (1, 1), (1, 1))
    assert lib.pyc_conv_can_implement(*layer.arrays()) == 0


class _FakeLibrary:
    """The ``extern "C"`` functions of a kernel library, recording what they are given."""

    def __init__(self) -> None:
        self.initialized: list[tuple[tuple[int, ...], int, int]] = []
        self.runs = 0
        self.asked: list[tuple[int, ...]] = []
        self.residuals: list[int] = []

    def pyc_conv_set_residual(self, handle, r):
        self.residuals.append(r)

    def pyc_conv_initialize(self, handle, act, flt, pad, stride, dil, x, w, b, y, ws, sms,
                            stream):
        self.initialized.append((tuple(act), x, y))
        return 0

    def pyc_conv_run(self, handle, stream):
        self.runs += 1
        return 0

    def pyc_conv_workspace_size(self, act, *rest):
        return 0

    def pyc_conv_can_implement(self, act, *rest):
        self.asked.append(tuple(act))
        return 0

    def pyc_conv_destroy(self, handle):
        pass


def _unloaded(direction: str = "fprop", limit: int | None = None,
              residual: bool = False) -> CutlassConv2x:
    """A CUTLASS 2 convolution over a fake library (no nvcc, no GPU)."""
    import threading

    conv = CutlassConv2x.__new__(CutlassConv2x)
    conv.kernel = ConvKernel("f32", 2, residual, direction=direction, residual=residual)
    conv.config, conv.align, conv.align_out, conv.sm_count = None, 4, 4, 132
    conv._lib, conv._handle, conv._bound, conv._workspace = _FakeLibrary(), 1, None, None
    conv._problems, conv._lock = {}, threading.Lock()
    if limit is not None:
        conv.max_tensor_bytes = limit
    return conv


def test_a_batch_over_the_32_bit_offsets_runs_in_slices():
    """This family's iterators address a tensor with 32-bit byte offsets: a batch whose
    activations or output hold 2^31 bytes or more runs as launches over slices of the
    batch, as equal as they can be, each under the limit, the pointers moved by whole
    images; one that fits runs whole."""
    conv = _unloaded()
    assert conv.max_tensor_bytes == 2**31 - 1
    # ResNet-50's 56 x 56 x 256 float32 tensor at batch 1024: 3.3 GB of output
    big = ConvGeometry.from_channels_first((1024, 64, 56, 56), (256, 64, 1, 1), (1, 1),
                                           (0, 0), (1, 1))
    parts = conv.slices(big)
    assert [first for first, _ in parts] == [0, 512]
    assert [g.act[0] for _, g in parts] == [512, 512]
    assert all(prod(g.out_shape) * 4 <= 2**31 - 1 for _, g in parts)
    small = replace(big, act=(512, *big.act[1:]))
    assert conv.slices(small) == [(0, small)]
    x, w, y = 10**12, 5 * 10**11, 2 * 10**12
    conv.run(big, x, w, None, y, 0)
    in_image, out_image = 56 * 56 * 64 * 4, 56 * 56 * 256 * 4
    assert conv._lib.initialized == [((512, 56, 56, 64), x, y),
                                     ((512, 56, 56, 64), x + 512 * in_image,
                                      y + 512 * out_image)]
    assert conv._lib.runs == 2
    assert conv.can_implement(big) and set(conv._lib.asked) == {(512, 56, 56, 64)}


def test_slices_cover_an_odd_batch_and_the_gradients_as_they_allow():
    """An odd batch: slices of at most two sizes covering every image once; a dgrad
    slices too (its ``dy`` and ``dx`` by their own image sizes), a wgrad (a reduction
    over the batch) and an image alone over the limit are refused with the reason."""
    g = ConvGeometry.from_channels_first((7, 4, 5, 5), (8, 4, 3, 3), (2, 2), (1, 1), (1, 1))
    image = max(5 * 5 * 4, 3 * 3 * 8) * 4  # the input's image is the larger: 400 bytes
    conv = _unloaded(limit=3 * image)
    parts = conv.slices(g)
    assert [first for first, _ in parts] == [0, 3, 6]
    assert [p.act[0] for _, p in parts] == [3, 3, 1]
    assert all(p.act[1:] == g.act[1:] and p.flt == g.flt for _, p in parts)
    dgrad = _unloaded("dgrad", limit=3 * image)
    dgrad.run(g, 1000, 7, None, 9000, 0)  # (dy, w) -> dx
    dy_image, dx_image = 3 * 3 * 8 * 4, 5 * 5 * 4 * 4
    assert [(a[0], x, y) for a, x, y in dgrad._lib.initialized] == [
        (3, 1000, 9000), (3, 1000 + 3 * dy_image, 9000 + 3 * dx_image),
        (1, 1000 + 6 * dy_image, 9000 + 6 * dx_image)]
    with pytest.raises(PycLabError, match="wgrad reduces over the batch"):
        _unloaded("wgrad", limit=3 * image).run(g, 1, 2, None, 3, 0)
    assert not _unloaded("wgrad", limit=3 * image).can_implement(g)
    with pytest.raises(PycLabError, match="one image's tensor is over it"):
        _unloaded(limit=image - 1).slices(g)


def test_a_residual_kernel_is_a_forward_one_with_a_bias_and_this_familys():
    """``ConvKernel(residual=True)``: its own op in the tuning database, a forward kernel
    with a bias only (the epilogue's +0.0 without one would change -0.0 sums); the
    Hopper family refuses it before nvcc, and so does a configuration whose iterator
    reads outside the window (its NaN fix-up adds no residual)."""
    from pyc_lab.kernels.cutlass.conv import (
        ConvConfig,
        build_conv,
        cached_conv,
        emit_conv_source,
    )

    kernel = ConvKernel("f32", 2, True, "relu", residual=True)
    assert kernel.op == "conv2d_fprop_bias_res_relu"
    assert ConvKernel("f16", 2, True, residual=True).op == "conv2d_fprop_bias_res"
    with pytest.raises(PycLabError, match="takes a bias"):
        ConvKernel("f32", 2, False, "relu", residual=True)
    with pytest.raises(PycLabError, match="no bias, residual or activation"):
        ConvKernel("f32", 2, direction="dgrad", residual=True)
    g = ConvGeometry.from_channels_first((2, 64, 9, 9), (64, 64, 1, 1), (1, 1), (0, 0),
                                         (1, 1))
    assert "add no residual" in g.issue(ConvKernel("f16", 2, True, residual=True))
    with pytest.raises(PycLabError, match="add no residual"):
        emit_conv_source(ConvConfig(), ConvKernel("f16", 2, True, residual=True))
    hopper = build_conv(ConvConfig(), ConvKernel("f16", 2, True, residual=True))
    assert hopper.status == "compile_error" and "add no residual" in hopper.message
    assert cached_conv(ConvConfig(), ConvKernel("f16", 2, True, residual=True)) is None
    src = emit_conv2x_source(Conv2xConfig(), kernel, 4, 4)
    assert "#define PYC_RESIDUAL 1" in src and "#define PYC_BIAS 1" in src
    assert "DefaultConv2dFpropWithBroadcast" in src  # the native text's residual branch
    assert "#define PYC_RESIDUAL 0" in emit_conv2x_source(Conv2xConfig(),
                                                          ConvKernel("f32", 2, True), 4, 4)
    assert "reads pixels outside" in STEM.issue(ConvKernel("f16", 2, True, residual=True), 3)
    # a stem's few channels have only such iterators: nothing to tune, pl.conv adds after
    assert conv2x_configs(ConvKernel("f16", 2, True, residual=True), 3, 64) == []
    wide = conv2x_configs(kernel, 64, 256)
    assert wide and all(c.iterator == "optimized" for c in wide)


def test_a_residual_kernel_binds_the_residual_with_each_launch_and_slice():
    """The residual's pointer is bound before each initialise — moved by whole output
    images with the output over slices of the batch — and a residual kernel refuses a
    call without one (a plain kernel one with one)."""
    conv = _unloaded(limit=3 * 5 * 5 * 8 * 4, residual=True)
    g = ConvGeometry.from_channels_first((7, 8, 5, 5), (8, 8, 1, 1), (1, 1), (0, 0), (1, 1))
    out_image = 5 * 5 * 8 * 4
    conv.run(g, 1000, 7, 11, 9000, 0, 50000)
    assert conv._lib.residuals == [50000, 50000 + 3 * out_image, 50000 + 6 * out_image]
    assert [y for _, _, y in conv._lib.initialized] == [9000, 9000 + 3 * out_image,
                                                        9000 + 6 * out_image]
    conv.run(g, 1000, 7, 11, 9000, 0, 50000)  # the same pointers: bound already
    assert len(conv._lib.residuals) == 3 + 3  # each slice binds again (one handle)
    with pytest.raises(PycLabError, match="a residual is needed"):
        conv.run(g, 1000, 7, 11, 9000, 0)
    plain = _unloaded(residual=False)
    plain.kernel = ConvKernel("f32", 2, True)
    with pytest.raises(PycLabError, match="a residual is not taken"):
        plain.run(g, 1000, 7, 11, 9000, 0, 50000)


@pytest.mark.nvcc
def test_a_residual_kernel_builds_and_says_so(tmp_path):
    """nvcc builds the 3xTF32 residual kernel (bias, relu) for sm_90a; the library says
    it adds a residual, takes a ResNet block's last 1x1 layer, and loads as one."""
    kernel = ConvKernel("f32", 2, True, "relu", residual=True)
    cfg = conv2x_configs(kernel, 64, 256)[0]
    res = build_conv2x(cfg, kernel, 4, cc=90, cache=KernelCache(tmp_path), align_out=4)
    assert res.ok and res.status == "built", res.message
    lib = ctypes.CDLL(str(res.library))
    _declare_conv(lib)
    assert lib.pyc_conv_has_residual() == 1 and lib.pyc_conv_has_bias() == 1
    layer = ConvGeometry.from_channels_first((8, 64, 56, 56), (256, 64, 1, 1), (1, 1),
                                             (0, 0), (1, 1))
    assert lib.pyc_conv_can_implement(*layer.arrays()) == 0
    handle = lib.pyc_conv_create()
    lib.pyc_conv_set_residual(handle, 12345)
    lib.pyc_conv_destroy(handle)
