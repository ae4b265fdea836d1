"""``bound_attention`` on the GPU: the call made once for CuPy operands at fixed addresses
writes what ``pl.attention`` gives, against a float64 reference on fresh random inputs,
into outputs poisoned with NaN — every dtype, causal, boolean and additive masks, grouped
heads, CuPy's default and a side stream, repeated calls on changed contents; and a
compiled hand-written attention takes it from its second call on.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.errors import PycLabError
from pyc_lab.kernels.attention_bound import bound_attention
from tests.kernels.test_attention import reference
from tests.kernels.test_attention_gpu import TOL, _dtype, _rand

cp = pytest.importorskip("cupy")
pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


def _poisoned(shape, dtype):
    out = cp.empty(shape, dtype=dtype)
    out.view(cp.uint8).fill(255)  # NaN in every float dtype
    return out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masking", [None, "bool", "additive"])
def test_a_bound_call_matches_float64(dtype, causal, masking):
    rng = np.random.default_rng()
    dt = _dtype(dtype)
    q, k, v = (_rand(rng, (2, 4, s, 64), dt) for s in (33, 47, 47))
    mask = None
    if masking == "bool":
        mask = rng.random((1, 1, 33, 47)) < 0.8
        mask[:, :, :, 0] = True  # every row keeps a key (and, causal, its first)
    elif masking == "additive":
        mask = _rand(rng, (1, 1, 33, 47), dt)
    dq, dk, dv = (cp.asarray(x) for x in (q, k, v))
    dm = None if mask is None else cp.asarray(mask)
    call = bound_attention(dq, dk, dv, causal=causal, mask=dm)
    assert call is not None
    want, _ = reference(q, k, v, causal=causal,
                        mask=None if mask is None else
                        (mask if mask.dtype == np.bool_ else mask.astype(np.float64)))
    for _ in range(2):
        out = _poisoned((2, 4, 33, 64), dt)
        call(out)
        got = cp.asnumpy(out).astype(np.float64)
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])
    # new contents at the same addresses: the next call reads them
    q2 = _rand(rng, q.shape, dt)
    dq.set(q2)
    out = _poisoned((2, 4, 33, 64), dt)
    call(out)
    want2, _ = reference(q2, k, v, causal=causal,
                         mask=None if mask is None else
                         (mask if mask.dtype == np.bool_ else mask.astype(np.float64)))
    np.testing.assert_allclose(cp.asnumpy(out).astype(np.float64), want2, rtol=TOL[dtype],
                               atol=TOL[dtype])


def test_grouped_heads_on_a_side_stream():
    rng = np.random.default_rng()
    q, k, v = _rand(rng, (1, 8, 65, 128), np.float16), *(
        _rand(rng, (1, 2, 130, 128), np.float16) for _ in range(2))
    dq, dk, dv = (cp.asarray(x) for x in (q, k, v))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        call = bound_attention(dq, dk, dv, causal=True)
        out = _poisoned((1, 8, 65, 128), np.float16)
        call(out)
    stream.synchronize()
    want, _ = reference(q, k, v, causal=True)
    np.testing.assert_allclose(cp.asnumpy(out).astype(np.float64), want, rtol=2e-3,
                               atol=2e-3)


def test_a_bound_call_refuses_an_output_that_does_not_fit():
    q = cp.asarray(np.random.default_rng().standard_normal((1, 2, 16, 64)), dtype=cp.float16)
    call = bound_attention(q, q, q)
    with pytest.raises(PycLabError, match="C-contiguous float16 array of 4096 bytes"):
        call(cp.empty((1, 2, 16, 64), dtype=cp.float32))
    with pytest.raises(PycLabError, match="C-contiguous"):
        call(cp.empty((1, 2, 64, 16), dtype=cp.float16).swapaxes(-1, -2))


def test_operands_it_does_not_take_give_none():
    q = cp.asarray(np.random.default_rng().standard_normal((1, 2, 16, 64)), dtype=cp.float16)
    assert bound_attention(q.swapaxes(1, 2).copy().swapaxes(1, 2), q, q) is None
    m32 = cp.zeros((1, 1, 16, 16), dtype=cp.float32)
    assert bound_attention(q, q, q, mask=m32) is None  # scores in the mask's precision
    assert bound_attention(cp.asnumpy(q), cp.asnumpy(q), cp.asnumpy(q)) is None


def _attention(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) * np.float16(0.125)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def _library_step(fn, args):
    art, _ = fn._artifact(args, {})
    (step,) = [s for s in art.runner._steps if s.node.op == "attention"]
    return step


def test_a_compiled_attention_keeps_its_bound_call_while_the_inputs_stay():
    rng = np.random.default_rng()
    host = [_rand(rng, (2, 3, 40, 64), np.float16) for _ in range(3)]
    args = [cp.asarray(x) for x in host]
    fn = pl.compile(_attention)
    want = _attention(*(x.astype(np.float64) for x in host))
    for _ in range(3):
        got = cp.asnumpy(fn(*args)).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=3e-3, atol=3e-3)
    step = _library_step(fn, args)
    places, call = step._bound
    assert call is not None and places[0][0] == args[0].data.ptr
    # other arrays: bound again there, still right
    host2 = [_rand(rng, (2, 3, 40, 64), np.float16) for _ in range(3)]
    got = cp.asnumpy(fn(*(cp.asarray(x) for x in host2))).astype(np.float64)
    np.testing.assert_allclose(got, _attention(*(x.astype(np.float64) for x in host2)),
                               rtol=3e-3, atol=3e-3)
    assert step._bound[0] != places
