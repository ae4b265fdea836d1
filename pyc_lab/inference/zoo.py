"""The model zoo: five scientific models built as ONNX in code, weights from a seed.

No downloads: each builder writes the graph with ``onnx.helper`` and draws its weights
from ``numpy.random.default_rng(seed)`` (He-uniform layers, batch-norm statistics away
from the identity so that folding them is a real test). Axis 0 of every input is a free
batch dimension ``N``.

========================  ==========================================================
name                      model
========================  ==========================================================
``astro_mlp``             astrophysics: MLP 18 -> 128 (BN, ReLU) -> 64 (BN, ReLU) -> 3
``particle_cnn``          particle physics: Conv1d 4 -> 32 (k=3), ReLU, Conv1d 32 -> 32
                          (k=3), ReLU, global average pooling, Linear 32 -> 3
``materials_gcn``         materials: two graph-convolution layers 1 -> 64 -> 64 over the
                          symmetric-normalised adjacency, mean readout, Linear 64 -> 1
``materials_vae``         materials: VAE 6 -> 128 -> (mu, logvar 32) -> 128 -> 6
``biology_vae``           biology: VAE 400 -> 256 -> 256 (BN) -> (mu, logvar 32) -> 256
                          -> 256 -> 400 with a time embedding 1 -> 32 -> 32 (a
                          diffusion-style denoiser)
========================  ==========================================================

The VAEs decode the mean (``z = mu``: inference is deterministic) and return the
reconstruction, ``mu`` and ``logvar``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InferenceError

__all__ = ["MODELS", "build", "example_inputs", "names", "save"]

#: The opset the zoo is written in (Gelu, LayerNormalization and ReduceMean-with-axes
#: input are all there).
OPSET = 20
#: Graph-convolution model: atoms per (padded) molecule.
GCN_NODES = 9
#: Particle-physics model: sequence length.
CNN_LENGTH = 32


class _Builder:
    """Collects nodes and initializers; names every tensor uniquely."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._n = 0

    def name(self, base: str) -> str:
        self._n += 1
        return f"{base}_{self._n}"

    def const(self, base: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs: Any) -> Any:
        from onnx import helper

        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.name(op), **attrs))
        return outs[0] if n_out == 1 else outs

    def uniform(self, fan_in: int, shape: tuple[int, ...]) -> np.ndarray:
        bound = np.sqrt(6.0 / fan_in)
        return self.rng.uniform(-bound, bound, shape).astype(np.float32)

    def linear(self, x: str, n_in: int, n_out: int) -> str:
        w = self.const("W", self.uniform(n_in, (n_out, n_in)))
        b = self.const("B", self.rng.uniform(-0.1, 0.1, n_out).astype(np.float32))
        return self.node("Gemm", [x, w, b], transB=1)

    def batch_norm(self, x: str, n: int) -> str:
        r = self.rng
        params = [r.uniform(0.5, 1.5, n), r.normal(0, 0.1, n), r.normal(0, 0.1, n),
                  r.uniform(0.5, 1.5, n)]
        names = [self.const(k, p.astype(np.float32))
                 for k, p in zip(("gamma", "beta", "mean", "var"), params, strict=True)]
        return self.node("BatchNormalization", [x, *names], epsilon=1e-5)

    def conv1d(self, x: str, c_in: int, c_out: int, k: int) -> str:
        w = self.const("W", self.uniform(c_in * k, (c_out, c_in, k)))
        b = self.const("B", self.rng.uniform(-0.1, 0.1, c_out).astype(np.float32))
        return self.node("Conv", [x, w, b], kernel_shape=[k], pads=[k // 2, k // 2])

    def model(self, name: str, inputs: list[tuple[str, list[Any]]],
              outputs: list[tuple[str, str, list[Any]]]) -> Any:
        import onnx
        from onnx import TensorProto, helper

        for out_name, tensor, _ in outputs:
            self.nodes.append(helper.make_node("Identity", [tensor], [out_name],
                                               name=f"out_{out_name}"))
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, _, s in outputs],
            self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="pyc_lab.inference.zoo")
        m.ir_version = 9
        onnx.checker.check_model(m)
        return m


def astro_mlp(seed: int = 0) -> Any:
    """Astrophysics MLP: 18 -> 128 (BN, ReLU) -> 64 (BN, ReLU) -> 3."""
    b = _Builder(seed)
    h = b.node("Relu", [b.batch_norm(b.linear("x", 18, 128), 128)])
    h = b.node("Relu", [b.batch_norm(b.linear(h, 128, 64), 64)])
    y = b.linear(h, 64, 3)
    return b.model("astro_mlp", [("x", ["N", 18])], [("y", y, ["N", 3])])


def particle_cnn(seed: int = 0) -> Any:
    """Particle-physics 1-D CNN: Conv 4 -> 32 (k=3), ReLU, Conv 32 -> 32, ReLU, global
    average pool, Linear 32 -> 3; input ``(N, 4, 32)``."""
    b = _Builder(seed)
    h = b.node("Relu", [b.conv1d("x", 4, 32, 3)])
    h = b.node("Relu", [b.conv1d(h, 32, 32, 3)])
    h = b.node("Flatten", [b.node("GlobalAveragePool", [h])], axis=1)
    y = b.linear(h, 32, 3)
    return b.model("particle_cnn", [("x", ["N", 4, CNN_LENGTH])], [("y", y, ["N", 3])])


