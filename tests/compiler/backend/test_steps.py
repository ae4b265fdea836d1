"""Launch steps on the CPU, with NumPy standing in for CuPy: which kernel entry a launch
takes and on what grid, and where a cuBLAS step's product goes."""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from pyc_lab.compiler import Graph
from pyc_lab.compiler.backend.launch import launch_elementwise, launch_rows
from pyc_lab.compiler.backend.lowering import lower
from pyc_lab.compiler.codegen import generate
from pyc_lab.compiler.tracer import trace
from tests.compiler.graphs import fused_graph, op_graph

F16, F32 = np.float16, np.float32


class _Kernel:
    """Records its launches: (grid, block, args)."""

    def __init__(self) -> None:
        self.launches: list[tuple] = []

    def __call__(self, grid, block, args) -> None:
        self.launches.append((grid, block, args))


def _at(ptr: int) -> SimpleNamespace:
    """An array stand-in at device address ``ptr`` (all a launch looks at)."""
    return SimpleNamespace(data=SimpleNamespace(ptr=ptr))


def _kernels(src):
    return {e: _Kernel() for e in src.entries}


def test_elementwise_launch_takes_the_vector_entry_only_when_aligned():
    g, node = fused_graph(lambda x, y: x * y + 1.0, [((4096,), F32), ((4096,), F32)])
    src = generate(node, g)
    kernels = _kernels(src)
    assert launch_elementwise(2, kernels, src, [_at(0), _at(16)], _at(32)) == "fused_0_vec"
    (grid, block, _), = kernels["fused_0_vec"].launches
    assert block == (256,) and grid == (4,)  # 1024 vectors of 4, 256 threads a block
    assert launch_elementwise(2, kernels, src, [_at(0), _at(4)], _at(32)) == "fused_0"
    assert kernels["fused_0"].launches[-1][0] == (16,)
    # one thread per element, however few SMs (the loop strides only past 2**30 blocks)
    assert launch_elementwise(1, kernels, src, [_at(0), _at(4)], _at(32)) == "fused_0"
    assert kernels["fused_0"].launches[-1][0] == (16,)


def test_empty_elementwise_launches_nothing():
    g, node = fused_graph(lambda x: x + 1.0, [((0, 5), F32)])
    src = generate(node, g)
    kernels = _kernels(src)
    assert launch_elementwise(4, kernels, src, [_at(0)], _at(0)) is None
    assert not any(k.launches for k in kernels.values())


def test_row_launch_takes_the_vector_entry_only_when_aligned():
    g, node = op_graph("softmax", [((4, 8192), F16)], {"axis": -1})
    src = generate(node, g)
    vec = src.launch["vec_kernel"]
    assert vec is not None
    kernels = _kernels(src)
    assert launch_rows(132, kernels, src, [_at(0)], _at(4096)) == vec
    assert kernels[vec].launches[0][0] == (4,)  # a block per row
    assert launch_rows(132, kernels, src, [_at(2)], _at(4096)) == src.name


