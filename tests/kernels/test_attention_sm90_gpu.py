"""pyc_lab's own Hopper attention kernel on the GPU, against a float32 reference (torch,
float64 softmax) on fresh random inputs, with the output and log-sum-exp poisoned with
NaN before each launch: odd lengths, length 1, one past a tile, unequal lengths with
causal masking, grouped-query heads, strided (B, S, H, D) views, large scores, every
configuration carried in the kernel cache; then ``pl.attention``'s choice and race.

The kernels come from ``$PYC_LAB_TEST_KERNEL_CACHE`` when the GPU lane carries them
prebuilt; otherwise the fixture builds them (nvcc, about a minute each).
"""

from __future__ import annotations

import os

import pytest

import pyc_lab as pl
from pyc_lab.kernels import attention_sm90
from pyc_lab.kernels.attention import attention_explain
from pyc_lab.kernels.cache import KernelCache
from pyc_lab.kernels.cutlass.attention import (
    AttnConfig,
    AttnKernel,
    FusedAttention,
    build_attention,
)

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
# Errors against the float32 reference, relative to the largest output (P is rounded to
# the 16-bit type before P V, as every fused kernel does).
TOL = {"f16": 4e-3, "bf16": 2.5e-2}


def _hopper() -> None:
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("pyc_lab's attention kernel is for Hopper (sm_90a)")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return KernelCache(os.environ.get("PYC_LAB_TEST_KERNEL_CACHE")
                       or tmp_path_factory.mktemp("attn-kernels"))


def _kernel(cache, dtype, d, config=None) -> FusedAttention:
    _hopper()
    config = config or AttnConfig()
    res = build_attention(config, AttnKernel(dtype, d), cache=cache)
    assert res.ok, res.message
    return FusedAttention(res.library, config, AttnKernel(dtype, d))


def reference(q, k, v, causal, scale):
    """float32 products, float64 softmax; (out, lse) for (B, H, S, D) tensors."""
    g = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(g, dim=1)
    vf = v.float().repeat_interleave(g, dim=1)
    s = (q.float() @ kf.transpose(-1, -2)).double() * scale
    if causal:
        sq, sk = s.shape[-2:]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    return (p @ vf.double()), lse


def _inputs(b, hq, hk, sq, sk, d, dtype, gen, magnitude=1.0):
    def r(h, s):
        return (torch.randn((b, h, s, d), generator=gen, device="cuda") * magnitude
                ).to(DTYPES[dtype])
    return r(hq, sq), r(hk, sk), r(hk, sk)


def _launch(kern, q, k, v, causal, scale, o=None):
    b, hq, sq, _ = q.shape
    if o is None:
        o = torch.full((b, hq, sq, v.shape[-1]), float("nan"), dtype=q.dtype, device="cuda")
    lse = torch.full((b, hq, sq), float("nan"), dtype=torch.float32, device="cuda")
    geo = attention_sm90.geometry_of(q, k, v, o, causal, scale)
    attention_sm90.run_fused(kern, geo, q, k, v, o, lse)
    torch.cuda.synchronize()
    return o, lse


def _check(o, lse, ref, ref_lse, dtype):
    assert not torch.isnan(o).any(), "a row was not written (or NaN appeared)"
    err = float((o.double() - ref).abs().max()) / max(float(ref.abs().max()), 1e-6)
    assert err <= TOL[dtype], f"max error {err:.3g} > {TOL[dtype]}"
    lerr = float((lse.double() - ref_lse).abs().max())
    assert lerr <= 2e-3, f"log-sum-exp off by {lerr:.3g}"


CASES = [  # b, hq, hk, sq, sk
    (1, 1, 1, 1, 1),
    (2, 4, 4, 129, 129),
    (1, 8, 2, 200, 333),
    (2, 2, 1, 193, 17),
    (1, 2, 2, 300, 100),
    (1, 2, 2, 100, 300),
    (3, 6, 3, 257, 1000),
]