def materials_gcn(seed: int = 0) -> Any:
    """Materials GCN: ``H' = relu(Â H W + b)`` twice (1 -> 64 -> 64) with
    ``Â = D^-1/2 (A + I) D^-1/2`` computed in the graph, mean over atoms, Linear 64 -> 1.

    Inputs ``x`` (atom features, ``(N, 9, 1)``) and ``adj`` (0/1 symmetric adjacency,
    ``(N, 9, 9)``).
    """
    b = _Builder(seed)
    v = GCN_NODES
    a_tilde = b.node("Add", ["adj", b.const("I", np.eye(v, dtype=np.float32))])
    deg = b.node("ReduceSum", [a_tilde, b.const("axes", np.array([2], np.int64))], keepdims=1)
    dinv = b.node("Reciprocal", [b.node("Sqrt", [deg])])
    a_hat = b.node("Mul", [b.node("Mul", [dinv, a_tilde]),
                           b.node("Transpose", [dinv], perm=[0, 2, 1])])
    h = "x"
    for n_in, n_out in ((1, 64), (64, 64)):
        w = b.const("W", b.uniform(n_in, (n_in, n_out)))
        bias = b.const("B", b.rng.uniform(-0.1, 0.1, n_out).astype(np.float32))
        h = b.node("Relu", [b.node("Add", [b.node("MatMul", [a_hat, b.node("MatMul", [h, w])]),
                                            bias])])
    pooled = b.node("ReduceMean", [h, b.const("axes", np.array([1], np.int64))], keepdims=0)
    y = b.linear(pooled, 64, 1)
    return b.model("materials_gcn", [("x", ["N", v, 1]), ("adj", ["N", v, v])],
                   [("y", y, ["N", 1])])


def materials_vae(seed: int = 0) -> Any:
    """Materials VAE: 6 -> 128 -> (mu, logvar 32) -> 128 -> 6."""
    b = _Builder(seed)
    h = b.node("Relu", [b.linear("x", 6, 128)])
    mu, logvar = b.linear(h, 128, 32), b.linear(h, 128, 32)
    d = b.node("Relu", [b.linear(mu, 32, 128)])
    recon = b.linear(d, 128, 6)
    return b.model("materials_vae", [("x", ["N", 6])],
                   [("recon", recon, ["N", 6]), ("mu", mu, ["N", 32]),
                    ("logvar", logvar, ["N", 32])])


def biology_vae(seed: int = 0) -> Any:
    """Biology VAE denoiser: 400 -> 256 -> 256 (BN) -> (mu, logvar 32) -> 256 -> 256 -> 400,
    with a time embedding 1 -> 32 -> 32 (GELU) added to the latent."""
    b = _Builder(seed)
    h = b.node("Relu", [b.linear("x", 400, 256)])
    h = b.node("Relu", [b.batch_norm(b.linear(h, 256, 256), 256)])
    mu, logvar = b.linear(h, 256, 32), b.linear(h, 256, 32)
    temb = b.linear(b.node("Gelu", [b.linear("t", 1, 32)]), 32, 32)
    z = b.node("Add", [mu, temb])
    d = b.node("Relu", [b.linear(z, 32, 256)])
    d = b.node("Relu", [b.linear(d, 256, 256)])
    out = b.linear(d, 256, 400)
    return b.model("biology_vae", [("x", ["N", 400]), ("t", ["N", 1])],
                   [("denoised", out, ["N", 400]), ("mu", mu, ["N", 32]),
                    ("logvar", logvar, ["N", 32])])


#: name -> builder(seed) -> onnx.ModelProto.
MODELS: dict[str, Callable[[int], Any]] = {
    "astro_mlp": astro_mlp,
    "particle_cnn": particle_cnn,
    "materials_gcn": materials_gcn,
    "materials_vae": materials_vae,
    "biology_vae": biology_vae,
}


def names() -> list[str]:
    """The zoo's model names."""
    return list(MODELS)


def build(name: str, seed: int = 0) -> Any:
    """The zoo model ``name`` as an ``onnx.ModelProto``, weights drawn from ``seed``.

    Raises
    ------
    InferenceError
        If there is no such model, or onnx is not installed.
    """
    if name not in MODELS:
        raise InferenceError(f"no zoo model {name!r}; the zoo has {', '.join(MODELS)}")
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise InferenceError("the zoo builds ONNX models and needs onnx: pip install onnx "
                             "(or pip install 'pyc-lab[serve]')") from None
    return MODELS[name](seed)


def save(name: str, path: str | Path, seed: int = 0) -> Path:
    """Write the zoo model ``name`` to ``path`` (a ``.onnx`` file); returns the path."""
    import onnx

    path = Path(path)
    onnx.save(build(name, seed), str(path))
    return path


def example_inputs(name: str, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Realistic random inputs for zoo model ``name`` (never zeros): ``{input: array}``.

    The GCN gets a connected-ish 0/1 symmetric adjacency without self loops; the
    biology VAE a diffusion time in [0, 1).
    """
    rng = np.random.default_rng(seed)
    f32 = np.float32
    if name == "astro_mlp":
        return {"x": rng.standard_normal((batch, 18)).astype(f32)}
    if name == "particle_cnn":
        return {"x": rng.standard_normal((batch, 4, CNN_LENGTH)).astype(f32)}
    if name == "materials_gcn":
        v = GCN_NODES
        a = (rng.random((batch, v, v)) < 0.3).astype(f32)
        a = np.triu(a, 1)
        a = a + np.transpose(a, (0, 2, 1))
        return {"x": rng.standard_normal((batch, v, 1)).astype(f32), "adj": a}
    if name == "materials_vae":
        return {"x": rng.standard_normal((batch, 6)).astype(f32)}
    if name == "biology_vae":
        return {"x": rng.standard_normal((batch, 400)).astype(f32),
                "t": rng.random((batch, 1)).astype(f32)}
    raise InferenceError(f"no zoo model {name!r}; the zoo has {', '.join(MODELS)}")