def test_row_launch_gives_every_row_group_its_own_block():
    g, node = op_graph("softmax", [((100000, 64), F32)], {"axis": -1})
    src = generate(node, g)
    kernels = _kernels(src)
    entry = launch_rows(2, kernels, src, [_at(1)], _at(4))  # misaligned: general entry
    rpb = src.launch["rows_per_block"]
    assert kernels[entry].launches[0][0] == (-(-100000 // rpb),)  # not capped at 2 SMs


class _Pool:
    """CuPy's ``empty`` stand-in: records the workspace sizes asked for."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, str]] = []

    def empty(self, n, dtype):
        self.asked.append((n, np.dtype(dtype).name))
        return _at(1 << 20)

    def zeros(self, n, dtype):
        self.asked.append((n, np.dtype(dtype).name))
        return np.zeros(n, dtype)


def test_column_launch_splits_tall_columns_and_combines_them_in_one_launch():
    from pyc_lab.compiler.backend.launch import INLINE_COMBINE_PARTS, ColumnLaunch

    g, node = op_graph("sum", [((16384, 4096), F16)], {"axis": (0,), "keepdims": False})
    src = generate(node, g)
    pool = _Pool()
    launch = ColumnLaunch(src, 132, pool)
    parts = launch.splits[src.launch["vec_kernel"]]
    assert 1 < parts <= INLINE_COMBINE_PARTS
    tiles = src.launch["config"]["tiles"]  # the scalar entry's, the most tiles
    assert pool.asked == [(max(launch.splits.values()) * 4096, "float32"), (tiles, "uint32")]
    kernels = _kernels(src)
    assert launch.launch(kernels, _at(0), _at(64)) == src.launch["vec_kernel"]
    (grid, block, args), = kernels[src.launch["vec_kernel"]].launches
    assert grid == (src.launch["vec_config"]["tiles"], parts) and block == (256,)
    assert int(args[3]) == -(-16384 // parts)  # rows per chunk
    assert args[4] is launch.arrivals  # the last chunk of a tile combines: no 2nd launch
    assert not kernels[src.launch["combine_kernel"]].launches


def test_column_launch_of_many_chunks_combines_them_in_a_second_kernel():
    from pyc_lab.compiler.backend.launch import INLINE_COMBINE_PARTS, ColumnLaunch

    g, node = op_graph("sum", [((1 << 20, 64), F32)], {"axis": (0,), "keepdims": False})
    src = generate(node, g)
    pool = _Pool()
    launch = ColumnLaunch(src, 132, pool)
    parts = launch.splits[src.launch["vec_kernel"]]
    assert parts > INLINE_COMBINE_PARTS and launch.arrivals is None
    kernels = _kernels(src)
    launch.launch(kernels, _at(0), _at(64))
    (grid, _, args), = kernels[src.launch["vec_kernel"]].launches
    assert grid[1] == parts and int(args[4]) == 0  # a null counter: no combining there
    (_, _, cargs), = kernels[src.launch["combine_kernel"]].launches
    assert int(cargs[2]) == parts


def test_column_launch_without_a_split_writes_the_output_directly():
    from pyc_lab.compiler.backend.launch import ColumnLaunch

    g, node = op_graph("max", [((64, 300, 4096), F32)], {"axis": (1,), "keepdims": False})
    src = generate(node, g)
    pool = _Pool()
    launch = ColumnLaunch(src, 132, pool)
    assert set(launch.splits.values()) == {1} and pool.asked == []
    kernels = _kernels(src)
    out = _at(64)
    assert launch.launch(kernels, _at(4), out) == src.name  # 4-byte aligned: scalar entry
    (grid, _, args), = kernels[src.name].launches
    assert grid[1] == 1 and args[2] is out
    assert not kernels[src.launch["combine_kernel"]].launches


class _RecordingNumpy:
    """NumPy as the executable's ``cp``, noting the keyword arguments of matmul calls."""

    def __init__(self) -> None:
        self.matmul_kwargs: list[dict] = []

    def matmul(self, a, b, **kwargs):
        self.matmul_kwargs.append(kwargs)
        return np.matmul(a, b, **kwargs)

    def __getattr__(self, name):
        return getattr(np, name)


class _FakeExecutable:
    """What a step reaches on the executable: the graph, ``cp`` and planned buffers."""

    def __init__(self, graph, buffer_bytes) -> None:
        self.graph = graph
        self._cp = _RecordingNumpy()
        self._sm_count = 1
        self._fallbacks: dict[int, str] = {}
        self._buffers = [np.zeros(n, np.uint8) for n in buffer_bytes]

    def _buffer_view(self, buf, node):  # with an address, as a CuPy array has
        return _ptr(self._buffers[buf][:node.nbytes].view(node.dtype).reshape(node.shape))


@pytest.fixture
def planned_matmul():
    """x @ w into planned buffer 0, then a fused kernel reading it (the output)."""
    g = Graph(name="mm")
    x = g.add("input", shape=(8, 16), dtype=F32)
    w = g.add("input", shape=(16, 32), dtype=F32)
    mm = g.add("matmul", [x.id, w.id], {})
    body, _ = trace(lambda v: v * 2.0, [np.zeros((8, 32), F32)])
    f = g.add("fused", [mm.id], {"body": body, "ops": ("multiply",), "name": "f"})
    g.outputs = [f.id]
    plan = SimpleNamespace(buffer_of={mm.id: 0}, buffer_bytes=[mm.nbytes], aliases={},
                           inplace=[])
    (step, _) = lower(g, {mm.id: "cublas", f.id: "fused_kernel"}, plan).steps
    assert type(step).__name__ == "_MatmulStep" and step.out_buffer == 0
    exe = _FakeExecutable(g, plan.buffer_bytes)
    step.prepare(exe)
    rng = np.random.default_rng()
    values = {x.id: rng.standard_normal((8, 16)).astype(F32),
              w.id: rng.standard_normal((16, 32)).astype(F32)}
    return step, exe, values, (x, w, mm)


def test_cublas_step_writes_a_fresh_product_not_the_planned_buffer(planned_matmul):
    step, exe, values, (x, w, mm) = planned_matmul
    step.run(exe, values)
    assert exe._cp.matmul_kwargs == [{}]  # no out=: cuBLAS allocates the product
    assert not np.shares_memory(values[mm.id], exe._buffers[0])
    np.testing.assert_allclose(values[mm.id], values[x.id] @ values[w.id], rtol=1e-6)


def test_cublas_static_call_recomputes_into_the_planned_buffer(planned_matmul):
    step, exe, values, (x, w, mm) = planned_matmul
    call = step.static_call(exe, values)  # for CUDA-graph replays: static memory
    assert np.shares_memory(values[mm.id], exe._buffers[0])
    assert np.shares_memory(step._planned_product(exe), exe._buffers[0])
    values[x.id][...] += 1.0  # replays see the static arrays' new data
    call()
    np.testing.assert_allclose(values[mm.id], values[x.id] @ values[w.id], rtol=1e-6)


class _PtrArray(np.ndarray):
    """A NumPy array with CuPy's ``.data.ptr`` (what the launchers check alignment on)."""

    @property
    def data(self):
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])