@pytest.mark.parametrize("schedule", ["one-cta-per-block", "persistent"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_the_reference(cache, dtype, d, causal, case, schedule):
    kern = _kernel(cache, dtype, d, AttnConfig(persistent=schedule == "persistent"))
    gen = torch.Generator(device="cuda").manual_seed(hash((dtype, d, causal, case)) % 2**31)
    q, k, v = _inputs(*case[:3], *case[3:], d, dtype, gen)
    scale = d ** -0.5
    o, lse = _launch(kern, q, k, v, causal, scale)
    _check(o, lse, *reference(q, k, v, causal, scale), dtype)


@pytest.mark.parametrize("schedule", ["one-cta-per-block", "persistent"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_more_query_blocks_than_sms(cache, d, causal, schedule):
    """256 query blocks (more than the H200's 132 SMs), so the grid never fits one wave
    and a persistent CTA takes two tiles or more: the hand-over from one tile to the next
    (Q reloaded after the consumers are done with it, the K/V pipelines' stages carried
    on) is what this checks."""
    kern = _kernel(cache, "bf16", d, AttnConfig(persistent=schedule == "persistent"))
    gen = torch.Generator(device="cuda").manual_seed(23)
    q, k, v = _inputs(2, 4, 4, 4096, 4096, d, "bf16", gen)
    o, lse = _launch(kern, q, k, v, causal, d ** -0.5)
    for h in (0, 3):  # the first and the last tiles of a persistent CTA's round robin
        ref, ref_lse = reference(q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1], causal,
                                 d ** -0.5)
        _check(o[:, h:h + 1], lse[:, h:h + 1], ref, ref_lse, "bf16")
    assert not torch.isnan(o).any()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", [(64, 16, 4, 200), (8, 8, 2, 1100)])
def test_a_persistent_cta_with_many_tiles(cache, causal, case):
    """Hundreds to thousands of tiles per launch, so every CTA runs many and must hand
    each one over cleanly; causal ones go in equal-work pairs (2 query blocks per head,
    and 9, an odd count, so that pairs straddle heads)."""
    kern = _kernel(cache, "f16", 64, AttnConfig(persistent=True))
    gen = torch.Generator(device="cuda").manual_seed(29)
    b, hq, hk, s = case
    q, k, v = _inputs(b, hq, hk, s, s, 64, "f16", gen)
    o, lse = _launch(kern, q, k, v, causal, 0.125)
    _check(o, lse, *reference(q, k, v, causal, 0.125), "f16")


@pytest.mark.parametrize("d", [64, 128])
def test_large_scores_stay_stable(cache, d):
    kern = _kernel(cache, "bf16", d)
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = _inputs(2, 4, 4, 300, 517, d, "bf16", gen, magnitude=6.0)  # |s| ~ 100s
    o, lse = _launch(kern, q, k, v, True, d ** -0.5)
    ref, ref_lse = reference(q, k, v, True, d ** -0.5)
    assert float(ref_lse.abs().max()) > 100
    _check(o, lse, ref, ref_lse, "bf16")


def test_strided_bshd_views_and_output(cache):
    kern = _kernel(cache, "f16", 128)
    gen = torch.Generator(device="cuda").manual_seed(11)
    b, s, h, d = 2, 211, 4, 128
    q, k, v = (torch.randn((b, s, h, d), generator=gen, device="cuda").half().transpose(1, 2)
               for _ in range(3))
    o = torch.full((b, s, h, d), float("nan"), dtype=torch.float16,
                   device="cuda").transpose(1, 2)
    out, lse = _launch(kern, q, k, v, False, 0.1, o)
    _check(out, lse, *reference(q, k, v, False, 0.1), "f16")


def test_every_carried_configuration(cache):
    """Each non-default configuration built for the lane (the one-block-at-a-time loop
    among them) computes the same answer."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    tried = 0
    for dtype, d, cfg in (("bf16", 64, AttnConfig(128, 2, 3)),
                          ("bf16", 128, AttnConfig(192, 2, 2)),
                          ("bf16", 128, AttnConfig(64, 3, 2)),
                          ("bf16", 128, AttnConfig(128, 2, 2, overlap=False)),
                          ("f16", 64, AttnConfig(128, 2, 3, overlap=False)),
                          ("bf16", 64, AttnConfig(128, 2, 3, persistent=True)),
                          ("f16", 64, AttnConfig(128, 2, 3, persistent=True))):
        kern = _kernel(cache, dtype, d, cfg)
        for causal in (False, True):
            q, k, v = _inputs(2, 4, 2, 333, 401, d, dtype, gen)
            o, lse = _launch(kern, q, k, v, causal, d ** -0.5)
            _check(o, lse, *reference(q, k, v, causal, d ** -0.5), dtype)
            tried += 1
    assert tried == 14


def test_unaligned_or_unsupported_operands_are_refused(cache):
    kern = _kernel(cache, "bf16", 64)
    q = torch.randn((1, 2, 64, 72), device="cuda").bfloat16()[..., :64]  # row stride 72: ok
    o = torch.empty((1, 2, 64, 64), device="cuda", dtype=torch.bfloat16)
    geo = attention_sm90.geometry_of(q, q, q, o, False, 0.125)
    assert geo.issue(kern.kernel) == ""
    q2 = torch.randn((1, 2, 64, 68), device="cuda").bfloat16()[..., :64]  # stride 68
    geo2 = attention_sm90.geometry_of(q2, q2, q2, o, False, 0.125)
    assert "multiples of 8" in geo2.issue(kern.kernel)
    with pytest.raises(pl.PycLabError, match="multiples of 8"):
        attention_sm90.run_fused(kern, geo2, q2, q2, q2, o)


@pytest.fixture
def default_kernels_cached(cache, monkeypatch):
    """The default kernels in the user's kernel cache, where ``pl.attention`` looks."""
    for dtype in ("bf16", "f16"):
        for d in (64, 128):
            for persistent in (True, False):  # the untuned default and its twin
                _kernel(cache, dtype, d, AttnConfig(persistent=persistent))
    monkeypatch.setattr("pyc_lab.kernels.cutlass.attention.KernelCache", lambda: cache)
    attention_sm90.clear()
    yield
    attention_sm90.clear()


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_pl_attention_races_and_stays_correct(default_kernels_cached, layout):
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = _inputs(2, 8, 2, 1024, 1024, 128, "bf16", gen)
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    why = attention_explain(q, k, v, causal=True, layout=layout)
    assert why.startswith(("pyc-fused: ", "torch-sdpa: ")) and "first call" in why, why
    out = pl.attention(q, k, v, causal=True, layout=layout)
    assert out.shape == q.shape
    if layout == "bshd":
        q, k, v, out = (x.transpose(1, 2) for x in (q, k, v, out))
    ref, _ = reference(q, k, v, True, 128 ** -0.5)
    err = float((out.double() - ref).abs().max()) / float(ref.abs().max())
    assert err <= TOL["bf16"]


def test_the_log_sum_exp_comes_from_the_kernel(default_kernels_cached):
    gen = torch.Generator(device="cuda").manual_seed(9)
    q, k, v = _inputs(1, 4, 4, 257, 300, 64, "f16", gen)
    why = attention_explain(q, k, v, return_lse=True)
    assert why.startswith("pyc-fused: ") and "log-sum-exp" in why, why
    out, lse = pl.attention(q, k, v, return_lse=True)
    assert lse.dtype == torch.float32 and lse.is_cuda
    _check(out, lse, *reference(q, k, v, False, 64 ** -0.5), "f16")
    # CuPy arrays take the same kernel through DLPack
    cq, ck, cv = (cp.from_dlpack(x) for x in (q, k, v))
    cout, clse = pl.attention(cq, ck, cv, return_lse=True)
    assert isinstance(cout, cp.ndarray) and isinstance(clse, cp.ndarray)
    assert torch.equal(torch.from_dlpack(cout), out)
    assert torch.equal(torch.from_dlpack(clse), lse)


def test_a_slower_kernel_is_never_kept(default_kernels_cached, monkeypatch):
    monkeypatch.setattr("pyc_lab.kernels.blas_direct.race",
                        lambda runs, stream, rounds=5: [2.0, 1.0])
    gen = torch.Generator(device="cuda").manual_seed(13)
    q, k, v = _inputs(1, 4, 4, 512, 512, 64, "bf16", gen)
    why = attention_explain(q, k, v)
    assert why.startswith("torch-sdpa: torch SDPA 1 ms beat"), why
    out = pl.attention(q, k, v)
    ref, _ = reference(q, k, v, False, 0.125)
    assert float((out.double() - ref).abs().max()) / float(ref.abs().max()) <= TOL["bf16"]


def test_autotune_records_a_winner_that_pl_attention_then_uses(default_kernels_cached, cache):
    keep = {AttnConfig(), AttnConfig(128, 2, 3)}  # both carried: nothing is built
    res = pl.autotune_attention(1, 4, 300, 64, causal=True, dtype="bf16", repeats=3,
                                restrict=lambda c: c in keep, cache=cache)
    assert set(res.baselines) >= {"sdpa"} and all(ms > 0 for ms in res.baselines.values())
    rows = {r["config"]: r for r in res.table.to_dict("records")}
    assert set(rows) == {c.id for c in keep}
    assert all(r["status"] == "ok" and r["error"] <= TOL["bf16"] for r in rows.values())
    assert res.best is not None and res.recorded
    gen = torch.Generator(device="cuda").manual_seed(17)
    q, k, v = _inputs(1, 4, 4, 300, 300, 64, "bf16", gen)
    why = attention_explain(q, k, v, causal=True)
    assert why.startswith(("pyc-fused: tuned attn_n", "torch-sdpa: torch SDPA")), why
    assert "(exact match)" in why, why


@pytest.mark.parametrize(("times", "route"), [([1.0, 2.0], "pyc-fused"),
                                              ([2.0, 1.0], "torch-sdpa")])
def test_a_bound_call_runs_the_route_its_race_chose(default_kernels_cached, monkeypatch,
                                                    times, route):
    from pyc_lab.kernels.attention_bound import bound_attention

    monkeypatch.setattr("pyc_lab.kernels.blas_direct.race",
                        lambda runs, stream, rounds=5: list(times))
    gen = torch.Generator(device="cuda").manual_seed(21)
    q, k, v = _inputs(1, 4, 2, 300, 257, 128, "f16", gen)
    cq, ck, cv = (cp.from_dlpack(x) for x in (q, k, v))
    call = bound_attention(cq, ck, cv, causal=True)
    assert call.route == route, call.choice.why
    ref, _ = reference(q, k, v, True, 128 ** -0.5)
    for _ in range(2):
        out = cp.empty((1, 4, 300, 128), dtype=cp.float16)
        out.view(cp.uint8).fill(255)  # NaN until written
        call(out)
        got = torch.from_dlpack(out)
        assert not torch.isnan(got).any()
        err = float((got.double() - ref).abs().max()) / float(ref.abs().max())
        assert err <= TOL["f16"]
