"""pl.matmul on float8 torch tensors (Hopper's FP8 tensor cores through cuBLASLt).

Fresh random real tensors are quantised per tensor (scale = absmax / the format's largest
finite value); the reference is the dequantised operands multiplied in float64 on the
host. Outputs are poisoned with NaN first; odd M and N, both FP8 formats, scales that
change between calls, and torch._scaled_mm (the call a user would make instead) on the
same operands.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def quantised(shape, fmt, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(shape, device="cuda", generator=g) * 2 - 1
    scale = float(x.abs().max()) / MAX[fmt]
    x8 = (x / scale).to(getattr(torch, fmt))
    return x8, scale


def want(a8, sa, b8, sb):
    return (a8.double().cpu().numpy() * sa) @ (b8.double().cpu().numpy() * sb)


def check(got, ref, out_dtype, k):
    got64 = got.double().cpu().numpy()
    assert np.isfinite(got64).all(), "NaN in the result (the poison survived?)"
    err = np.abs(got64 - ref).max() / max(np.abs(ref).max(), 1e-3)
    eps = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24}[out_dtype]
    # Hopper's FP8 MMA keeps ~14 mantissa bits in its accumulator between promotions to
    # float32, so a float32 result is good to about 2^-12 of the largest value, not 2^-24
    eps = max(eps, 2.0 ** -12)
    assert err <= 2 * eps + k * 2.0 ** -22, f"max error {err:.3g}"


@pytest.fixture(autouse=True)
def _hopper():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need compute capability 8.9 or newer")


@pytest.mark.parametrize("fmts", [("float8_e4m3fn", "float8_e4m3fn"),
                                  ("float8_e4m3fn", "float8_e5m2"),
                                  ("float8_e5m2", "float8_e4m3fn")])
@pytest.mark.parametrize("mnk", [(127, 48, 64), (1, 4096, 4096), (512, 1000, 1024)])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16", "float32"])
def test_fp8_products_against_float64(fmts, mnk, out_dtype):
    m, n, k = mnk
    a8, sa = quantised((m, k), fmts[0], seed=m + k)
    w8, sb = quantised((n, k), fmts[1], seed=n + 7)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=getattr(torch, out_dtype))
    got = pl.matmul(a8, w8.T, scale_a=sa, scale_b=sb, out=out, out_dtype=out_dtype)
    assert got is out
    check(out, want(a8, sa, w8.T, sb), out_dtype, k)


def test_scales_are_read_on_each_call_and_match_scaled_mm():
    a8, sa = quantised((256, 512), "float8_e4m3fn", 1)
    w8, sb = quantised((384, 512), "float8_e4m3fn", 2)
    for factor in (1.0, 0.25, 3.0):  # device scales that change between calls
        ta = torch.tensor([sa * factor], device="cuda")
        tb = torch.tensor([sb], device="cuda")
        got = pl.matmul(a8, w8.T, scale_a=ta, scale_b=tb)
        assert got.dtype == torch.bfloat16
        check(got, want(a8, sa * factor, w8.T, sb), "bfloat16", 512)
        if hasattr(torch, "_scaled_mm"):
            ref = torch._scaled_mm(a8, w8.T, scale_a=ta, scale_b=tb, out_dtype=torch.bfloat16)
            diff = (got.float() - ref.float()).abs().max().item()
            assert diff <= 2 ** -7 * ref.float().abs().max().item()
    from pyc_lab.kernels.matmul_fp8 import fp8_choices

    ran = fp8_choices()
    assert ran and set(ran.values()) <= {"cublaslt", "torch._scaled_mm"}, ran


@pytest.mark.parametrize("case, match", [
    ("b-row-major", "row-major a"),
    ("odd-k", "multiple of 16"),
    ("both-e5m2", "e5m2 @ e5m2"),
    ("no-scale", "scale_b="),
    ("with-bias", "no bias"),
    ("mixed", "two torch float8 tensors"),
])
def test_what_fp8_kernels_refuse_is_said(case, match):
    a8, sa = quantised((64, 64), "float8_e4m3fn", 3)
    w8, sb = quantised((32, 64), "float8_e4m3fn", 4)
    kwargs = {"scale_a": sa, "scale_b": sb}
    b = w8.T
    if case == "b-row-major":
        b = w8.T.contiguous()
    elif case == "odd-k":
        a8, b = a8[:, :24].contiguous(), w8[:, :24].contiguous().T
    elif case == "both-e5m2":
        a8, b = a8.float().to(torch.float8_e5m2), w8.float().to(torch.float8_e5m2).T
    elif case == "no-scale":
        kwargs.pop("scale_b")
    elif case == "with-bias":
        kwargs["bias"] = torch.zeros(32, device="cuda")
    elif case == "mixed":
        b = w8.float().T
    with pytest.raises(pl.PycLabError, match=match):
        pl.matmul(a8, b, **kwargs)