def _ptr(a):
    return np.ascontiguousarray(a).view(_PtrArray)


class _BodyKernel:
    """A stand-in for a generated elementwise kernel with several outputs: runs the body's
    NumPy reference on its inputs and writes each output into the array given for it."""

    def __init__(self, body, n_inputs) -> None:
        self.body, self.n_inputs, self.launches = body, n_inputs, 0

    def __call__(self, grid, block, args) -> None:
        from pyc_lab.compiler.ops import run_graph

        self.launches += 1
        ins, outs = args[:self.n_inputs], args[self.n_inputs:]
        results = run_graph(self.body, [np.asarray(a) for a in ins], np)
        assert len(outs) == len(results)
        for dst, value in zip(outs, results, strict=True):
            np.asarray(dst)[...] = value


def test_a_kernel_with_several_outputs_writes_its_extras_values():
    from pyc_lab.compiler.memory import plan_memory
    from pyc_lab.compiler.passes import PassManager

    def adam(p, g, m, v):
        m2 = np.float32(0.9) * m + np.float32(0.1) * g
        v2 = np.float32(0.999) * v + np.float32(0.001) * g * g
        return p - np.float32(1e-3) * m2 / (np.sqrt(v2) + np.float32(1e-8)), m2, v2

    rng = np.random.default_rng()
    args = [rng.standard_normal(96).astype(F32) for _ in range(3)]
    args.append(np.abs(rng.standard_normal(96)).astype(F32))
    graph, _ = trace(adam, tuple(args))
    graph = PassManager().run(graph).graph
    fused, e1, e2 = (n for n in graph if n.op not in ("input", "constant"))
    assert (fused.op, e1.op, e2.op) == ("fused", "fused_extra", "fused_extra")
    plan = plan_memory(graph, "balanced")
    steps = lower(graph, {fused.id: "fused_kernel", e1.id: "fused_kernel",
                          e2.id: "fused_kernel"}, plan).steps
    kernel_step, w1, w2 = steps
    assert [e for e, _ in kernel_step.extras] == [e1.id, e2.id]
    exe = _FakeExecutable(graph, plan.buffer_bytes)
    exe._buffer_view = lambda buf, node: _ptr(np.zeros(node.shape, node.dtype))
    exe._cp = SimpleNamespace(empty=lambda shape, dtype: _ptr(np.empty(shape, dtype)),
                              ascontiguousarray=np.ascontiguousarray)
    kernel_step.attach(exe)
    fake = _BodyKernel(fused.attrs["body"], len(fused.inputs))
    kernel_step.kernels = {e: fake for e in kernel_step.src.entries}
    values = {nid: _ptr(a) for nid, a in zip(graph.inputs, args, strict=True)}
    for step in steps:
        step.run(exe, values)
    assert fake.launches == 1  # one launch wrote all three
    want = adam(*args)
    for nid, w in zip((fused.id, e1.id, e2.id), want, strict=True):
        np.testing.assert_array_equal(np.asarray(values[nid]), w)
    assert type(w1).__name__ == type(w2).__name__ == "_WrittenStep"


