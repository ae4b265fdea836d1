"""The direct convolution kernel (native/conv_direct.cuh) run on the CPU: compiled as C++
with g++ (tests/compiler/emulate.py's threaded prelude: CUDA's keywords defined away, the
float16 PTX as ``_Float16`` casts, each block's threads as real threads with
``__syncthreads()`` a barrier and the filters' shared memory shared), into NaN-poisoned
outputs, against a float64 convolution of the same stored
values with the bias and activation — in float32, float16 and bfloat16, 1-D and 2-D,
stride, padding, dilation, groups, strided (channels-last) inputs, tiles of 1 to 32
channels and 1 to 8 pixels per thread, pixel counts that leave a block part-empty."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

from pyc_lab.kernels import conv_direct
from pyc_lab.kernels.conv_im2col import conv_im2col
from pyc_lab.paths import native_source
from tests.compiler.emulate import native_library, needs_gxx

pytestmark = needs_gxx

#: CUDA's vector types and alignment the sources name (conv_guard.cuh's copy kernel, the
#: direct kernel's 16-byte shared loads).
_VECTORS = r"""
#define __align__(n) alignas(n)
struct float4 { float x, y, z, w; };
struct int4 { int x, y, z, w; };
static inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
struct uint4 { unsigned int x, y, z, w; };
struct uint2 { unsigned int x, y; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) {
  return {a, b, c, d};
}
static inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
"""

_DRIVER = r"""
template <int KIND, int OT, int PT, int ACT>
static void pyc_run(const void* x, const void* w, const void* b, void* y, const int* g,
                    unsigned gx, unsigned gy, unsigned threads) {
  typedef typename pyc_guard_word<KIND>::type T;
  pyc_grid(gx, gy, threads, [=]() {
    pyc_conv_direct<KIND, OT, PT, ACT>((const T*)x, (const T*)w, (const T*)b, (T*)y,
        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11],
        g[12], g[13], g[14], g[15], g[16], g[17], g[18], g[19]);
  });
}
template <int KIND, int OT, int PT, int ACT, int S, int SW>
static void pyc_run_rows(const void* x, const void* w, const void* b, void* y, const int* g,
                         unsigned gx, unsigned gy, unsigned threads) {
  typedef typename pyc_guard_word<KIND>::type T;
  pyc_grid(gx, gy, threads, [=]() {
    pyc_conv_direct_rows<KIND, OT, PT, ACT, S, SW>((const T*)x, (const T*)w, (const T*)b,
        (T*)y, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11],
        g[12], g[13], g[14], g[15], g[16], g[17], g[18], g[19]);
  });
}
template <int KIND, int OT, int L, int ACT>
static void pyc_run_split(const void* x, const void* w, const void* b, void* y, const int* g,
                          unsigned gx, unsigned gy, unsigned threads) {
  typedef typename pyc_guard_word<KIND>::type T;
  pyc_grid(gx, gy, threads, [=]() {
    pyc_conv_direct_split<KIND, OT, L, ACT>((const T*)x, (const T*)w, (const T*)b, (T*)y,
        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11],
        g[12], g[13], g[14], g[15], g[16], g[17], g[18], g[19]);
  });
}
extern "C" int conv(int kind, int rows, int split, int ot, int pt, int act, int s, int sw,
                    const void* x, const void* w, const void* b, void* y, const int* g,
                    unsigned gx, unsigned gy, unsigned threads) {
__CASES__
  return 1;  // not instantiated
}
"""

_TYPES = {"float32": (np.float32, 2, np.uint32), "float16": (np.float16, 0, np.uint16),
          "bfloat16": (ml_dtypes.bfloat16, 1, np.uint16)}
_ACTS = {None: 0, "relu": 1, "gelu": 2, "silu": 3}
_Config = conv_direct.Config

_PROBLEMS = [
    # x shape, w shape, stride, pads, dilation, groups
    ((3, 4, 32), (32, 4, 3), (1,), (0,), (1,), 1),          # the particle CNN's first layer
    ((2, 32, 30), (32, 32, 3), (1,), (1,), (1,), 1),        # ... and its second
    ((2, 5, 17), (6, 5, 4), (2,), (1,), (2,), 1),           # stride, padding, dilation
    ((1, 6, 9), (6, 1, 3), (1,), (1,), (1,), 6),            # depthwise
    ((2, 6, 11), (4, 3, 2), (1,), (0,), (1,), 2),           # two groups of two channels
    ((2, 3, 13, 11), (8, 3, 7, 7), (2, 2), (3, 3), (1, 1), 1),  # a stem
    ((1, 4, 9, 10), (12, 2, 3, 2), (1, 2), (1, 0), (2, 1), 2),
    ((3, 2, 5, 7), (7, 2, 1, 1), (1, 1), (0, 0), (1, 1), 1),    # 1x1, 7 output channels
    ((1, 64, 11), (8, 64, 8), (1,), (3,), (1,), 1),         # MAX_TAPS (512) taps
]
#: Every build for one problem, by hand: the generic kernel's tiles and the row kernel's.
_TILES = [_Config(False, 8, 4), _Config(False, 8, 1), _Config(False, 4, 4),
          _Config(False, 2, 1), _Config(False, 1, 4), _Config(True, 8, 4),
          _Config(True, 8, 8), _Config(True, 4, 4), _Config(True, 1, 4),
          _Config(False, 8, 1, 32), _Config(False, 4, 1, 8), _Config(False, 4, 1, 4),
          _Config(False, 1, 1, 16)]

#: The row kernel's wide builds (16 and 32 channels a thread) and problems they take: a
#: 1-D layer of 32 channels, a 2-D one of two groups of 32, a reduction at the 32-channel
#: build's shared-memory bound (384 taps).
_WIDE = [_Config(True, o, p) for o, p in conv_direct.WIDE_ROWS]
_WIDE_PROBLEMS = [
    ((3, 5, 37), (32, 5, 3), (1,), (1,), (1,), 1),
    ((2, 4, 6, 9), (64, 2, 3, 3), (1, 1), (1, 1), (1, 1), 2),
    ((1, 128, 7), (32, 128, 3), (1,), (1,), (1,), 1),
    ((2, 3, 41), (16, 3, 7), (2,), (3,), (1,), 1),              # stride 2 along the row
    ((1, 2, 11, 13), (32, 2, 3, 5), (2, 1), (2, 2), (2, 1), 1),  # strided, dilated rows
]


def _geo(xs, ws, stride, pads, dilation, groups):
    strides = tuple(int(np.prod(xs[i + 1:])) for i in range(len(xs)))
    return conv_direct.geometry(xs, strides, ws, stride, pads, dilation, groups)


def _builds(dtype, geo):
    """The builds a test runs a problem with: all of :func:`configs` in float32, the
    default one in the 16-bit types."""
    every = conv_direct.configs(geo)
    return every if dtype == "float32" else every[:1]


def _instances():
    """Every (kind, config, activation, s, sw) the tests launch."""
    out = set()

    def add(dtype, geo, configs, acts):
        for config in configs:
            for act in acts:
                out.add((_TYPES[dtype][1], config, _ACTS[act], geo[6], geo[10]))

    for prob in _PROBLEMS:
        geo = _geo(*prob)
        for dtype in _TYPES:
            add(dtype, geo, _builds(dtype, geo), (None, "relu"))
    add("float32", _geo((5, 3, 23), (8, 3, 5), (1,), (2,), (1,), 1), _TILES,
        ("gelu", "silu", None, "relu"))
    for geo in (_geo((2, 5, 9, 8), (4, 5, 3, 3), (1, 1), (1, 1), (1, 1), 1),
                _geo((2, 3, 12), (4, 3, 3), (1,), (1,), (1,), 1)):
        add("float32", geo, conv_direct.configs(geo), (None, "relu"))
    for prob in _WIDE_PROBLEMS:
        for dtype in _TYPES:
            add(dtype, _geo(*prob), [c for c in _WIDE if (prob[1][0] // prob[5]) % c.ot == 0],
                (None, "relu"))
    return sorted(out, key=str)


def _cases() -> str:
    lines = []
    for kind, c, act, s, sw in _instances():
        test = (f"kind == {kind} && rows == {int(c.rows)} && split == {c.split} && "
                f"ot == {c.ot} && pt == {c.pt} && act == {act}")
        if c.split:
            lines.append(f"  if ({test}) {{ pyc_run_split<{kind}, {c.ot}, {c.split}, {act}>("
                         "x, w, b, y, g, gx, gy, threads); return 0; }")
        elif c.rows:
            lines.append(f"  if ({test} && s == {s} && sw == {sw}) {{ pyc_run_rows<{kind}, "
                         f"{c.ot}, {c.pt}, {act}, {s}, {sw}>(x, w, b, y, g, gx, gy, threads); "
                         "return 0; }")
        else:
            lines.append(f"  if ({test}) {{ pyc_run<{kind}, {c.ot}, {c.pt}, {act}>(x, w, b, "
                         "y, g, gx, gy, threads); return 0; }")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def library():
    text = _VECTORS + "".join(native_source(f) for f in
                   ("f16.cuh", "bf16.cuh", "conv_guard.cuh", "conv_direct.cuh")) + \
        _DRIVER.replace("__CASES__", _cases())
    return native_library(text, "conv_direct")


def _reference(x, w, b, stride, pads, dilation, groups, activation):
    """float64 convolution of the stored values, then the bias and the activation."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    y = conv_im2col(x64, w64, None if b is None else b.astype(np.float64), strides=stride,
                    pads=tuple(pads) * 2, dilations=dilation, group=groups)
    if activation == "relu":
        y = np.where(np.isnan(y), y, np.maximum(y, 0))
    elif activation == "gelu":
        y = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    elif activation == "silu":
        y = y / (1 + np.exp(-y))
    return y


