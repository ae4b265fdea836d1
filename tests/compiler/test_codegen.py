"""The CUDA code generator on the CPU: supports() reasons, deterministic sources, layouts,
literals, and every representative source compiled by ``nvcc -ptx -arch=sm_90``.

No GPU is needed; the nvcc checks (marked ``nvcc``) skip, with the reason, where the CUDA
toolkit is missing. The same
kernels are run against NumPy on a GPU by ``test_cupy_backend_gpu.py``.
"""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyc_lab.compiler import Graph
from pyc_lab.compiler.codegen import KernelSource, generate, generate_epilogue, supports
from pyc_lab.compiler.codegen import cuda_types as ct
from pyc_lab.compiler.codegen.elementwise_loops import layout
from pyc_lab.compiler.codegen.reduction import row_config
from pyc_lab.errors import PycLabError
from pyc_lab.kernels.cutlass.nvcc import nvcc_path
from tests.compiler.graphs import fused_graph, op_graph

#: nvcc -ptx checks run where the CUDA toolkit is (tests/conftest.py skips them elsewhere).
needs_nvcc = pytest.mark.nvcc


def _have_nvcc() -> bool:
    try:
        nvcc_path()
    except PycLabError:
        return False
    return True


def compile_ptx(tmp_path: Path, src: KernelSource, cubin: bool = False) -> str:
    """Compile ``src`` with nvcc for sm_90; the PTX text (or "" for a cubin)."""
    cu = tmp_path / f"{src.name}.cu"
    cu.write_text(src.source)
    out = tmp_path / (f"{src.name}.cubin" if cubin else f"{src.name}.ptx")
    cmd = [nvcc_path(), "-arch=sm_90", "-std=c++17", "-cubin" if cubin else "-ptx", str(cu),
           "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, f"nvcc failed on {src.name}:\n{res.stderr}\n{src.source}"
    return "" if cubin else out.read_text()


F32, F16, F64 = np.float32, np.float16, np.float64
I32, I64, BOOL = np.int32, np.int64, np.bool_


def _mix(x, y):
    return np.tanh(x * 2.0 + y) - np.maximum(x, y) / (1 + np.exp(-y))


# Representative elementwise nodes: (id, fn, specs)
ELEMENTWISE = [
    ("f32_same", _mix, [((64, 1000), F32), ((64, 1000), F32)]),
    ("f16_same_tail", _mix, [((1003,), F16), ((1003,), F16)]),
    ("f64_same", _mix, [((37, 129), F64), ((37, 129), F64)]),
    ("f32_row_bias", lambda x, b: np.maximum(x + b, 0.0), [((64, 1000), F32), ((1000,), F32)]),
    ("f16_row_bias_f32", lambda x, b: x * b, [((8, 24), F16), ((24,), F32)]),
    ("f32_col", lambda x, c: x - c, [((33, 17), F32), ((33, 1), F32)]),
    ("f32_3d", lambda x, y: x * y, [((4, 1, 33), F32), ((1, 17, 33), F32)]),
    ("f32_scalar", lambda x, s: x / s, [((1001,), F32), ((), F32)]),
    ("where_cmp", lambda x, y: np.where(x > y, x, -y), [((50, 7), F32), ((50, 7), F32)]),
    ("astype_i32", lambda x: (x * 100.0).astype(np.int32), [((77,), F32)]),
    ("int_ops", lambda a, b: (a + b) * a - np.abs(b) + a ** 2, [((9, 5), I32), ((5,), I32)]),
    ("int64_div", lambda a, b: a / b, [((300,), I64), ((300,), I64)]),
    ("bool_logic", lambda a, b: np.where(a, b, 0.5) > 0.2, [((40,), BOOL), ((40,), F64)]),
    ("f16_to_f64", lambda x, y: x.astype(np.float64) * y, [((31,), F16), ((31,), F64)]),
    ("int_to_f16", lambda a, b, c: a.astype(np.float16) + b.astype(np.float16)
     + c.astype(np.float16), [((19,), I32), ((19,), I64), ((19,), BOOL)]),
    ("unary_zoo", lambda x: np.sqrt(np.abs(x)) + np.log(np.abs(x) + 1.0) + 1 / np.sqrt(
        np.abs(x) + 1.0), [((257,), F32)]),
    ("nan_consts", lambda x: np.minimum(np.maximum(x, -np.inf), np.inf) + np.float32(np.nan),
     [((12,), F32)]),
    ("single_element", lambda x, y: x + y, [((1, 1), F32), ((), F32)]),
]


@pytest.mark.parametrize("case", ELEMENTWISE, ids=[c[0] for c in ELEMENTWISE])
def test_elementwise_sources_are_supported_and_deterministic(case):
    _, fn, specs = case
    g1, n1 = fused_graph(fn, specs)
    g2, n2 = fused_graph(fn, specs)
    assert supports(n1, g1) == (True, "")
    s1, s2 = generate(n1, g1), generate(n2, g2)
    assert s1.source == s2.source  # same node, same text
    assert generate(n1, g1).source == s1.source
    assert s1.name == "fused_0" and s1.kind == "elementwise"
    assert 'extern "C" __global__' in s1.source
    assert "i += stride" in s1.source  # grid-stride loop
    assert s1.entries[0] == "fused_0"
    assert s1.ops == n1.attrs["ops"]


@needs_nvcc
@pytest.mark.parametrize("case", ELEMENTWISE, ids=[c[0] for c in ELEMENTWISE])
def test_elementwise_sources_compile(tmp_path, case):
    _, fn, specs = case
    g, node = fused_graph(fn, specs)
    ptx = compile_ptx(tmp_path, generate(node, g))
    assert ".entry fused_0(" in ptx


def test_vectorised_variant_of_same_shape_float32():
    g, node = fused_graph(_mix, [((64, 1000), F32), ((64, 1000), F32)])
    src = generate(node, g)
    assert src.entries == ("fused_0", "fused_0_vec")
    assert "pyc_vec<float, 4>" in src.source
    assert "iv += stride" in src.source
    assert src.launch["vec"] == 4 and src.launch["n_vec"] == 16000
    assert src.launch["align_bytes"] == {"out": 16, "in0": 16, "in1": 16}
    assert "the last" not in src.source  # 64000 % 4 == 0: no tail loop


def test_vectorised_float16_moves_eight_halves_and_has_a_tail():
    g, node = fused_graph(_mix, [((1003,), F16), ((1003,), F16)])
    src = generate(node, g)
    assert "pyc_vec<pyc_f16, 8>" in src.source
    assert src.launch["vec"] == 8 and src.launch["n_vec"] == 125
    assert "the last 3 element(s)" in src.source  # scalar tail
    assert "pyc_round_f16" in src.source  # every float16 op rounds like NumPy


def test_row_broadcast_is_vectorised_with_scalar_loads_for_broadcast_inputs():
    g, node = fused_graph(lambda x, b, s: x * b + s,
                          [((64, 1000), F32), ((1000,), F32), ((64, 1), F32)])
    src = generate(node, g)
    assert src.launch["vec"] == 4
    assert src.launch["aligned_inputs"] == [0, 1]  # the column input is read as scalars
    assert "(i % 1000u)" in src.source
    assert "the same for the whole vector" in src.source


def test_no_vector_path_when_rows_do_not_split_into_vectors():
    g, node = fused_graph(lambda x, b: x + b, [((5, 7), F32), ((7,), F32)])
    src = generate(node, g)
    assert src.entries == ("fused_0",) and src.launch["vec"] == 0
    assert "_vec" not in src.source


@needs_nvcc
def test_vector_loads_are_16_byte_ptx_loads(tmp_path):
    g, node = fused_graph(_mix, [((4096,), F32), ((4096,), F32)])
    ptx = compile_ptx(tmp_path, generate(node, g))
    vec_part = ptx[ptx.index(".entry fused_0_vec("):]
    assert re.search(r"ld\.global(\.nc)?\.v4\.f32", vec_part)
    assert re.search(r"st\.global\.v4\.f32", vec_part)
    g, node = fused_graph(_mix, [((4096,), F16), ((4096,), F16)])
    ptx = compile_ptx(tmp_path, generate(node, g))
    vec_part = ptx[ptx.index(".entry fused_0_vec("):]
    assert re.search(r"ld\.global(\.nc)?\.v4\.(u32|b32)", vec_part)


@needs_nvcc
def test_float16_inline_asm_assembles_for_sm90(tmp_path):
    # -cubin runs ptxas too: the cvt.*.f16 instructions of the helpers must assemble.
    g, node = fused_graph(lambda x, y: x.astype(np.float16) * y,
                          [((100,), F64), ((100,), F16)])
    compile_ptx(tmp_path, generate(node, g), cubin=True)
    g, node = op_graph("softmax", [((10, 2000), F16)], {"axis": -1})
    compile_ptx(tmp_path, generate(node, g), cubin=True)


@needs_nvcc
def test_float_max_is_one_nan_propagating_instruction(tmp_path):
    # native/reduce.cuh: on sm_80+ a float max/min is max.NaN/min.NaN, not the generic
    # two NaN tests, compare and select (which made the float16 row kernels issue-bound)
    for op in ("softmax", "max", "min"):
        attrs = {"axis": -1} if op == "softmax" else {"axis": (1,)}
        g, node = op_graph(op, [((10, 2000), F16)], attrs)
        ptx = compile_ptx(tmp_path, generate(node, g))
        assert ("min.NaN.f32" if op == "min" else "max.NaN.f32") in ptx, op


@needs_nvcc
def test_exp_of_16_bit_results_is_the_fast_intrinsic(tmp_path):
    # cuda_types.exp_function: float16 and bfloat16 results take __expf (ex2.approx,
    # bound in its docstring); float32 and float64 keep the accurate exp
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    for dtype, fast in ((F16, True), (bf16, True), (F32, False), (np.float64, False)):
        g, node = op_graph("exp", [((1000,), dtype)])
        src = generate(node, g).source
        assert ("__expf(" in src) == fast, dtype
        assert ct.exp_function(dtype) == ("__expf" if fast else "exp")
    for dtype, fast in ((F16, True), (F32, False)):
        g, node = op_graph("softmax", [((10, 2000), dtype)], {"axis": -1})
        src = generate(node, g).source
        assert ("__expf(" in src) == fast, dtype
        ptx = compile_ptx(tmp_path, generate(node, g))
        assert ("ex2.approx.ftz.f32" in ptx or "ex2.approx.f32" in ptx) or not fast
    # bfloat16 results round in one cvt.rn.bf16x2.f32 on sm_80+ (native/bf16.cuh)
    g, node = op_graph("exp", [((1000,), bf16)])
    assert "cvt.rn.bf16x2.f32" in compile_ptx(tmp_path, generate(node, g))


def test_single_elementwise_op_is_generated_like_a_fused_one():
    g, node = op_graph("add", [((10, 4), F32), ((4,), F32)])
    assert supports(node, g) == (True, "")
    src = generate(node, g)
    assert src.name == f"add_{node.id}" and src.ops == ("add",)


def test_kernel_names_are_c_identifiers():
    g, node = fused_graph(lambda x: x + 1.0, [((4,), F32)], name="fused-3.x")
    assert generate(node, g).name == "fused_3_x"


# -- layouts -------------------------------------------------------------------------------
@pytest.mark.parametrize("out_shape, in_shapes, dims, strides", [
    ((64, 1000), [(64, 1000)], [64000], [[1]]),
    ((64, 1000), [(1000,)], [64, 1000], [[0, 1]]),
    ((64, 1000), [(64, 1)], [64, 1000], [[1, 0]]),
    ((4, 17, 33), [(4, 1, 33), (1, 17, 33)], [4, 17, 33], [[33, 0, 1], [0, 33, 1]]),
    ((2, 3, 4), [(2, 3, 4), ()], [24], [[1], [0]]),
    ((1, 1), [(1, 1)], [1], [[0]]),
    ((8, 1, 5), [(8, 1, 5)], [40], [[1]]),
    ((6, 5, 4), [(5, 4)], [6, 20], [[0, 1]]),
])
def test_layout_collapses_dims(out_shape, in_shapes, dims, strides):
    got_dims, out_str, in_str = layout(out_shape, in_shapes)
    assert got_dims == dims
    assert in_str == strides
    n = math.prod(dims)
    assert n == math.prod(out_shape)
    # the output walks its collapsed dims contiguously
    assert out_str[-1] == 1 or n == 1


# -- row kernels ---------------------------------------------------------------------------
ROWS = [
    ("softmax_warp_f32", "softmax", [((33, 1000), F32)], {"axis": -1}),
    ("softmax_block_f16", "softmax", [((16, 3000), F16)], {"axis": 1}),
    ("softmax_long_f64", "softmax", [((3, 20000), F64)], {"axis": -1}),
    ("softmax_int", "softmax", [((5, 7), I32)], {"axis": -1}),
    ("layer_norm_plain", "layer_norm", [((64, 768), F32)], {"eps": 1e-5}),
    ("layer_norm_affine_f16", "layer_norm", [((8, 4096), F16), ((4096,), F16),
                                             ((4096,), F16)], {"eps": 1e-5}),
    ("layer_norm_gamma_f32", "layer_norm", [((8, 5000), F16), ((5000,), F32)], {"eps": 1e-3}),
    ("layer_norm_scalar_gamma", "layer_norm", [((2, 3, 9), F64), ((), F64), ((9,), F64)],
     {"eps": 1e-6}),
    ("sum_f32", "sum", [((128, 513), F32)], {"axis": (1,), "keepdims": False}),
    ("sum_int32", "sum", [((10, 70000), I32)], {"axis": (1,), "keepdims": True}),
    ("sum_bool", "sum", [((10, 33), BOOL)], {"axis": (1,), "keepdims": False}),
    ("mean_f16", "mean", [((7, 2048), F16)], {"axis": (1,), "keepdims": False}),
    ("mean_int", "mean", [((7, 20), I64)], {"axis": (1,), "keepdims": False}),
    ("max_f32", "max", [((9, 100), F32)], {"axis": (1,), "keepdims": True}),
    ("min_f64_long", "min", [((2, 40000), F64)], {"axis": (1,), "keepdims": False}),
    ("max_bool", "max", [((6, 10), BOOL)], {"axis": (1,), "keepdims": False}),
    ("min_int64", "min", [((6, 10), I64)], {"axis": (1,), "keepdims": False}),
    ("var_f32", "var", [((12, 3000), F32)], {"axis": (1,), "keepdims": False}),
    ("var_1d_axis_none", "var", [((1000,), F16)], {"axis": None, "keepdims": False}),
    # vectorised entries (rows a multiple of the vector width, cached in registers)
    ("softmax_vec_f16_8192", "softmax", [((4, 8192), F16)], {"axis": -1}),
    ("layer_norm_vec_f16_8192", "layer_norm", [((4, 8192), F16), ((8192,), F16),
                                               ((8192,), F16)], {"eps": 1e-5}),
    ("layer_norm_vec_guarded", "layer_norm", [((4, 1000), F32), ((), F32), ((1000,), F32)],
     {"eps": 1e-5}),
    ("sum_vec_f32_768", "sum", [((5, 768), F32)], {"axis": (1,), "keepdims": False}),
]


@pytest.mark.parametrize("case", ROWS, ids=[c[0] for c in ROWS])
def test_row_sources_are_supported_and_deterministic(case):
    _, op, specs, attrs = case
    g1, n1 = op_graph(op, specs, attrs)
    g2, n2 = op_graph(op, specs, attrs)
    assert supports(n1, g1) == (True, "")
    s1, s2 = generate(n1, g1), generate(n2, g2)
    assert s1.source == s2.source
    assert s1.kind == "rows"
    assert "__shfl_xor_sync" in s1.source
    assert "row += " in s1.source  # grid-stride over rows


@needs_nvcc
@pytest.mark.parametrize("case", ROWS, ids=[c[0] for c in ROWS])
def test_row_sources_compile(tmp_path, case):
    _, op, specs, attrs = case
    g, node = op_graph(op, specs, attrs)
    src = generate(node, g)
    ptx = compile_ptx(tmp_path, src)
    assert f".entry {src.name}(" in ptx
    assert "shfl.sync.bfly" in ptx


@pytest.mark.parametrize(("specs", "op", "vec"), [
    ([((4, 8192), F16)], "softmax", 8),
    ([((4, 1024), F32)], "softmax", 4),
    ([((4, 8192), F16), ((8192,), F32)], "layer_norm", 4),  # the widest array sets it
    ([((4, 8190), F16)], "softmax", 0),  # 8190 is no multiple of 8
    ([((4, 20000), F32)], "softmax", 0),  # not cached in registers
    ([((4, 1000), F64)], "softmax", 0),  # doubles: 32 a thread is too many to cache
    ([((4, 256), F64)], "softmax", 2),
])
def test_row_vector_width(specs, op, vec):
    attrs = {"axis": -1} if op == "softmax" else {"eps": 1e-5}
    g, node = op_graph(op, specs, attrs)
    src = generate(node, g)
    assert src.launch["vec"] == vec
    if vec:
        assert src.entries == (src.name, f"{src.name}_vec")
        assert src.launch["vec_kernel"] == f"{src.name}_vec"
        assert src.launch["align_bytes"]["in0"] == vec * np.dtype(specs[0][1]).itemsize
        assert "out" in src.launch["align_bytes"]
        assert "pyc_vec<" in src.source
    else:
        assert src.entries == (src.name,) and src.launch["vec_kernel"] is None


@needs_nvcc
def test_vectorised_row_kernel_uses_16_byte_loads_and_stores(tmp_path):
    g, node = op_graph("layer_norm", [((4, 8192), F16), ((8192,), F16), ((8192,), F16)],
                       {"eps": 1e-5})
    src = generate(node, g)
    ptx = compile_ptx(tmp_path, src)
    vec_part = ptx[ptx.index(f".entry {src.name}_vec("):]
    assert "ld.global.nc.v4.u32" in vec_part or "ld.global.v4.u32" in vec_part \
        or "ld.global.nc.v4.b32" in vec_part or "ld.global.v4.b32" in vec_part
    assert "st.global.v4" in vec_part


def test_row_configs():
    assert row_config(1000)["mode"] == "warp"
    assert row_config(1000)["cached"] and row_config(1000)["per_thread"] == 32
    cfg = row_config(3000)
    assert cfg["mode"] == "block" and cfg["block"] == 256 and cfg["cached"]
    assert row_config(6000)["block"] == 512
    long = row_config(20000)
    assert long["block"] == 1024 and not long["cached"]
    assert not row_config(16000, 8)["cached"]  # doubles: fewer values in registers


def test_softmax_is_stable_and_layer_norm_two_pass():
    g, node = op_graph("softmax", [((16, 3000), F32)], {"axis": -1})
    src = generate(node, g).source
    assert "pyc_max_op" in src and "exp(v[k] - m)" in src
    assert "smem" in src and "kept in registers" in src
    g, node = op_graph("softmax", [((3, 20000), F32)], {"axis": -1})
    assert "re-read on each pass" in generate(node, g).source
    g, node = op_graph("layer_norm", [((8, 512), F32)], {"eps": 1e-5})
    src = generate(node, g).source
    assert "mean" in src and "denom = (sqrt(" in src
    assert "9.999999747378752e-06f" in src  # eps as the float32 NumPy would add


# -- epilogues -----------------------------------------------------------------------------
@pytest.mark.parametrize(("act", "bias_shape"), [
    (act, bias) for bias in (None, (48,), (1, 48))
    for act in (None, "relu", "gelu", "sigmoid", "silu", "tanh") if act or bias])
def test_epilogue_sources(tmp_path, act, bias_shape):
    specs = [((32, 64), F32), ((64, 48), F32)] + ([(bias_shape, F32)] if bias_shape else [])
    g, node = op_graph("matmul", specs, {"activation": act} if act else {})
    assert supports(node, g) == (True, "")
    src = generate_epilogue(node, g)
    assert src.kind == "epilogue" and src.launch["inplace"]
    assert "__restrict__" not in src.source  # out is in0's memory
    assert src.source == generate_epilogue(node, g).source
    if _have_nvcc():
        compile_ptx(tmp_path, src)


def test_epilogue_without_graph_and_non_inplace_product():
    g, node = op_graph("matmul", [((4, 8), I32), ((8, 16), I32), ((16,), F32)],
                       {"activation": "gelu"})
    src = generate_epilogue(node, g)
    assert node.dtype == np.float64
    assert not src.launch["inplace"] and "__restrict__" in src.source
    alone = generate_epilogue(node, product_dtype=np.int32, bias_shape=(16,),
                              bias_dtype=np.float32)
    assert alone.source == src.source
    with pytest.raises(ValueError, match="pass the graph"):
        generate_epilogue(node)


def test_epilogue_refuses_a_plain_matmul():
    g, node = op_graph("matmul", [((4, 8), F32), ((8, 16), F32)])
    assert supports(node, g) == (True, "")
    with pytest.raises(ValueError, match="no epilogue"):
        generate_epilogue(node, g)


# -- supports() reasons ----------------------------------------------------------------------
def test_softmax_over_a_non_last_axis_is_not_generated():
    g, node = op_graph("softmax", [((8, 16), F32)], {"axis": 0})
    ok, why = supports(node, g)
    assert not ok
    assert why == "softmax over a non-last axis is not generated; runs through CuPy"
    with pytest.raises(ValueError, match="non-last axis"):
        generate(node, g)


@pytest.mark.parametrize("axis", [None, (0, 1)])
def test_reductions_over_the_last_axes_together_are_one_row(axis):
    # (over axis 0 alone it is a column kernel: tests/compiler/test_column_reduction.py;
    # over axes apart it runs through CuPy, saying so: the same file)
    g, node = op_graph("sum", [((8, 16), F32)], {"axis": axis, "keepdims": False})
    assert supports(node, g) == (True, "")
    src = generate(node, g)
    assert (src.launch["rows"], src.launch["cols"]) == (1, 128)


def test_unsupported_dtypes_are_named():
    g, node = fused_graph(lambda x: x + x, [((8,), np.uint8)])
    ok, why = supports(node, g)
    assert not ok and "uint8" in why
    g, node = op_graph("max", [((4, 4), np.int16)], {"axis": (1,), "keepdims": False})
    ok, why = supports(node, g)
    assert not ok and "int16" in why


def test_empty_reduction_axis_is_not_generated():
    g, node = op_graph("sum", [((4, 0), F32)], {"axis": (1,), "keepdims": False})
    ok, why = supports(node, g)
    assert not ok and "empty last axis" in why


def test_non_scalar_constant_in_a_body_is_not_generated():
    g, node = fused_graph(lambda x: x + np.arange(4, dtype=np.float32), [((3, 4), F32)])
    ok, why = supports(node, g)
    assert not ok and "non-scalar constant" in why


def test_other_ops_are_not_generated():
    g, node = op_graph("transpose", [((3, 4), F32)], {"axes": (1, 0)})
    ok, why = supports(node, g)
    assert not ok and "transpose (shape) has no generated kernel" in why


def test_bad_layer_norm_scale_is_not_generated():
    g = Graph()
    x = g.add("input", shape=(4, 8), dtype=F32)
    gamma = g.add("input", shape=(1, 8), dtype=F32)
    node = g.add("layer_norm", [x.id, gamma.id], {"eps": 1e-5}, shape=(4, 8), dtype=F32)
    ok, why = supports(node, g)
    assert not ok and "scale/shift" in why


def test_fused_body_mismatch_is_reported():
    _, node = fused_graph(lambda x: x * 2.0, [((4, 4), F32)])
    g2 = Graph()
    other = g2.add("input", shape=(4, 4), dtype=F64)
    bad = g2.add("fused", [other.id], dict(node.attrs), shape=(4, 4), dtype=F32)
    ok, why = supports(bad, g2)
    assert not ok and "body input 0" in why


# -- literals and types ----------------------------------------------------------------------
@pytest.mark.parametrize("value, dtype, text", [
    (0.1, F32, "0.10000000149011612f"),
    (0.1, F64, "0.1"),
    (2, F32, "2.0f"),
    (np.inf, F32, "__int_as_float(0x7f800000)"),
    (-np.inf, F64, "(-__longlong_as_double(0x7ff0000000000000LL))"),
    (np.nan, F16, "__int_as_float(0x7fc00000)"),
    (1e-5, F16, "1.0013580322265625e-05f"),
    (-(2**31), I32, "(-2147483647 - 1)"),
    (-(2**63), I64, "(-9223372036854775807LL - 1)"),
    (7, I64, "7LL"),
    (True, BOOL, "true"),
])
def test_literals_are_exact(value, dtype, text):
    assert ct.literal(np.asarray(value, dtype=dtype)) == text


def test_float_literals_round_trip_through_the_c_parser_value():
    rng = np.random.default_rng()
    for v in rng.standard_normal(200).astype(np.float32) * 1e3:
        lit = ct.literal(np.asarray(v))
        assert np.float32(float(lit.rstrip("f"))) == v


def test_conversions_follow_numpy_casts():
    assert ct.convert("a", F16, F32) == "a"
    assert ct.convert("a", F32, F16) == "pyc_round_f16(static_cast<float>(a))"
    assert ct.convert("a", F64, F16) == "pyc_round_f16(static_cast<double>(a))"
    assert ct.convert("a", F32, I32) == "static_cast<int>(a)"
    assert ct.convert("a", I32, F64) == "static_cast<double>(a)"
    assert ct.storage_type(F16) == "pyc_f16" and ct.compute_type(F16) == "float"
    with pytest.raises(TypeError, match="uint8"):
        ct.storage_type(np.uint8)


# -- fixed helper text from native/ ----------------------------------------------------------
@pytest.mark.parametrize("section", sorted(ct.HELPER_FILES))
def test_helper_files_ship_in_native_and_are_listed(section):
    from pyc_lab.paths import native_dir

    name = ct.HELPER_FILES[section]
    assert (native_dir() / name).is_file()
    text = ct.helper(section)
    assert text.endswith("\n") and not text.endswith("\n\n")  # spliced as sections
    assert f"| `{name}` |" in (native_dir() / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("graph, sections", [
    (lambda: fused_graph(_mix, [((1003,), F16), ((1003,), F16)]), {"f16", "vec"}),
    (lambda: fused_graph(lambda a, b: np.abs(a) + a ** b, [((5, 7), I32), ((7,), I32)]),
     {"ipow", "abs"}),
    (lambda: fused_graph(lambda x: np.abs(x), [((7,), F64)]), {"abs", "vec"}),
    (lambda: op_graph("softmax", [((4, 8192), F16)], {"axis": -1}), {"f16", "vec", "reduce"}),
    (lambda: op_graph("sum", [((5, 7), F32)], {"axis": (1,), "keepdims": False}),
     {"reduce"}),
])
def test_sources_splice_exactly_the_helpers_they_need(graph, sections):
    g, node = graph()
    source = generate(node, g).source
    for section in ct.HELPER_FILES:
        assert (ct.helper(section) in source) == (section in sections), section


def test_bfloat16_elementwise_kernels_round_like_ml_dtypes_and_rows_say_why_not():
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    g, node = fused_graph(lambda x, y: np.tanh(x * y + 1), [((8, 64), bf16), ((64,), bf16)])
    assert supports(node, g) == (True, "")
    src = generate(node, g)
    assert "pyc_bf16" in src.source and "pyc_round_bf16" in src.source
    assert src.launch["vec"] == 8  # eight 2-byte elements a 16-byte access
    g2, soft = op_graph("softmax", [((8, 64), bf16)], {"axis": -1})
    ok, why = supports(soft, g2)
    assert not ok and "bfloat16" in why and "CuPy" in why


@needs_nvcc
def test_bfloat16_elementwise_source_compiles(tmp_path):
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    g, node = fused_graph(lambda x, y: (np.tanh(x * y + 1) > 0.5) * x,
                          [((8, 64), bf16), ((64,), np.float16)])
    compile_ptx(tmp_path, generate(node, g))