@pytest.mark.parametrize("large", [False, True])
def test_a_convolution_step_computes_into_its_planned_buffer(monkeypatch, large):
    """A convolution between CUDA graphs writes its planned buffer: through its bound
    call for small operands, through ``bind`` (into the array it is given, no fresh
    result copied across) for large ones, where a library's call allocates nothing;
    the answer is ``pl.conv``'s."""
    from dataclasses import replace

    from pyc_lab.compiler.backend import steps as steps_mod
    from pyc_lab.compiler.conv_op import conv_reference
    from pyc_lab.compiler.memory import plan_memory
    from pyc_lab.compiler.ops import REGISTRY
    from tests.compiler.backend.test_lowering import _conv_graph

    into: list[tuple] = []

    def bind(xp, ins, attrs, out):
        def call():
            into.append(tuple(ins))
            out[...] = conv_reference(xp, ins, attrs)
        return call

    def bound(xp, ins, attrs):
        return lambda out: out.__setitem__(Ellipsis, conv_reference(xp, ins, attrs))

    monkeypatch.setitem(REGISTRY, "conv", replace(REGISTRY["conv"], bind=bind, bound=bound))
    if large:
        monkeypatch.setattr(steps_mod, "BOUND_INPUT_BYTES", 0)
    g, impl, (first, _), _ = _conv_graph()
    plan = plan_memory(g)
    step = next(st for st in lower(g, impl, plan).steps if st.node.id == first.id)
    exe = _FakeExecutable(g, plan.buffer_bytes)
    rng = np.random.default_rng()
    x, w = (_ptr(rng.standard_normal(g.node(i).shape).astype(F32)) for i in first.inputs)
    values = {first.inputs[0]: x, first.inputs[1]: w}
    step.run(exe, values)
    assert np.shares_memory(values[first.id], exe._buffers[step.out_buffer])
    assert len(into) == int(large)  # bind only where no bound call is kept
    step.run(exe, values)  # large operands: bound again, nothing of them kept between calls
    assert len(into) == 2 * int(large) and step._into is None


def test_a_convolution_bound_into_its_buffer_is_bound_once_per_placement(monkeypatch):
    """Without a bound call of its own (``pl.conv``'s op has none), a convolution with
    small operands is bound into its buffer once and the binding reused while the arrays
    stay where they are — by later calls and by a CUDA graph's capture (its static call);
    at new addresses it is bound again."""
    from dataclasses import replace

    from pyc_lab.compiler.conv_op import conv_reference
    from pyc_lab.compiler.memory import plan_memory
    from pyc_lab.compiler.ops import REGISTRY
    from tests.compiler.backend.test_lowering import _conv_graph

    made: list[int] = []

    def bind(xp, ins, attrs, out):
        made.append(1)

        def call():
            out[...] = conv_reference(xp, ins, attrs)
        return call

    monkeypatch.setitem(REGISTRY, "conv", replace(REGISTRY["conv"], bind=bind, bound=None))
    g, impl, (first, _), _ = _conv_graph()
    plan = plan_memory(g)
    step = next(st for st in lower(g, impl, plan).steps if st.node.id == first.id)
    exe = _FakeExecutable(g, plan.buffer_bytes)
    exe._cp = np
    rng = np.random.default_rng()
    x, w = (_ptr(rng.standard_normal(g.node(i).shape).astype(F32)) for i in first.inputs)
    values = {first.inputs[0]: x, first.inputs[1]: w}
    for _ in range(3):
        step.run(exe, values)
    replay = step.static_call(exe, values)
    assert len(made) == 1
    replay()
    np.testing.assert_allclose(values[first.id], conv_reference(np, [x, w], first.attrs),
                               rtol=1e-6, atol=1e-6)
    values[first.inputs[0]] = _ptr(np.array(x))  # another address
    step.run(exe, values)
    assert len(made) == 2
    np.testing.assert_allclose(values[first.id], conv_reference(np, [x, w], first.attrs),
                               rtol=1e-6, atol=1e-6)


