"""pyc_lab's Hopper attention kernel without a GPU: configurations and their limits, the
ranked space, the emitted source, geometries and what they refuse, tuning keys, the
shared candidate table, the route on machines without CUDA, and (with nvcc) that the
source compiles to TMA loads, warpgroup MMAs and register reconfiguration."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.kernels.attention import attention_explain, attention_route
from pyc_lab.kernels.attention_sm90 import attention_problem_key, fused_choice
from pyc_lab.kernels.cutlass.attention import (
    SMEM_LIMIT,
    AttnConfig,
    AttnGeometry,
    AttnKernel,
    attention_configs,
    build_attention,
    emit_attention_source,
)
from pyc_lab.kernels.tuning.kernel_rows import listed_space


def test_config_ids_dicts_and_rows():
    c = AttnConfig(192, 3, 2)
    assert c.id == "attn_n192_s3_w2_o" and c.block_m == 128 and c.overlap
    assert AttnConfig(64, 2, 3, overlap=False).id == "attn_n64_s2_w3"
    p = AttnConfig(persistent=True)
    assert p.id == "attn_n128_s2_w2_o_p"
    for cfg in (c, AttnConfig(64, 2, 3, False), p):
        assert AttnConfig.from_dict(cfg.to_dict()) == cfg
    # entries recorded before the schedule was a dimension read as one CTA per block
    old = {k: v for k, v in c.to_dict().items() if k != "persistent"}
    assert AttnConfig.from_dict(old) == c
    with pytest.raises(pl.PycLabError, match="not an attention configuration"):
        AttnConfig.from_dict({"block_n": 128})


@pytest.mark.parametrize(("cfg", "d", "why"), [
    (AttnConfig(100, 2, 2), 64, "multiple of 16"),
    (AttnConfig(128, 2, 4), 64, "consumer warpgroups"),
    (AttnConfig(128, 1, 2), 64, "at least 2"),
    (AttnConfig(128, 2, 3), 128, "register budget"),
    (AttnConfig(192, 3, 2), 128, "shared memory"),
])
def test_configurations_that_cannot_be_built_say_why(cfg, d, why):
    assert why in cfg.issue(d)
    with pytest.raises(pl.PycLabError, match=why):
        emit_attention_source(cfg, AttnKernel("f16", d))


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_the_space_fits_and_starts_with_the_default(d, causal):
    configs = attention_configs(AttnKernel("bf16", d), causal)
    assert configs[0] == AttnConfig(persistent=True)  # the untuned default
    assert len(configs) == len(set(configs)) >= 4
    assert all(c.issue(d) == "" and c.smem_bytes(d) <= SMEM_LIMIT for c in configs)
    if d == 128:
        assert all(c.warpgroups == 2 for c in configs)
    assert configs[1] == AttnConfig()  # its one-CTA-per-block twin
    if causal:  # then the 64-key block
        assert configs[2].block_n == 64
    for c in configs:  # every persistent configuration has its one-CTA-per-block twin
        assert AttnConfig(c.block_n, c.stages, c.warpgroups, c.overlap, False) in configs
    overlapped = [c.overlap for c in configs]
    assert overlapped == sorted(overlapped, reverse=True) and any(overlapped) \
        and not all(overlapped)


def test_kernels_refuse_what_the_source_does_not_take():
    with pytest.raises(pl.PycLabError, match="takes"):
        AttnKernel("tf32", 128)
    with pytest.raises(pl.PycLabError, match="head dimension"):
        AttnKernel("bf16", 96)
    assert AttnKernel("f16", 64).op(True) == "attention_fwd_causal"


def test_the_source_is_the_native_text_under_its_defines():
    src = emit_attention_source(AttnConfig(64, 3, 3, False), AttnKernel("f16", 64))
    for line in ("#define PYC_ELEMENT cutlass::half_t", "#define PYC_HEAD_DIM 64",
                 "#define PYC_BLOCK_N 64", "#define PYC_STAGES 3", "#define PYC_MMA_WG 3",
                 "#define PYC_OVERLAP 0", "#define PYC_PERSISTENT 0"):
        assert line in src
    assert "#define PYC_PERSISTENT 1" in emit_attention_source(AttnConfig(persistent=True),
                                                               AttnKernel("f16", 64))
    assert "extern \"C\"" in src and "pyc_attn_fwd" in src


def test_the_output_is_staged_in_shared_memory_where_there_is_room():
    # 128 x 128 bf16: Q 32 KiB + K/V rings 128 KiB + barriers leave room for a 32 KiB tile
    assert AttnConfig().stores_through_smem(128)
    assert AttnConfig().smem_bytes(128) == (32 + 128 + 32 + 1) * 1024
    assert "#define PYC_STORE_O 1" in emit_attention_source(AttnConfig(), AttnKernel("bf16", 128))
    # 192-key blocks fill shared memory with their rings: the threads store directly
    wide = AttnConfig(192, 2, 2)
    assert not wide.stores_through_smem(128) and wide.smem_bytes(128) == (32 + 192 + 1) * 1024
    assert "#define PYC_STORE_O 0" in emit_attention_source(wide, AttnKernel("bf16", 128))


def test_a_persistent_cta_double_buffers_q_where_there_is_room():
    # one CTA per block loads one Q: one buffer
    assert AttnConfig().q_buffers(128) == 1
    assert "#define PYC_Q_STAGES 1" in emit_attention_source(AttnConfig(), AttnKernel("f16", 128))
    # persistent, 128 x 128: a second 32 KiB Q beside the staged output still fits
    p = AttnConfig(persistent=True)
    assert p.q_buffers(128) == 2 and p.smem_bytes(128) == (2 * 32 + 128 + 32 + 1) * 1024
    assert p.smem_bytes(128) <= SMEM_LIMIT
    assert "#define PYC_Q_STAGES 2" in emit_attention_source(p, AttnKernel("bf16", 128))
    # 192-key blocks leave no room: one Q, and the threads store directly
    wide = AttnConfig(192, 2, 2, persistent=True)
    assert wide.q_buffers(128) == 1 and wide.smem_bytes(128) == (32 + 192 + 1) * 1024
    assert AttnConfig(64, 2, 3, persistent=True).q_buffers(64) == 2


def _geometry(**kw):
    base = dict(batch=2, heads_q=8, heads_kv=2, len_q=100, len_k=300, head_dim=128,
                strides=((8 * 100 * 128, 100 * 128, 128), (2 * 300 * 128, 300 * 128, 128),
                         (2 * 300 * 128, 300 * 128, 128), (8 * 100 * 128, 100 * 128, 128)),
                scale=0.1, causal=False)
    return AttnGeometry(**{**base, **kw})


def test_geometries_say_what_the_kernel_cannot_take():
    kern = AttnKernel("bf16", 128)
    assert _geometry().issue(kern) == ""
    assert _geometry(causal=True).flops * 2 == _geometry().flops == 4 * 2 * 8 * 100 * 300 * 128
    assert "head dimension 64" in _geometry(head_dim=64).issue(kern)
    assert "not a multiple" in _geometry(heads_kv=3).issue(kern)
    assert "positive scale" in _geometry(scale=-1.0).issue(kern)
    assert "empty" in _geometry(len_k=0).issue(kern)
    bad = _geometry(strides=((1, 1, 130),) * 4)
    assert "multiples of 8" in bad.issue(kern)
    assert [list(a) for a in _geometry().arrays()][1] == [2 * 300 * 128, 300 * 128, 128]


def test_problem_keys_bucket_by_sequence_lengths_and_work():
    key = attention_problem_key(_geometry(causal=True), "bf16")
    assert (key.op, key.dtype_a, key.layout, key.m, key.n, key.k) == (
        "attention_fwd_causal", "bf16", "d128", 100, 300, 16)


def test_the_listed_space_admits_exactly_the_configurations():
    configs = [AttnConfig(128, 2, 2), AttnConfig(64, 3, 2, False)]
    space = listed_space(configs)
    assert sorted(AttnConfig.from_dict(dict(c)).id for c in space) == sorted(
        c.id for c in configs)
    assert {"block_n": 64, "stages": 3, "warpgroups": 2, "overlap": 0, "persistent": 0} \
        in space
    assert {"block_n": 64, "stages": 3, "warpgroups": 2, "overlap": 1, "persistent": 0} \
        not in space


def test_an_older_gpu_gets_a_result_not_a_raise(tmp_path):
    from pyc_lab.kernels.cache import KernelCache

    res = build_attention(AttnConfig(), AttnKernel(), cc=80, cache=KernelCache(tmp_path))
    assert res.status == "compile_error" and "Hopper" in res.message
    res = build_attention(AttnConfig(128, 2, 3), AttnKernel("bf16", 128),
                          cache=KernelCache(tmp_path))
    assert res.status == "compile_error" and "register budget" in res.message


def test_without_cuda_the_blocked_path_answers_and_says_so():
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 2, 17, 64)).astype(np.float16) for _ in range(3))
    assert attention_route(q) == "blocked"
    assert attention_explain(q, k, v).startswith("blocked: ")
    out, lse = pl.attention(q, k, v, return_lse=True)
    assert out.shape == q.shape and lse.shape == (1, 2, 17)


def test_cpu_tensors_are_not_offered_the_kernel():
    torch = pytest.importorskip("torch")
    q = torch.zeros((1, 2, 8, 64), dtype=torch.bfloat16)
    choice = fused_choice(q, q, q, q, False, 0.125, None, lambda: None)
    assert choice.kernel is None and choice.route == "torch-sdpa"
    assert "not a CUDA tensor" in choice.why
    choice = fused_choice(q, q, q, q, False, 0.125, q, lambda: None)
    assert "mask" in choice.why


@pytest.mark.nvcc
def test_the_source_compiles_to_tma_loads_and_warpgroup_mma(tmp_path):
    """The device code of one kernel (bf16, D=64, 3 consumer warpgroups): TMA bulk tensor
    loads, wgmma with a register A operand (P V), setmaxnreg, and mbarrier waits."""
    from pyc_lab.kernels.cutlass.nvcc import NVCC_FLAGS, _include_dirs, nvcc_path

    src = tmp_path / "attn.cu"
    src.write_text(emit_attention_source(AttnConfig(128, 2, 3), AttnKernel("bf16", 64)))
    flags = [f for f in NVCC_FLAGS if f not in ("-shared", "-Xcompiler", "-fPIC")]
    res = subprocess.run([nvcc_path(), *flags, "-arch=sm_90a", "-ptx",
                          *(f"-I{d}" for d in _include_dirs()), str(src), "-o",
                          str(tmp_path / "attn.ptx")], capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    ptx = (tmp_path / "attn.ptx").read_text()
    assert "cp.async.bulk.tensor" in ptx and "mbarrier" in ptx
    assert "wgmma.mma_async" in ptx and ".bf16.bf16" in ptx
    assert "setmaxnreg.inc" in ptx and "setmaxnreg.dec" in ptx
    assert "ex2.approx" in ptx