def _run(library, x, w, b, stride, pads, dilation, groups, activation, config=None):
    dtype = np.dtype(x.dtype).name
    _, kind, word = _TYPES[dtype]
    item = x.dtype.itemsize
    geo = conv_direct.geometry(x.shape, tuple(s // item for s in x.strides), w.shape, stride,
                               pads, dilation, groups)
    assert geo is not None
    k, p, q, pixels = geo[3], geo[7], geo[8], geo[-1]
    config = config or conv_direct.configs(geo)[0]
    out_shape = (x.shape[0], k, q) if x.ndim == 3 else (x.shape[0], k, p, q)
    y = np.full(out_shape, np.nan, dtype=x.dtype)  # poisoned: every output must be written
    # the kernel reads x through its strides from the base of x's own buffer
    xv = x.view(word)
    wv = np.ascontiguousarray(w).view(word)
    bv = None if b is None else np.ascontiguousarray(b).view(word)
    g = np.array(geo, dtype=np.int32)
    threads = 32  # a small block: several blocks and part-empty ones on small problems
    if config.rows:
        gx = max(1, -(-(pixels // q) * -(-q // config.pt) // threads))
    elif config.split:
        gx = max(1, -(-pixels * config.split // threads))
    else:
        gx = max(1, -(-pixels // (threads * config.pt)))
    missing = library.conv(
        ctypes.c_int(kind), ctypes.c_int(int(config.rows)), ctypes.c_int(config.split),
        ctypes.c_int(config.ot),
        ctypes.c_int(config.pt), ctypes.c_int(_ACTS[activation]), ctypes.c_int(geo[6]),
        ctypes.c_int(geo[10]), ctypes.c_void_p(xv.__array_interface__["data"][0]),
        ctypes.c_void_p(wv.ctypes.data), ctypes.c_void_p(0 if bv is None else bv.ctypes.data),
        ctypes.c_void_p(y.view(word).ctypes.data), g.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_uint(gx), ctypes.c_uint(k // config.ot), ctypes.c_uint(threads))
    assert missing == 0, f"the test driver has no {config} instance for {dtype} {geo}"
    return y


def _tolerance(dtype, taps):
    if dtype == "float32":
        return 2e-6 * np.sqrt(taps) + 1e-6
    return {"float16": 2e-3, "bfloat16": 1.6e-2}[dtype]


def _check(got, want, dtype, taps):
    assert not np.isnan(got.astype(np.float64)[~np.isnan(want)]).any(), "an output unwritten"
    np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), np.isnan(want))
    tol = _tolerance(dtype, taps)
    g = got.astype(np.float64)
    ok = ~np.isnan(want)
    scale = max(1.0, float(np.abs(want[np.isfinite(want)]).max()))
    np.testing.assert_allclose(g[ok], want[ok], rtol=tol, atol=tol * scale)




@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("xs", "ws", "stride", "pads", "dilation", "groups"), _PROBLEMS)
@pytest.mark.parametrize("activation", [None, "relu"])
def test_direct_matches_float64(library, dtype, xs, ws, stride, pads, dilation, groups,
                                activation):
    rng = np.random.default_rng(abs(hash((xs, ws, dtype))) % 2**32)
    t = _TYPES[dtype][0]
    x = rng.uniform(-1, 1, xs).astype(t)
    w = rng.uniform(-1, 1, ws).astype(t)
    b = rng.uniform(-1, 1, ws[0]).astype(t)
    want = _reference(x, w, b, stride, pads, dilation, groups, activation)
    for config in _builds(dtype, _geo(xs, ws, stride, pads, dilation, groups)):
        got = _run(library, x, w, b, stride, pads, dilation, groups, activation, config)
        assert got.shape == want.shape
        _check(got, want, dtype, int(np.prod(ws[1:])))


@pytest.mark.parametrize("config", _TILES, ids=str)
@pytest.mark.parametrize("activation", ["gelu", "silu", None])
def test_every_build_and_activation(library, config, activation):
    rng = np.random.default_rng(7)
    x = rng.uniform(-2, 2, (5, 3, 23)).astype(np.float32)
    w = rng.uniform(-1, 1, (8, 3, 5)).astype(np.float32)
    b = rng.uniform(-1, 1, 8).astype(np.float32)
    got = _run(library, x, w, b, (1,), (2,), (1,), 1, activation, config)
    _check(got, _reference(x, w, b, (1,), (2,), (1,), 1, activation), "float32", 15)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("xs", "ws", "stride", "pads", "dilation", "groups"), _WIDE_PROBLEMS)
def test_wide_row_builds_match_float64(library, dtype, xs, ws, stride, pads, dilation,
                                       groups):
    """The 16- and 32-channel row builds (those whose width divides a group's channels),
    with NaN, +-inf and -0.0 among the inputs, rows that leave a thread's last outputs
    past the row's end (37 and 9 are not multiples of 4), strides of 2 along the row,
    dilated filter rows and blocks that are part-empty."""
    rng = np.random.default_rng(len(xs) * 100 + ws[1])
    t = _TYPES[dtype][0]
    x = rng.uniform(-1, 1, xs).astype(t)
    x.flat[[3, 40, 77]] = [np.nan, np.inf, -0.0]
    w = rng.uniform(-1, 1, ws).astype(t)
    b = rng.uniform(-1, 1, ws[0]).astype(t)
    assert conv_direct.row_taps(32) == 384 and conv_direct.row_taps(16) == conv_direct.MAX_TAPS
    for activation in (None, "relu"):
        want = _reference(x, w, b, stride, pads, dilation, groups, activation)
        assert np.isnan(want).any()
        for config in (c for c in _WIDE if (ws[0] // groups) % c.ot == 0):
            got = _run(library, x, w, b, stride, pads, dilation, groups, activation, config)
            _check(got, want, dtype, int(np.prod(ws[1:])))


def test_wide_row_builds_are_offered_where_they_fit():
    """A large problem whose channels divide by 16 or 32 gets the wide builds; a small
    one (fewer outputs than a block per SM at that width), channels that do not divide,
    and a reduction past the 32-channel build's 384 taps do not (that build only)."""
    def wide(*prob):
        return [(c.ot, c.pt) for c in conv_direct.configs(_geo(*prob)) if c.ot > 8]

    assert wide((4096, 32, 32), (32, 32, 3), (1,), (1,), (1,), 1) == list(conv_direct.WIDE_ROWS)
    assert wide((1, 32, 32), (32, 32, 3), (1,), (1,), (1,), 1) == []
    assert wide((4096, 32, 32), (24, 32, 3), (1,), (1,), (1,), 1) == []
    assert wide((4096, 160, 32), (32, 160, 3), (1,), (1,), (1,), 1) == [(16, 4)]
    assert wide((4096, 32, 32), (16, 32, 3), (1,), (1,), (1,), 1) == [(16, 4)]


def test_no_bias_and_a_channels_last_view(library):
    rng = np.random.default_rng(3)
    nhwc = rng.uniform(-1, 1, (2, 9, 8, 5)).astype(np.float32)
    x = nhwc.transpose(0, 3, 1, 2)  # channels first, channels-last memory: strides (360, 1, 40, 5)
    w = rng.uniform(-1, 1, (4, 5, 3, 3)).astype(np.float32)
    want = _reference(x, w, None, (1, 1), (1, 1), (1, 1), 1, None)
    geo = _geo((2, 5, 9, 8), (4, 5, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    assert any(c.split for c in conv_direct.configs(geo))
    for config in conv_direct.configs(geo):
        _check(_run(library, x, w, None, (1, 1), (1, 1), (1, 1), 1, None, config), want,
               "float32", 45)


def test_nan_inf_and_signed_zero(library):
    rng = np.random.default_rng(11)
    x = rng.uniform(-1, 1, (2, 3, 12)).astype(np.float32)
    x[0, 1, 5] = np.nan
    x[1, 2, 0] = np.inf
    x[1, 0, 7] = -0.0
    w = rng.uniform(-1, 1, (4, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 4).astype(np.float32)
    for act in (None, "relu"):
        want = _reference(x, w, b, (1,), (1,), (1,), 1, act)
        assert np.isnan(want).any() and np.isinf(want).any()
        for config in (*conv_direct.configs(_geo((2, 3, 12), (4, 3, 3), (1,), (1,), (1,), 1)),
                       _Config(False, 4, 1, 4)):
            _check(_run(library, x, w, b, (1,), (1,), (1,), 1, act, config), want, "float32",
                   9)


def test_geometry_refuses_what_the_kernel_cannot_take():
    contiguous = (96, 32, 1)
    assert conv_direct.geometry((1, 3, 32), contiguous, (4, 3, 3), (1,), (0,), (1,), 1)
    # a reduction past MAX_TAPS
    big = conv_direct.MAX_TAPS + 1
    assert conv_direct.geometry((1, big, 8), (8 * big, 8, 1), (4, big, 1), (1,), (0,), (1,),
                                1) is None
    # three spatial axes, channels that do not fit the groups, a window too large
    assert conv_direct.geometry((1, 2, 4, 4, 4), (128, 64, 16, 4, 1), (2, 2, 1, 1, 1),
                                (1, 1, 1), (0, 0, 0), (1, 1, 1), 1) is None
    assert conv_direct.geometry((1, 3, 8), (24, 8, 1), (4, 1, 3), (1,), (0,), (1,), 2) is None
    assert conv_direct.geometry((1, 3, 2), (6, 2, 1), (4, 3, 3), (1,), (0,), (1,), 1) is None
    assert not conv_direct.eligible("float64", (1, 3, 32), contiguous, (4, 3, 3), (1,), (0,),
                                    (1,), 1)
    assert conv_direct.eligible("bfloat16", (1, 3, 32), contiguous, (4, 3, 3), (1,), (0,),
                                (1,), 1)


def test_split_builds_are_offered_to_small_problems_with_long_sums():
    """Batch 1 of the particle CNN's 32 -> 32 layer (96 taps a pixel) gets the split
    builds (32 and 8 lanes a pixel); the same layer at 4096 rows, and a layer of 9 taps,
    do not (a thread's sum is short, or the outputs fill the GPU many times)."""
    assert conv_direct.split_lanes(96) == (32, 8)
    assert conv_direct.split_lanes(12) == (4,)
    assert conv_direct.split_lanes(27) == (8,)
    small = conv_direct.configs(_geo((1, 32, 32), (32, 32, 3), (1,), (1,), (1,), 1))
    assert [c.split for c in small if c.split] == [32, 8]
    assert all(c.ot <= c.split for c in small if c.split)
    large = conv_direct.configs(_geo((4096, 32, 32), (32, 32, 3), (1,), (1,), (1,), 1))
    assert not any(c.split for c in large)
    short = conv_direct.configs(_geo((1, 1, 32), (8, 1, 9), (1,), (4,), (1,), 1))
    assert not any(c.split for c in short)
    assert _Config(False, 8, 1, 32).label == "split 8/32"
    assert _Config(True, 8, 4).label == "rows 8x4"


def test_tile_choice():
    assert conv_direct.tile(32, 32 * 28) == (8, 1)           # batch 1: spread the outputs
    assert conv_direct.tile(32, 32 * 28 * 4096) == (8, 4)    # a large batch: 4 pixels each
    assert conv_direct.tile(6, 10**9)[0] == 2
    assert conv_direct.tile(1, 10)[0] == 1                   # depthwise


def test_a_cupy_array_finds_the_choice_its_torch_view_raced(monkeypatch):
    """A compiled program looks the race's choice up from CuPy arrays' metadata (no
    DLPack inside a capture): the key must be the one the race stored from the torch
    views of the same arrays."""
    from types import SimpleNamespace

    from pyc_lab.kernels import conv_gemm

    def torch_like(a, dtype):
        return SimpleNamespace(device=SimpleNamespace(index=0), dtype=f"torch.{dtype}",
                               shape=a.shape, stride=lambda: tuple(s // a.itemsize
                                                                   for s in a.strides))

    def cupy_like(a, dtype):
        return SimpleNamespace(device=SimpleNamespace(id=0), shape=a.shape,
                               strides=a.strides,
                               dtype=SimpleNamespace(name=dtype, itemsize=a.itemsize))

    x = np.zeros((2, 4, 9, 8), np.float32).transpose(0, 3, 1, 2)  # a strided view
    w = np.zeros((5, 8, 3, 3), np.float32)
    geo = ((1, 2), (1, 1), (1, 1), 1, "relu")
    monkeypatch.setattr(conv_gemm, "_CHOICES", {})
    key = conv_gemm._signature(torch_like(x, "float32"), torch_like(w, "float32"), None, *geo)
    conv_gemm._remember(key, {"impl": "direct", "cudnn_ms": 1.0})
    assert conv_gemm.choice_for_cupy(cupy_like(x, "float32"), cupy_like(w, "float32"), None,
                                     *geo)["impl"] == "direct"
    other = ((1, 1), (1, 1), (1, 1), 1, "relu")
    assert conv_gemm.choice_for_cupy(cupy_like(x, "float32"), cupy_like(w, "float32"), None,
                                     *other) is None


def test_a_raced_tuned_kernel_gives_its_launch_to_cupy_arrays_of_the_problem(monkeypatch):
    """``tuned_launch_for_cupy``: the kernel and geometry of the tuned CUTLASS kernel
    raced for a problem, won or not (a CUDA graph may record it where it is cheaper
    there), for the CuPy arrays of that problem (a channels-last input viewed channels
    first); nothing where its call is more than the launch (an activation applied after
    it, a padded copy), where no tuned kernel ran in the race, or for another
    problem."""
    from types import SimpleNamespace

    from pyc_lab.kernels import conv_gemm

    def torch_like(a):
        return SimpleNamespace(device=SimpleNamespace(index=0), dtype="torch.float32",
                               shape=a.shape, stride=lambda: tuple(s // a.itemsize
                                                                   for s in a.strides))

    def cupy_like(a):
        return SimpleNamespace(device=SimpleNamespace(id=0), shape=a.shape,
                               strides=a.strides,
                               dtype=SimpleNamespace(name="float32", itemsize=a.itemsize))

    x = np.zeros((2, 9, 8, 16), np.float32).transpose(0, 3, 1, 2)  # channels last
    w = np.zeros((32, 16, 3, 3), np.float32)
    geo = ((1, 1), (1, 1), (1, 1), 1, "relu")
    monkeypatch.setattr(conv_gemm, "_CHOICES", {})
    monkeypatch.setattr(conv_gemm, "_RUNNERS", {})
    key = conv_gemm._signature(torch_like(x), torch_like(w), None, *geo)

    def runner(x, w, b):
        return None

    runner.launch = ("kernel", "geometry")
    conv_gemm._remember(key, {"impl": "cutlass", "cudnn_ms": 1.0, "cutlass_ms": 0.5,
                              "cutlass_gpu_ms": 0.5})
    conv_gemm._RUNNERS[key] = runner
    launch = conv_gemm.tuned_launch_for_cupy(cupy_like(x), cupy_like(w), None, *geo)
    assert launch == ("kernel", "geometry")
    assert conv_gemm.tuned_launch_for_cupy(cupy_like(x), cupy_like(w), None,
                                           *geo[:-1], None) is None  # another problem
    runner.launch = None  # a padded copy or a guard around the launch
    assert conv_gemm.tuned_launch_for_cupy(cupy_like(x), cupy_like(w), None, *geo) is None
    conv_gemm._RUNNERS[key] = conv_gemm._then(runner, "relu")  # the activation after it
    assert conv_gemm.tuned_launch_for_cupy(cupy_like(x), cupy_like(w), None, *geo) is None
    runner.launch = ("kernel", "geometry")
    conv_gemm._RUNNERS[key] = runner
    conv_gemm._remember(key, {"impl": "cudnn", "cudnn_ms": 0.4, "cutlass_ms": 0.5,
                              "cutlass_gpu_ms": 0.3})  # raced, lost
    assert conv_gemm.tuned_launch_for_cupy(cupy_like(x), cupy_like(w), None,
                                           *geo) == ("kernel", "geometry")
    conv_gemm._remember(key, {"impl": "cudnn", "cudnn_ms": 1.0})  # no tuned kernel raced
    assert conv_gemm.tuned_launch_for_cupy(cupy_like(x), cupy_like(w), None, *geo) is None


def test_a_race_keeps_the_cheapest_candidate_that_beats_the_library(monkeypatch):
    """A candidate cheaper per call but slower on the GPU than cuDNN is not kept, and
    does not hide a dearer one that beats cuDNN on both counts (measured so on the
    ResNet-50's 256 -> 64 1x1 layer at batch 1: the direct kernel 0.037 ms a call but
    slower on the GPU, the tuned kernel 0.040 ms and a third of cuDNN's GPU time)."""
    from types import SimpleNamespace

    from pyc_lab.kernels import conv_gemm

    monkeypatch.setattr(conv_gemm, "_CHOICES", {})
    monkeypatch.setattr(conv_gemm, "_RUNNERS", {})
    monkeypatch.setattr(conv_gemm, "timing_refused", lambda device: None)
    monkeypatch.setattr(conv_gemm, "_gemm_runner", lambda *a: (lambda x, w, b: None))
    timings = {"cudnn": (0.0746, 0.0301, 0.0746), "gemm": (0.0370, 0.0350, 0.0370),
               "cutlass": (0.0399, 0.0105, 0.0399)}
    monkeypatch.setattr(conv_gemm, "time_calls",
                        lambda runs, device: list(timings.values())[:len(runs)])
    x = SimpleNamespace(device=SimpleNamespace(index=0))

    def tuned(x, w, b):
        return None

    choice = conv_gemm._race(("k",), x, None, None, (1, 1), (0, 0), (1, 1), 1,
                             gemm_ok=True, tuned=tuned)
    assert choice["impl"] == "cutlass" and conv_gemm._RUNNERS[("k",)] is tuned
    timings["cutlass"] = (0.0399, 0.0400, 0.0399)  # now slower on the GPU too
    choice = conv_gemm._race(("k2",), x, None, None, (1, 1), (0, 0), (1, 1), 1,
                             gemm_ok=True, tuned=tuned)
    assert choice["impl"] == "cudnn" and choice["cutlass_gpu_ms"] == 0.0400
    assert conv_gemm._RUNNERS[("k2",)] is tuned  # a graph may still record it


def test_a_graph_records_the_direct_kernel_where_it_beats_the_winner_on_the_gpu():
    """In a CUDA graph the direct kernel costs its GPU time; the library that won the
    race runs between graphs for its GPU time plus the host's time to issue it."""
    from pyc_lab.kernels.conv_gemm import MARGIN, records_direct

    won = {"impl": "direct", "cudnn_ms": 0.05, "direct_ms": 0.02, "direct_gpu_ms": 0.01}
    assert records_direct(won)
    # cuDNN kept (its GPU time was lower) but its call costs more between graphs
    host_bound = {"impl": "cudnn", "cudnn_ms": 0.047, "cudnn_gpu_ms": 0.005,
                  "cudnn_host_ms": 0.047, "direct_ms": 0.025, "direct_gpu_ms": 0.006}
    assert records_direct(host_bound)
    level = {"impl": "cudnn", "cudnn_ms": 0.0535, "cudnn_gpu_ms": 0.0535,
             "cudnn_host_ms": 0.02, "direct_ms": 0.053, "direct_gpu_ms": 0.053}
    assert records_direct(level)  # level on the GPU: the graph saves the host's call
    gpu_bound = {"impl": "cudnn", "cudnn_ms": 0.089, "cudnn_gpu_ms": 0.089,
                 "cudnn_host_ms": 0.02, "direct_ms": 0.115, "direct_gpu_ms": 0.115}
    assert not records_direct(gpu_bound)
    edge = {"impl": "gemm", "gemm_ms": 0.1, "gemm_gpu_ms": 0.08, "gemm_host_ms": 0.02,
            "cudnn_ms": 0.2, "direct_gpu_ms": 0.1 * (1 - MARGIN) * 1.001}
    assert not records_direct(edge)
    assert not records_direct({"impl": "cudnn", "cudnn_ms": 0.1})  # not raced with it


def test_a_graph_records_the_form_cheapest_in_a_graph():
    """``graph_choice`` over several recordable forms: each costs its GPU time in a
    graph, a winner that cannot be recorded its GPU time plus its host time; the
    winner is kept unless another form is at least MARGIN cheaper so counted (measured
    on the ResNet-50's 2048 -> 512 1x1 layer at batch 1, channels last: the GEMM form
    won at 0.034 ms a call, 0.024 ms of it on the GPU, but ran between graphs; the tuned
    kernel, 0.045 ms on the GPU, costs less in the graph)."""
    from pyc_lab.kernels.conv_gemm import MARGIN, graph_choice

    gemm_won = {"impl": "gemm", "gemm_ms": 0.0341, "gemm_gpu_ms": 0.0244,
                "gemm_host_ms": 0.0341, "cudnn_ms": 0.0628, "cudnn_gpu_ms": 0.0628,
                "cudnn_host_ms": 0.03, "cutlass_ms": 0.0452, "cutlass_gpu_ms": 0.0452,
                "cutlass_host_ms": 0.02}
    assert graph_choice(gemm_won, ("direct", "cutlass")) == "cutlass"
    assert graph_choice(gemm_won, ("direct",)) is None  # raced without it: between graphs
    assert graph_choice(gemm_won, ("gemm", "cutlass")) == "gemm"  # the winner, recorded
    both = {**gemm_won, "direct_ms": 0.05, "direct_gpu_ms": 0.040, "direct_host_ms": 0.05}
    assert graph_choice(both, ("direct", "cutlass")) == "direct"  # the cheapest of the two
    cutlass_won = {**both, "impl": "cutlass", "direct_gpu_ms": 0.0452 * (1 - MARGIN) * 1.01}
    assert graph_choice(cutlass_won, ("direct", "cutlass")) == "cutlass"  # not MARGIN less
    assert graph_choice({"impl": "direct", "cudnn_ms": 0.1}, ("direct",)) == "direct"
    assert graph_choice({"impl": "cudnn", "cudnn_ms": 0.1}, ("direct", "cutlass")) is None


def test_a_race_that_cannot_run_leaves_the_convolution_to_im2col(monkeypatch, caplog):
    """``direct_in_graph`` says no, with a warning, where the race cannot run (here:
    told a GPU and torch are there, CuPy's first device call fails)."""
    pytest.importorskip("cupy")
    from pyc_lab.hardware import device
    from pyc_lab.kernels import arrays
    from pyc_lab.kernels import conv as kconv

    assert not kconv.direct_in_graph((1, 4, 32), (32, 4, 3), "float32", stride=(1,),
                                     padding=(0,), dilation=(1,))  # no GPU: not tried
    monkeypatch.setattr(arrays, "torch_installed", lambda: True)
    monkeypatch.setattr(device, "no_gpu_reason", lambda *a, **k: None)
    with caplog.at_level("WARNING", logger="pyc_lab.kernels.conv"):
        assert not kconv.direct_in_graph((1, 4, 32), (32, 4, 3), "float32", stride=(1,),
                                         padding=(0,), dilation=(1,))
    assert "not raced" in caplog.text
