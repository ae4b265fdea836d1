"""Programs people write, in NumPy style, each with its torch twin — the compiler's suite.

Each :class:`Program` is a function as a user writes it for ``pl.compile`` (NumPy calls
and operators only), the same computation written for torch (the eager and
``torch.compile`` baselines), how to make its inputs at a size (fresh random values,
never zeros) and the dtype it runs in. ``benchmarks/bench_programs.py`` times them on the
GPU; ``tests/compiler/test_program_suite.py`` checks on the CPU that every program
compiles and matches NumPy at a small size. The list is chosen as users would bring
work (norms, MLPs, attention, losses, optimiser steps, reductions over every axis,
rotary and time embeddings, SciML blocks), not to suit the compiler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["PROGRAMS", "Program", "make_inputs"]

F16, F32 = np.float16, np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)  # NumPy's bfloat16 (CuPy's and torch's through DLPack)


@dataclass(frozen=True)
class Program:
    """One program of the suite.

    Attributes
    ----------
    name
        Short id.
    dtype
        The dtype its floating inputs are made in.
    shapes
        ``shapes(scale) -> list of (shape, kind)``: ``kind`` is ``"x"`` (random normal +
        0.1), ``"pos"`` (positive), ``"mask"`` (bool), ``"onehot"`` (one-hot rows) or
        ``"labels"``/``"rows"`` (int64 indices along the first input's last/first axis).
        ``scale`` 1 is the benchmark size, smaller for tests.
    numpy_fn, torch_fn
        The program for ``pl.compile`` and for torch.
    memory_bound
        Whether its speed is bandwidth (reported against a device copy).
    """

    name: str
    dtype: Any
    shapes: Callable[[float], list[tuple[tuple[int, ...], str]]]
    numpy_fn: Callable[..., Any]
    torch_fn: Callable[..., Any]
    memory_bound: bool = True


def make_inputs(program: Program, scale: float, seed: int = 0) -> list[np.ndarray]:
    """Host inputs of ``program`` at ``scale`` (never zeros)."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for shape, kind in program.shapes(scale):
        if kind in ("labels", "rows"):  # int64: classes (last axis) or rows of input 0
            bound = out[0].shape[-1] if kind == "labels" else out[0].shape[0]
            out.append(rng.integers(0, bound, shape))
        elif kind == "mask":
            out.append(rng.random(shape) < 0.8)
        elif kind == "onehot":
            rows = int(np.prod(shape[:-1]))
            hot = np.zeros((rows, shape[-1]), program.dtype)
            hot[np.arange(rows), rng.integers(0, shape[-1], rows)] = 1
            out.append(hot.reshape(shape))
        elif kind == "w":  # a layer's weights: unit variance out for unit variance in
            out.append((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(program.dtype))
        elif kind == "pos":
            out.append(rng.uniform(0.5, 2.0, shape).astype(program.dtype))
        else:
            out.append((rng.standard_normal(shape) + 0.1).astype(program.dtype))
    return out


def _n(scale: float, full: int, least: int = 64) -> int:
    return max(least, int(full * scale))


# -- the programs, NumPy first, torch second -----------------------------------------------
def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.float32(0.7978846) * (x + np.float32(0.044715) * x ** 3)))


def gelu_tanh_t(x):
    return 0.5 * x * (1 + (0.7978846 * (x + 0.044715 * x ** 3)).tanh())


def rms_norm(x, r, g):
    h = x + r
    return h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + np.float16(1e-6)) * g


def rms_norm_t(x, r, g):
    h = x + r
    return h / (h * h).mean(-1, keepdim=True).add(1e-6).sqrt() * g


def colsum_scale(x, s):
    return x.sum(axis=0) * s


def colsum_scale_t(x, s):
    return x.sum(0) * s


def relu_mlp(x, w1, b1, w2, b2):
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def relu_mlp_t(x, w1, b1, w2, b2):
    return (x @ w1 + b1).clamp_min(0) @ w2 + b2


