"""Training through pl.attention on the GPU: gradients of q, k and v against float64
autograd of the written-out softmax, on fresh random inputs: both layouts, grouped-query
heads, causal masking with unequal lengths, odd lengths, float16/bfloat16/float32; the
kernel's forward with the library backwards fed its output and log-sum-exp (each
checked, the fastest correct kept, a wrong one never chosen); masks that require
gradients; CuPy arrays through ``pl.attention_backward``.

The default kernels come from ``$PYC_LAB_TEST_KERNEL_CACHE`` when the GPU lane carries
them prebuilt; otherwise the fixture builds them (nvcc, about a minute each).
"""

from __future__ import annotations

import os

import pytest

import pyc_lab as pl
from pyc_lab.kernels import attention_grad, attention_sm90
from pyc_lab.kernels.attention_sm90 import FusedChoice
from pyc_lab.kernels.cache import KernelCache
from pyc_lab.kernels.cutlass.attention import AttnConfig, AttnKernel, build_attention

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
# gradient errors relative to the largest float64 gradient
TOL = {"f16": 1.5e-2, "bf16": 6e-2, "f32": 1e-3}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return KernelCache(os.environ.get("PYC_LAB_TEST_KERNEL_CACHE")
                       or tmp_path_factory.mktemp("attn-kernels"))