class _CupyLike(np.ndarray):
    """A NumPy array whose type says it is CuPy's (what :func:`library_product` checks)."""


_CupyLike.__module__ = "cupy._core.core"


@pytest.fixture
def recorded_matmul(monkeypatch):
    """pl.matmul replaced by a recorder computing with NumPy."""
    from pyc_lab.kernels import matmul as matmul_module

    calls = []

    def fake(a, b, *, out=None, **kwargs):
        calls.append((a.dtype.name, a.shape, b.shape, out is not None))
        y = np.matmul(np.asarray(a), np.asarray(b))
        if out is None:
            return y
        out[...] = y
        return out

    monkeypatch.setattr(matmul_module, "matmul", fake)
    return calls


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16"])
def test_library_product_sends_float_matrices_to_pl_matmul(recorded_matmul, dtype):
    from pyc_lab.compiler.backend.gemm_operands import library_product

    rng = np.random.default_rng()
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    a = rng.uniform(0.5, 2.0, (5, 7)).astype(dt).view(_CupyLike)
    b = rng.uniform(0.5, 2.0, (7, 3)).astype(dt).view(_CupyLike).T.copy().T  # w.T
    cp = _RecordingNumpy()
    got = library_product(cp, a, b)
    assert recorded_matmul == [(dtype, (5, 7), (7, 3), False)] and cp.matmul_kwargs == []
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-2)
    out = np.full((5, 3), np.nan, dt).view(_CupyLike)
    assert library_product(cp, a, b, out=out) is out
    assert recorded_matmul[-1] == (dtype, (5, 7), (7, 3), True)
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=2e-2)


@pytest.mark.parametrize("case", ["integers", "mixed dtypes", "stack", "vector", "numpy"])
def test_library_product_leaves_other_operands_to_cupy_matmul(recorded_matmul, case):
    from pyc_lab.compiler.backend.gemm_operands import library_product

    rng = np.random.default_rng()
    a = rng.uniform(0.5, 2.0, (4, 6)).astype(F32)
    b = rng.uniform(0.5, 2.0, (6, 5)).astype(F32)
    if case == "integers":
        a, b = a.astype(np.int32), b.astype(np.int32)
    elif case == "mixed dtypes":
        b = b.astype(np.float16)
    elif case == "stack":
        a = np.stack([a, a + 1])
    elif case == "vector":
        b = b[:, 0].copy()
    if case != "numpy":
        a, b = a.view(_CupyLike), b.view(_CupyLike)
    cp = _RecordingNumpy()
    got = library_product(cp, a, b)
    assert recorded_matmul == [] and cp.matmul_kwargs == [{}]
    np.testing.assert_array_equal(np.asarray(got), np.matmul(np.asarray(a), np.asarray(b)))


def test_column_launch_combines_in_place_or_after_entry_by_entry():
    """The scalar entry of a (65536, 512) column sum splits into few chunks (combined by
    its last chunk), the vector entry into many (the _combine kernel): the counters are
    made for the one that uses them and a null goes to the other."""
    from pyc_lab.compiler.backend.launch import INLINE_COMBINE_PARTS, ColumnLaunch

    g, node = op_graph("sum", [((65536, 512), F32)], {"axis": (0,), "keepdims": False})
    src = generate(node, g)
    launch = ColumnLaunch(src, 132, _Pool())
    vec = src.launch["vec_kernel"]
    assert launch.splits[src.name] <= INLINE_COMBINE_PARTS < launch.splits[vec]
    assert launch.arrivals is not None
    kernels = _kernels(src)
    assert launch.launch(kernels, _at(4), _at(64)) == src.name  # misaligned: scalar entry
    (_, _, args), = kernels[src.name].launches
    assert args[4] is launch.arrivals and not kernels[src.launch["combine_kernel"]].launches
    assert launch.launch(kernels, _at(0), _at(64)) == vec
    (_, _, args), = kernels[vec].launches
    assert int(args[4]) == 0 and len(kernels[src.launch["combine_kernel"]].launches) == 1