def softmax_rows(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_rows_t(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def layer_norm(x, g, b):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + np.float16(1e-5)) * g + b


def layer_norm_t(x, g, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / (var + 1e-5).sqrt() * g + b


def layer_norm_train(x, g, b):
    mu = x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + np.float32(1e-5))
    return (x - mu) * rstd * g + b, mu, rstd


def layer_norm_train_t(x, g, b):
    mu = x.mean(-1, keepdim=True)
    rstd = (((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5).rsqrt()
    return (x - mu) * rstd * g + b, mu, rstd


def attention(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) * np.float16(0.125)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def attention_t(q, k, v):
    s = q @ k.transpose(-1, -2) * 0.125
    p = (s - s.amax(-1, keepdim=True)).exp()
    return (p / p.sum(-1, keepdim=True)) @ v


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def log_softmax_t(x):
    m = x.amax(-1, keepdim=True)
    return x - m - (x - m).exp().sum(-1, keepdim=True).log()


def cross_entropy(x, onehot):
    m = x.max(axis=-1, keepdims=True)
    logp = x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
    return -(onehot * logp).sum(axis=-1).mean()


def cross_entropy_t(x, onehot):
    m = x.amax(-1, keepdim=True)
    logp = x - m - (x - m).exp().sum(-1, keepdim=True).log()
    return -(onehot * logp).sum(-1).mean()


def swiglu(x, w1, w3, w2):
    a = x @ w1
    return (a / (1 + np.exp(-a)) * (x @ w3)) @ w2


def swiglu_t(x, w1, w3, w2):
    a = x @ w1
    return (a / (1 + (-a).exp()) * (x @ w3)) @ w2


def adam_step(p, g, m, v):
    m2 = np.float32(0.9) * m + np.float32(0.1) * g
    v2 = np.float32(0.999) * v + np.float32(0.001) * g * g
    return p - np.float32(1e-3) * (m2 / np.float32(0.1)) / (
        np.sqrt(v2 / np.float32(0.001)) + np.float32(1e-8)), m2, v2


def adam_step_t(p, g, m, v):
    m2 = 0.9 * m + 0.1 * g
    v2 = 0.999 * v + 0.001 * g * g
    return p - 1e-3 * (m2 / 0.1) / ((v2 / 0.001).sqrt() + 1e-8), m2, v2


def rotary(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rotary_t(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    import torch

    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def row_std(x):
    return x.std(axis=-1)


def row_std_t(x):
    return x.std(-1, correction=0)


def middle_sum(x):
    return x.sum(axis=1)


def middle_sum_t(x):
    return x.sum(1)


def masked_softmax(x, mask):
    s = np.where(mask, x / np.float32(0.7), -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def masked_softmax_t(x, mask):
    import torch

    s = torch.where(mask, x / 0.7, float("-inf"))
    e = (s - s.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def sigmoid_gate(x, y):
    return x / (1 + np.exp(-y))


def sigmoid_gate_t(x, y):
    return x / (1 + (-y).exp())


def l2_normalize(x):
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + np.float32(1e-12))


def l2_normalize_t(x):
    return x / ((x * x).sum(-1, keepdim=True) + 1e-12).sqrt()


def polynomial(x):
    return x ** 4 - np.float32(2) * x ** 2 + np.float32(1)


def polynomial_t(x):
    return x ** 4 - 2 * x ** 2 + 1


def batch_norm_infer(x, mean, var, g, b):
    return (x - mean) / np.sqrt(var + np.float32(1e-5)) * g + b


def batch_norm_infer_t(x, mean, var, g, b):
    return (x - mean) / (var + 1e-5).sqrt() * g + b


def full_sum_sq(x):
    return (x * x).sum()


def full_sum_sq_t(x):
    return (x * x).sum()


def bce_with_logits(x, y):
    return (np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))).mean(axis=-1)


def bce_with_logits_t(x, y):
    import torch

    return torch.nn.functional.binary_cross_entropy_with_logits(
        x, y, reduction="none").mean(-1)


def time_embedding(t, freqs):
    arg = t[:, None] * freqs[None, :]
    return np.concatenate([np.sin(arg), np.cos(arg)], axis=-1)


def time_embedding_t(t, freqs):
    import torch

    arg = t[:, None] * freqs[None, :]
    return torch.cat([arg.sin(), arg.cos()], dim=-1)


def gelu_erf(x):
    from scipy.special import erf

    return np.float32(0.5) * x * (1 + erf(x * np.float32(0.7071067811865476)))


def gelu_erf_t(x):
    import torch

    return torch.nn.functional.gelu(x)


def cross_entropy_labels(x, y):
    z = x - x.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -logp[np.arange(x.shape[0]), y].mean()


def cross_entropy_labels_t(x, y):
    import torch

    z = x - x.amax(-1, keepdim=True)
    logp = z - z.exp().sum(-1, keepdim=True).log()
    return -logp[torch.arange(x.shape[0], device=x.device), y].mean()


def embedding(w, tokens, pos):
    return w[tokens] * np.float16(32.0) + pos


def embedding_t(w, tokens, pos):
    return w[tokens] * 32.0 + pos


def channel_norm(x, g):
    mu = x.mean(axis=1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(var + np.float16(1e-6)) * g


def channel_norm_t(x, g):
    mu = x.mean(1, keepdim=True)
    var = ((x - mu) ** 2).mean(1, keepdim=True)
    return (x - mu) / (var + 1e-6).sqrt() * g


def class_softmax(logits):
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def class_softmax_t(logits):
    return logits.softmax(1)


def batch_norm_train(x):
    mu = x.mean(axis=(0, 2, 3), keepdims=True)
    var = ((x - mu) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    return (x - mu) / np.sqrt(var + np.float32(1e-5))


def batch_norm_train_t(x):
    mu = x.mean((0, 2, 3), keepdim=True)
    var = ((x - mu) ** 2).mean((0, 2, 3), keepdim=True)
    return (x - mu) / (var + 1e-5).sqrt()


PROGRAMS: list[Program] = [
    Program("gelu_tanh_f32", F32, lambda s: [((_n(s, 1 << 26),), "x")], gelu_tanh, gelu_tanh_t),
    Program("residual_rms_norm_f16", F16,
            lambda s: [((_n(s, 16384), 4096), "x"), ((_n(s, 16384), 4096), "x"),
                       ((4096,), "x")], rms_norm, rms_norm_t),
    Program("colsum_scale_f32", F32, lambda s: [((_n(s, 16384), 4096), "x"), ((4096,), "x")],
            colsum_scale, colsum_scale_t),
    Program("relu_mlp_f16", F16,
            lambda s: [((_n(s, 4096), _n(s, 1024)), "x"), ((_n(s, 1024), _n(s, 4096)), "w"),
                       ((_n(s, 4096),), "x"), ((_n(s, 4096), _n(s, 1024)), "w"),
                       ((_n(s, 1024),), "x")], relu_mlp, relu_mlp_t, memory_bound=False),
    Program("softmax_rows_f16", F16, lambda s: [((_n(s, 32768), 1024), "x")], softmax_rows,
            softmax_rows_t),
    Program("layer_norm_f16", F16,
            lambda s: [((_n(s, 16384), 4096), "x"), ((4096,), "x"), ((4096,), "x")],
            layer_norm, layer_norm_t),
    # a training layer norm's forward: the mean and inverse deviation kept for backward
    Program("layer_norm_train_f32", F32,
            lambda s: [((_n(s, 8192), 4096), "x"), ((4096,), "x"), ((4096,), "x")],
            layer_norm_train, layer_norm_train_t),
    Program("attention_f16", F16,
            lambda s: [((_n(s, 16, 1), 16, _n(s, 1024), 64), "x")] * 3, attention, attention_t,
            memory_bound=False),
    Program("log_softmax_f32", F32, lambda s: [((_n(s, 16384), 2048), "x")], log_softmax,
            log_softmax_t),
    Program("cross_entropy_f32", F32,
            lambda s: [((_n(s, 8192), 4096), "x"), ((_n(s, 8192), 4096), "onehot")],
            cross_entropy, cross_entropy_t),
    Program("swiglu_f16", F16,
            lambda s: [((_n(s, 4096), _n(s, 1024)), "x"), ((_n(s, 1024), _n(s, 2816)), "w"),
                       ((_n(s, 1024), _n(s, 2816)), "w"), ((_n(s, 2816), _n(s, 1024)), "w")],
            swiglu, swiglu_t, memory_bound=False),
    # the two MLPs again in bfloat16, the dtype Hopper models train and serve in
    Program("relu_mlp_bf16", BF16,
            lambda s: [((_n(s, 4096), _n(s, 1024)), "x"), ((_n(s, 1024), _n(s, 4096)), "w"),
                       ((_n(s, 4096),), "x"), ((_n(s, 4096), _n(s, 1024)), "w"),
                       ((_n(s, 1024),), "x")], relu_mlp, relu_mlp_t, memory_bound=False),
    Program("swiglu_bf16", BF16,
            lambda s: [((_n(s, 4096), _n(s, 1024)), "x"), ((_n(s, 1024), _n(s, 2816)), "w"),
                       ((_n(s, 1024), _n(s, 2816)), "w"), ((_n(s, 2816), _n(s, 1024)), "w")],
            swiglu, swiglu_t, memory_bound=False),
    Program("adam_step_f32", F32, lambda s: [((_n(s, 1 << 24),), "x"), ((_n(s, 1 << 24),), "x"),
                                             ((_n(s, 1 << 24),), "x"),
                                             ((_n(s, 1 << 24),), "pos")],
            adam_step, adam_step_t),
    Program("rotary_f16", F16,
            lambda s: [((_n(s, 8, 1), _n(s, 4096, 16), 32, 128), "x"),
                       ((_n(s, 4096, 16), 1, 64), "x"), ((_n(s, 4096, 16), 1, 64), "x")],
            rotary, rotary_t),
    Program("row_std_f32", F32, lambda s: [((_n(s, 16384), 4096), "x")], row_std, row_std_t),
    Program("middle_axis_sum_f32", F32, lambda s: [((_n(s, 64, 2), 1024, 1024), "x")],
            middle_sum, middle_sum_t),
    Program("masked_softmax_f32", F32,
            lambda s: [((_n(s, 8192), 2048), "x"), ((_n(s, 8192), 2048), "mask")],
            masked_softmax, masked_softmax_t),
    Program("sigmoid_gate_f16", F16,
            lambda s: [((_n(s, 1 << 26),), "x"), ((_n(s, 1 << 26),), "x")], sigmoid_gate,
            sigmoid_gate_t),
    Program("sigmoid_gate_bf16", BF16,
            lambda s: [((_n(s, 1 << 26),), "x"), ((_n(s, 1 << 26),), "x")], sigmoid_gate,
            sigmoid_gate_t),
    Program("l2_normalize_f32", F32, lambda s: [((_n(s, 16384), 2048), "x")], l2_normalize,
            l2_normalize_t),
    Program("polynomial_f32", F32, lambda s: [((_n(s, 1 << 26),), "x")], polynomial,
            polynomial_t),
    Program("batch_norm_inference_f32", F32,
            lambda s: [((_n(s, 64, 2), 256, 56 * 56), "x"), ((256, 1), "x"), ((256, 1), "pos"),
                       ((256, 1), "x"), ((256, 1), "x")], batch_norm_infer, batch_norm_infer_t),
    Program("sum_of_squares_f32", F32, lambda s: [((_n(s, 1 << 26),), "x")], full_sum_sq,
            full_sum_sq_t),
    Program("bce_with_logits_f32", F32,
            lambda s: [((_n(s, 8192), 4096), "x"), ((_n(s, 8192), 4096), "onehot")],
            bce_with_logits, bce_with_logits_t),
    Program("time_embedding_f32", F32,
            lambda s: [((_n(s, 1 << 18),), "pos"), ((128,), "pos")], time_embedding,
            time_embedding_t),
    Program("gelu_erf_f32", F32, lambda s: [((_n(s, 1 << 26),), "x")], gelu_erf, gelu_erf_t),
    Program("cross_entropy_labels_f32", F32,
            lambda s: [((_n(s, 8192), 4096), "x"), ((_n(s, 8192),), "labels")],
            cross_entropy_labels, cross_entropy_labels_t),
    # the table is read in rows the tokens name (some twice): not a bandwidth program
    # a ConvNeXt-style layer norm over the channels of an NCHW activation
    Program("channel_norm_f16", F16,
            lambda s: [((_n(s, 16, 2), 256, _n(s, 56 * 56)), "x"), ((256, 1), "x")],
            channel_norm, channel_norm_t),
    # per-pixel class probabilities of a segmentation network's NCHW logits (19 classes)
    Program("class_softmax_f32", F32,
            lambda s: [((_n(s, 4, 2), 19, _n(s, 512 * 1024)), "x")], class_softmax,
            class_softmax_t),
    # a training-mode batch norm's forward: statistics over N, H and W of NCHW
    Program("batch_norm_train_f32", F32,
            lambda s: [((_n(s, 32, 2), 256, 28, 28), "x")], batch_norm_train,
            batch_norm_train_t),
    Program("embedding_f16", F16,
            lambda s: [((_n(s, 32000), 1024), "x"), ((_n(s, 16384),), "rows"),
                       ((_n(s, 16384), 1024), "x")],
            embedding, embedding_t, memory_bound=False),
]