@pytest.fixture
def kernels(cache, monkeypatch):
    """The default kernels in the user's kernel cache, where ``pl.attention`` looks."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("pyc_lab's attention kernel is for Hopper (sm_90a)")
    for dtype in ("bf16", "f16"):
        for d in (64, 128):
            for persistent in (True, False):
                assert build_attention(AttnConfig(persistent=persistent), AttnKernel(dtype, d),
                                       cache=cache).ok
    monkeypatch.setattr("pyc_lab.kernels.cutlass.attention.KernelCache", lambda: cache)
    attention_sm90.clear()
    attention_grad.clear()
    yield
    attention_sm90.clear()
    attention_grad.clear()


def _inputs(b, hq, hk, sq, sk, d, dtype, seed, layout="bhsd"):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def r(h, s):
        x = torch.randn((b, h, s, d), generator=gen, device="cuda").to(DTYPES[dtype])
        return x.transpose(1, 2).contiguous() if layout == "bshd" else x

    q, k, v = r(hq, sq), r(hk, sk), r(hk, sk)
    do = r(hq, sq)
    return q, k, v, do


def reference_grads(q, k, v, do, causal, layout="bhsd", mask=None):
    """float64 autograd of softmax(q k^T / sqrt(D) + mask) v, GQA by repeating heads."""
    t = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    qd, kd, vd = (t(x) for x in leaves)
    g = qd.shape[1] // kd.shape[1]
    kd, vd = kd.repeat_interleave(g, dim=1), vd.repeat_interleave(g, dim=1)
    s = qd @ kd.transpose(-1, -2) * qd.shape[-1] ** -0.5
    if mask is not None:
        s = s + mask.double()
    if causal:
        sq, sk = s.shape[-2:]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    out = t(torch.softmax(s, dim=-1) @ vd)
    return torch.autograd.grad(out, leaves, do.double())


def _assert_close(got, want, dtype):
    for name, g, w in zip("qkv", got, want, strict=True):
        assert g.shape == w.shape and g.dtype == DTYPES[dtype], name
        err = float((g.double() - w).abs().max()) / float(w.abs().max())
        assert err <= TOL[dtype], f"d{name}: {err:.3g} of the largest gradient"


def _grads(q, k, v, do, **kw):
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = pl.attention(*leaves, **kw)
    out.backward(do)
    return [x.grad for x in leaves]


@pytest.mark.parametrize(("dtype", "d", "causal", "layout", "shape"), [
    ("bf16", 128, False, "bhsd", (2, 8, 2, 300, 300)),   # GQA, odd length
    ("bf16", 64, True, "bshd", (1, 4, 4, 257, 400)),     # causal, unequal lengths
    ("f16", 128, True, "bhsd", (2, 4, 4, 129, 129)),     # one past a tile
    ("f16", 64, False, "bshd", (1, 6, 3, 1, 77)),        # one query
    ("f32", 64, True, "bhsd", (1, 4, 2, 200, 200)),      # no 16-bit kernel: recompute
])
def test_training_through_pl_attention_matches_float64(kernels, dtype, d, causal, layout,
                                                        shape):
    b, hq, hk, sq, sk = shape
    q, k, v, do = _inputs(b, hq, hk, sq, sk, d, dtype, seed=sq + sk, layout=layout)
    got = _grads(q, k, v, do, causal=causal, layout=layout)
    _assert_close(got, reference_grads(q, k, v, do, causal, layout), dtype)


@pytest.fixture
def kernel_forward(kernels, monkeypatch):
    """pl.attention's forward race always keeps pyc_lab's kernel."""
    def race(kernel, how, geometry, *args):
        return FusedChoice(kernel, f"{how} (forced by the test)", geometry=geometry)

    monkeypatch.setattr(attention_sm90, "_race", race)


@pytest.mark.parametrize(("dtype", "d", "causal", "shape"), [
    ("bf16", 128, False, (2, 4, 4, 1024, 1024)),
    ("f16", 64, True, (1, 8, 2, 333, 333)),
])
def test_kernel_forward_with_the_fastest_correct_library_backward(kernel_forward, dtype, d,
                                                                  causal, shape):
    b, hq, hk, sq, sk = shape
    q, k, v, do = _inputs(b, hq, hk, sq, sk, d, dtype, seed=7)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = pl.attention(*leaves, causal=causal)
    assert type(out.grad_fn).__name__ == "_DifferentiableBackward"  # the kernel forward
    out.backward(do)
    _assert_close([x.grad for x in leaves], reference_grads(q, k, v, do, causal), dtype)
    (choice,) = attention_grad._CHOICES.values()
    assert choice.name in ("cudnn", "flash", "sdpa-recompute")
    assert "fastest correct backward" in choice.why and choice.times_ms[choice.name] > 0
    assert choice.times_ms[choice.name] == min(choice.times_ms.values())


def test_flash_backward_takes_the_kernels_log_sum_exp(kernels):
    # FlashAttention-2's contract: natural log-sum-exp (B, H, Sq) float32 of the scaled
    # scores; pyc_lab's kernel writes exactly that
    q, k, v, do = _inputs(1, 4, 4, 500, 500, 128, "bf16", seed=3)
    out, lse = pl.attention(q, k, v, causal=True, return_lse=True)
    got = attention_grad._flash(q, k, v, out, lse, do, True, 128 ** -0.5)
    _assert_close(got, reference_grads(q, k, v, do, True), "bf16")


def test_a_wrong_library_backward_is_never_chosen(kernel_forward, monkeypatch):
    def wrong(q, k, v, o, lse, do, causal, scale):
        dq, dk, dv = attention_grad._flash(q, k, v, o, lse, do, causal, scale)
        return dq * 1.5, dk, dv

    monkeypatch.setitem(attention_grad._LIBRARY, "flash", wrong)
    q, k, v, do = _inputs(1, 4, 4, 256, 256, 64, "f16", seed=11)
    got = _grads(q, k, v, do)
    _assert_close(got, reference_grads(q, k, v, do, False), "f16")
    (choice,) = attention_grad._CHOICES.values()
    assert choice.name != "flash" and "flash: dq differs" in choice.why, choice.why


def test_a_mask_that_requires_gradients_gets_them(kernels):
    q, k, v, do = _inputs(1, 2, 2, 100, 120, 64, "f32", seed=21)
    mask = torch.randn(100, 120, device="cuda", requires_grad=True)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    pl.attention(*leaves, mask=mask).backward(do)
    _assert_close([x.grad for x in leaves], reference_grads(q, k, v, do, False, mask=mask),
                  "f32")
    md = mask.detach().double().requires_grad_()
    s = q.double() @ k.double().transpose(-1, -2) * 64 ** -0.5 + md
    (torch.softmax(s, -1) @ v.double()).backward(do.double())
    assert float((mask.grad.double() - md.grad).abs().max()) <= 1e-3 * float(
        md.grad.abs().max())


def test_cupy_arrays_through_attention_backward(kernels):
    q, k, v, do = _inputs(2, 4, 2, 257, 257, 64, "bf16", seed=31)
    cq, ck, cv, cdo = (cp.from_dlpack(x) for x in (q, k, v, do))
    out, lse = pl.attention(cq, ck, cv, causal=True, return_lse=True)
    grads = pl.attention_backward(cq, ck, cv, cdo, out=out, lse=lse, causal=True)
    assert all(isinstance(g, cp.ndarray) for g in grads)
    _assert_close([torch.from_dlpack(g) for g in grads],
                  reference_grads(q, k, v, do, True), "bf16")
    # without the saved forward, the same gradients (the forward runs again)
    again = pl.attention_backward(cq, ck, cv, cdo, causal=True)
    for a, b in zip(grads, again, strict=True):
        assert bool(cp.allclose(a.astype(cp.float32), b.astype(cp.float32), atol=1e-2))
