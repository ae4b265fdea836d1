"""In-kernel inference against onnxruntime and torch eager (GPU lane; a CPU comparison too).

1. **Models**: each zoo model (``pl.inference.zoo``) and one ONNX CNN shipped inside the
   ``onnx`` package (``light_resnet50``: ResNet-50's graph with constant weights; its
   batch axis made free). Every implementation is checked against onnxruntime (CPU) on
   random inputs before it is timed.
2. **Latency at batch 1 (median and p99 of at least 200 calls when they fit in the
   time) and throughput at batches 1..4096**: host wall time of one call
   including the device synchronisation (what a caller waits for), through
   ``pyc_lab.profiling.benchmark`` (``gpu=False``: the calls block), median of the
   repeats; throughput = rows / median. pyc_lab runs the model compiled by
   ``pl.inference.load`` (cupy backend, CUDA graphs, on a GPU; NumPy on the CPU);
   onnxruntime runs its CUDA execution provider with IOBinding (device-resident inputs
   and outputs) when it has one, else its CPU provider (the provider is recorded);
   torch runs the same ONNX graph op by op in eager mode (``torch.nn.functional``) and,
   on a GPU, the same function through ``torch.compile(mode="reduce-overhead")``
   (Inductor kernels replayed from CUDA graphs). onnxruntime's CUDA provider runs twice:
   with IOBinding, and with IOBinding and its CUDA graphs (one per input shape) where the
   model allows them; the better of the two is the baseline.
3. **Dynamic batching** under 64 concurrent clients (``pl.inference.load_test``):
   throughput and p99 with ``max_delay_ms=2`` at ``max_batch`` 64, 32 and 16 (the
   sweep Triton's model analyzer makes: with as many clients as one batch holds, the
   clients wait while it runs; smaller batches let one run while the next fills) vs
   unbatched (``max_batch=1``), each with the batch's compute time for the p99 target
   (p99 <= max_delay_ms + 2 x compute), for every zoo model (``models``; requests of
   one row). Per model ``throughput_ratio`` is the best setting's (named in ``best``),
   ``throughput_ratio_max_batch_64`` the plain setting's; ``throughput_ratios`` and
   ``min_ratio`` gather them, and the first model's (the astro MLP, the cheapest: its
   request path weighs most) are repeated at the top level. The ResNet is left out:
   at batch 1 its float32 convolutions already keep the GPU busy, so batching cannot
   multiply its throughput tenfold (its batch-128 rows per second are in part 2).
   Part 3 runs in a child process of its own (``--batching-only``): a process that has
   held onnxruntime's sessions, torch's and the other models' graphs serves the same
   requests more slowly.

    python benchmarks/bench_inference.py --out benchmarks/results/h200
    python benchmarks/bench_inference.py --small          # a CPU smoke run, prints only
    python benchmarks/bench_inference.py --batching-only  # part 3 alone

On a machine without a GPU it runs the CPU comparison (say so in the JSON's
``device``) unless ``--require-gpu`` is given, in which case it stops with the device
gate's reason.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import versions, write_result

log = logging.getLogger("bench_inference")

BATCHES = (1, 4, 16, 64, 256, 1024, 4096)
SMALL_BATCHES = (1, 64, 1024)
CNN_BATCHES = (1, 8, 32, 128)


# -- the shipped CNN ------------------------------------------------------------------------------
def shipped_cnn() -> Any:
    """``light_resnet50`` from the onnx package, with a free batch axis and random weights.

    The shipped graph makes every weight with ``ConstantOfShape`` (one value repeated),
    so every output row is the same and a wrong convolution could still match the
    reference. Each such weight becomes a seeded random initializer of its shape:
    filters and the classifier ``N(0, 1/fan_in)``, batch-norm scales and variances
    ``U(0.5, 1.5)`` (a residual branch's last scale ``U(0.05, 0.15)``), biases and means
    ``U(-0.1, 0.1)``, so that the logits stay in a range where the softmax tells the
    inputs apart.
    """
    import onnx
    from onnx import numpy_helper

    path = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
    m = onnx.load(str(path))
    produced = {o for n in m.graph.node for o in n.output}
    for inp in m.graph.input:
        if inp.name not in produced:
            inp.type.tensor_type.shape.dim[0].dim_param = "N"
    for out in m.graph.output:
        out.type.tensor_type.shape.dim[0].dim_param = "N"
    inits = {i.name: i for i in m.graph.initializer}
    # the final Reshape's target [1, 2048] -> [0, 2048] (keep the batch)
    if "OC2_DUMMY_1" in inits:
        v = numpy_helper.to_array(inits["OC2_DUMMY_1"]).copy()
        v[0] = 0
        inits["OC2_DUMMY_1"].CopyFrom(numpy_helper.from_array(v, "OC2_DUMMY_1"))
    rng = np.random.default_rng(2026)
    keep = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape" and n.input and n.input[0] in inits:
            shape = [int(d) for d in numpy_helper.to_array(inits[n.input[0]])]
            name = n.output[0]
            if len(shape) >= 2:
                w = rng.standard_normal(shape) / np.sqrt(int(np.prod(shape[1:])))
            elif name.endswith(("_b_0", "_rm_0")):
                w = rng.uniform(-0.1, 0.1, shape)
            elif name.endswith("branch2c_bn_s_0"):  # small residual branches
                w = rng.uniform(0.05, 0.15, shape)
            else:
                w = rng.uniform(0.5, 1.5, shape)
            m.graph.initializer.append(numpy_helper.from_array(w.astype(np.float32), name))
            m.graph.input.append(onnx.helper.make_tensor_value_info(  # IR < 4 wants it
                name, onnx.TensorProto.FLOAT, shape))
        else:
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    m.graph.name = "resnet50_light"
    return m


def cnn_conv_problems(m: Any) -> list[dict[str, Any]]:
    """The distinct convolutions of ``m`` imported channels last, as ``pl.conv`` is called
    inside the compiled program (the bias folded from batch normalisation, a residual
    block's add and a following relu in the call), at batch 1: the NumPy program run once
    with ``pl.conv`` watched."""
    import pyc_lab as pl
    from pyc_lab.kernels import conv as kconv

    model = pl.inference.load(m, backend="numpy", layout="channels_last")
    seen: dict[tuple, dict[str, Any]] = {}
    real = kconv.conv

    def watch(x, w, bias=None, **kw):
        n, h, wd, c = x.shape  # channels last
        residual = kw.get("residual") is not None
        key = (tuple(x.shape), tuple(w.shape), bias is not None, residual,
               *(str(kw.get(k)) for k in ("stride", "padding", "dilation", "groups",
                                          "activation")))
        seen.setdefault(key, {"x": (n, c, h, wd), "w": tuple(w.shape), "bias": bias is not None,
                              "residual": residual,
                              **{k: kw.get(k) for k in ("stride", "padding", "dilation",
                                                        "groups", "activation")}})
        return real(x, w, bias, **kw)

    kconv.conv = watch
    try:
        feeds = cnn_inputs(m, 1, 0)
        model.run([feeds[k] for k in model.input_names])
    finally:
        kconv.conv = real
    return list(seen.values())


def cnn_config_wanted(config: Any) -> bool:
    """The CUTLASS configurations the ResNet's tuning races: 3 stages, 128x64 and 64x64
    tiles (what won every ResNet-50 layer at batch 128 in ``issue15-c84acc4``)."""
    return getattr(config, "stages", 0) == 3 and config.tile[:2] in ((128, 64), (64, 64))


def prebuild_cnn_kernels(m: Any, directory: str) -> None:
    """Build, into kernel cache ``directory`` and without a GPU, every 3xTF32 CUTLASS 2
    kernel :func:`tune_cnn_convs` races for ``m`` (one build per library: layers share
    most), so that a GPU run carrying it starts warm."""
    from pyc_lab.kernels.cache import KernelCache
    from pyc_lab.kernels.cutlass.conv import ConvKernel
    from pyc_lab.kernels.cutlass.conv_2x import build_conv2x, conv2x_configs, conv2x_widths
    from pyc_lab.kernels.cutlass.nvcc import build_parallel

    jobs: dict[tuple, None] = {}
    for p in cnn_conv_problems(m):
        if p["groups"] != 1:
            continue
        c, k = p["x"][1], p["w"][0]
        kernel = ConvKernel("f32", 2, p["bias"], p["activation"], residual=p["residual"])
        for cfg in conv2x_configs(kernel, c, k):
            if cnn_config_wanted(cfg):
                jobs[(cfg, kernel, *conv2x_widths(cfg, kernel, c, k))] = None
    cache = KernelCache(directory)

    def build(job: tuple) -> Any:
        cfg, kernel, align, align_out = job
        return build_conv2x(cfg, kernel, align, cache=cache, align_out=align_out)

    for job, future in build_parallel(list(jobs), build, name="pyc-nvcc-cnn").items():
        res = future.result()
        log.info("%s %s %s %.0f s %s", res.status, job[1], job[0].id, res.seconds,
                 res.message[:200])


def tune_cnn_convs(m: Any, batches: tuple[int, ...], budget_s: float) -> dict[str, Any]:
    """``pl.autotune_conv(dtype="f32")`` for each convolution of the channels-last
    import at each batch (float32 at float32's accuracy: the 3xTF32 CUTLASS kernels
    against cuDNN with TF32 off; the 128x64 and 64x64 tiles at 3 stages, what won every
    ResNet-50 layer at batch 128 in ``issue15-c84acc4``), within ``budget_s``. What
    ``pl.conv`` then races in the compiled model."""
    import time

    import pyc_lab as pl

    t0 = time.perf_counter()
    rows = []
    problems = cnn_conv_problems(m)
    for batch in sorted(batches, reverse=True):  # the largest first: where the work is
        for p in problems:
            if time.perf_counter() - t0 > budget_s:
                rows.append({"batch": batch, "problem": str(p), "skipped": "budget"})
                continue
            if p["groups"] != 1:
                continue
            try:
                res = pl.autotune_conv((batch, *p["x"][1:]), p["w"], stride=p["stride"],
                                       padding=p["padding"], dilation=p["dilation"],
                                       dtype="f32", bias=p["bias"],
                                       activation=p["activation"], residual=p["residual"],
                                       repeats=5, max_candidates=None,
                                       restrict=cnn_config_wanted)
                best = res.best
                rows.append({"batch": batch, "x": (batch, *p["x"][1:]), "w": p["w"],
                             "stride": p["stride"], "activation": p["activation"],
                             "residual": p["residual"],
                             "cudnn_ms": res.baselines.get("cudnn"),
                             "best_ms": best.time_ms if best is not None and best.ok else None,
                             "best": best.config if best is not None else None})
            except Exception as exc:  # a problem the kernels cannot take: recorded
                rows.append({"batch": batch, "x": (batch, *p["x"][1:]), "w": p["w"],
                             "error": f"{type(exc).__name__}: {exc}"[:300]})
    wins = [r["cudnn_ms"] / r["best_ms"] for r in rows if r.get("best_ms")]
    return {"rows": rows, "seconds": time.perf_counter() - t0,
            "tuned_vs_cudnn_median": statistics.median(wins) if wins else None}


def cnn_inputs(m: Any, batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    produced = {o for n in m.graph.node for o in n.output}
    inits = {i.name for i in m.graph.initializer}
    out = {}
    for inp in m.graph.input:
        if inp.name in produced or inp.name in inits:
            continue
        dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        out[inp.name] = rng.standard_normal((batch, *dims[1:])).astype(np.float32)
    return out


# -- torch eager: the ONNX graph op by op ------------------------------------------------
def torch_runner(m: Any, device: str) -> Any:
    """A function running ONNX graph ``m`` op by op with torch (eager), on ``device``."""
    import torch
    import torch.nn.functional as F
    from onnx import helper, numpy_helper

    consts = {t.name: torch.as_tensor(numpy_helper.to_array(t).copy()).to(device)
              for t in m.graph.initializer}

    def attrs(n):
        return {a.name: helper.get_attribute_value(a) for a in n.attribute}

    def conv(x, w, b, a):
        nd = w.dim() - 2
        pads = a.get("pads", [0] * 2 * nd)
        if any(p != q for p, q in zip(pads[:nd], pads[nd:], strict=True)):
            x = F.pad(x, [v for i in reversed(range(nd)) for v in (pads[i], pads[i + nd])])
            pads = [0] * 2 * nd
        f = F.conv1d if nd == 1 else F.conv2d
        return f(x, w, b, stride=a.get("strides", [1] * nd), padding=pads[:nd],
                 dilation=a.get("dilations", [1] * nd), groups=a.get("group", 1))

    def gemm(x, w, c, a):
        if a.get("transA", 0):
            x = x.t()
        if a.get("transB", 0):
            w = w.t()
        y = a.get("alpha", 1.0) * (x @ w)
        return y if c is None else y + a.get("beta", 1.0) * c

    def pool(kind, x, a):
        k = a["kernel_shape"]
        nd = len(k)
        pads = a.get("pads", [0] * 2 * nd)
        f = {("max", 1): F.max_pool1d, ("max", 2): F.max_pool2d, ("avg", 1): F.avg_pool1d,
             ("avg", 2): F.avg_pool2d}[(kind, nd)]
        kw = {} if kind == "max" else {"count_include_pad": bool(a.get("count_include_pad", 0))}
        return f(x, k, stride=a.get("strides", k), padding=pads[:nd], **kw)

    def run(feeds: dict[str, Any]) -> list[Any]:
        env = dict(consts)
        env.update(feeds)
        for n in m.graph.node:
            a = attrs(n)
            x = [env[i] if i else None for i in n.input]
            op = n.op_type
            if op == "Gemm":
                y = gemm(x[0], x[1], x[2] if len(x) > 2 else None, a)
            elif op == "MatMul":
                y = x[0] @ x[1]
            elif op == "Conv":
                y = conv(x[0], x[1], x[2] if len(x) > 2 else None, a)
            elif op == "BatchNormalization":
                y = F.batch_norm(x[0], x[3], x[4], x[1], x[2], False, 0.0,
                                 a.get("epsilon", 1e-5))
            elif op == "Relu":
                y = torch.relu(x[0])
            elif op == "Gelu":
                approx = a.get("approximate", b"none")
                y = F.gelu(x[0], approximate=approx.decode() if isinstance(approx, bytes)
                           else approx)
            elif op in ("Add", "Sum"):
                y = x[0]
                for t in x[1:]:
                    y = y + t
            elif op == "Mul":
                y = x[0] * x[1]
            elif op == "Sqrt":
                y = torch.sqrt(x[0])
            elif op == "Reciprocal":
                y = torch.reciprocal(x[0])
            elif op == "Transpose":
                y = x[0].permute(*a["perm"])
            elif op in ("ReduceSum", "ReduceMean"):
                dims = [int(v) for v in x[1].tolist()]
                keep = bool(a.get("keepdims", 1))
                y = x[0].sum(dim=dims, keepdim=keep) if op == "ReduceSum" else \
                    x[0].mean(dim=dims, keepdim=keep)
            elif op == "GlobalAveragePool":
                y = x[0].mean(dim=list(range(2, x[0].dim())), keepdim=True)
            elif op == "Flatten":
                y = torch.flatten(x[0], a.get("axis", 1))
            elif op == "Identity":
                y = x[0]
            elif op == "MaxPool":
                y = pool("max", x[0], a)
            elif op == "AveragePool":
                y = pool("avg", x[0], a)
            elif op == "Reshape":
                shape = [int(v) for v in x[1].tolist()]
                shape = [x[0].shape[i] if s == 0 else s for i, s in enumerate(shape)]
                y = x[0].reshape(shape)
            elif op == "Softmax":
                y = torch.softmax(x[0], dim=a.get("axis", 1))
            elif op == "ConstantOfShape":
                v = numpy_helper.to_array(a["value"]) if "value" in a else np.zeros(1)
                y = torch.full([int(s) for s in x[0].tolist()], float(v.reshape(-1)[0]),
                               device=device)
            else:
                raise NotImplementedError(f"torch eager runner: no {op}")
            env[n.output[0]] = y
        return [env[o.name] for o in m.graph.output]

    return run


# -- the implementations ---------------------------------------------------------------
def implementations(m: Any, gpu: bool, channels_last: bool = False,
                    only: set[str] | None = None) -> dict[str, Any]:
    """name -> (prepare(feeds) -> state, call(state) -> outputs as NumPy, info); pyc_lab
    with ``load``'s default layout (``pyc_lab``, ``pyc_lab_io_binding``), and with
    ``channels_last`` also the bound calls of the model imported with each layout named
    (``pyc_lab_channels_first``, ``pyc_lab_channels_last``); ``only``: those names."""
    out = _implementations(m, gpu, channels_last)
    return out if only is None else {k: v for k, v in out.items() if k in only}


def _implementations(m: Any, gpu: bool, channels_last: bool) -> dict[str, Any]:
    import pyc_lab as pl

    out: dict[str, Any] = {}
    model = pl.inference.load(m, backend="cupy" if gpu else "numpy", cuda_graph=gpu)
    if gpu:
        import cupy as cp

        def pl_prep(feeds):
            return [cp.asarray(feeds[n]) for n in model.input_names]

        def pl_call(state):
            outs = model.run(state)
            cp.cuda.Device().synchronize()
            return outs

        def pl_host(outs):
            return [cp.asnumpy(o) for o in outs]
    else:
        def pl_prep(feeds):
            return [feeds[n] for n in model.input_names]

        def pl_call(state):
            return model.run(state)

        def pl_host(outs):
            return outs
    layout = _layout_of(model)
    out["pyc_lab"] = (pl_prep, pl_call, pl_host, {"backend": "cupy" if gpu else "numpy",
                                                   "cuda_graph": gpu, "layout": layout})
    if gpu:  # like onnxruntime's IOBinding with CUDA graphs: inputs and outputs in place
        def bound_prep(feeds):
            return model.io_binding(pl_prep(feeds))

        def bound_call(run):
            outs = run()
            cp.cuda.Device().synchronize()
            return outs

        out["pyc_lab_io_binding"] = (bound_prep, bound_call, pl_host,
                                     {"backend": "cupy", "cuda_graph": True, "layout": layout,
                                      "api": "model.io_binding(inputs)(): outputs are the "
                                             "graphs' own arrays, valid until the next run"})
        out["pyc_lab_io_binding_no_small_gemm"] = _without_small_gemm(m, bound_call, pl_host)
        for named in ("channels_first", "channels_last") if channels_last else ():
            other = pl.inference.load(m, backend="cupy", cuda_graph=True, layout=named)

            def named_prep(feeds, other=other):
                return other.io_binding([cp.asarray(feeds[n]) for n in other.input_names])

            out[f"pyc_lab_{named}"] = (
                named_prep, bound_call, pl_host,
                {"backend": "cupy", "cuda_graph": True, "layout": named,
                 "api": f"model.io_binding(inputs)() of the model loaded with "
                        f"layout={named!r}"})

    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if ort is not None:
        out.update(onnxruntime_implementations(ort, m, gpu))

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        device = "cuda" if gpu and torch.cuda.is_available() else "cpu"
        run = torch_runner(m, device)

        def t_prep(feeds):
            return {k: torch.as_tensor(v).to(device) for k, v in feeds.items()}

        def t_call(state):
            with torch.inference_mode():
                outs = run(state)
            if device == "cuda":
                torch.cuda.synchronize()
            return outs

        def t_host(outs):
            return [o.cpu().numpy() for o in outs]

        out["torch_eager"] = (t_prep, t_call, t_host, {"device": device,
                                                       "version": torch.__version__})
        if device == "cuda":  # the strongest GPU baseline here: CUDA graphs, Inductor
            compiled = torch.compile(run, mode="reduce-overhead")

            def tc_call(state):
                with torch.inference_mode():
                    outs = compiled(state)
                torch.cuda.synchronize()
                return outs

            def tc_host(outs):  # CUDA-graph outputs are overwritten by the next call
                return [o.clone().cpu().numpy() for o in outs]

            out["torch_compile"] = (t_prep, tc_call, tc_host,
                                    {"device": device, "mode": "reduce-overhead",
                                     "version": torch.__version__})
    return out


def _layout_of(model: Any) -> str:
    """The layout ``pl.inference.load`` chose for an ONNX model's convolutions."""
    imported = getattr(model, "imported", None)
    return imported.layout if imported is not None else "channels_first"


def _without_small_gemm(m: Any, call: Any, host: Any) -> tuple[Any, Any, Any, dict]:
    """The bound call of a second copy of the model whose programs are lowered without
    the small GEMM (every matmul the library GEMM and its epilogue): the same run's
    baseline for what the small GEMM changes."""
    import cupy as cp

    import pyc_lab as pl
    from pyc_lab.compiler.backend import small_gemm

    model = pl.inference.load(m, backend="cupy", cuda_graph=True)

    def prep(feeds):
        small_gemm.ENABLED = False  # the programs are lowered (and captured) here
        try:
            return model.io_binding([cp.asarray(feeds[n]) for n in model.input_names])
        finally:
            small_gemm.ENABLED = True

    return prep, call, host, {"backend": "cupy", "cuda_graph": True, "small_gemm": False}


def onnxruntime_implementations(ort: Any, m: Any, gpu: bool) -> dict[str, Any]:
    """onnxruntime's runs of ``m``: on a GPU its CUDA execution provider with IOBinding
    (device-resident inputs and outputs), and the same with the provider's CUDA graphs
    where the model allows them (every node on the CUDA provider); else its CPU provider.

    Both CUDA runs keep full float32 (``use_tf32=0``), as pyc_lab does.
    """
    providers = ort.get_available_providers()
    if not (gpu and "CUDAExecutionProvider" in providers):
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])

        def cpu_call(state):
            return sess.run(None, state)

        return {"onnxruntime": (lambda feeds: feeds, cpu_call, lambda outs: outs,
                                {"provider": sess.get_providers()[0],
                                 "version": ort.__version__, "io_binding": False})}
    if hasattr(ort, "preload_dlls"):  # the CUDA, cuDNN libraries of the nvidia wheels
        try:
            ort.preload_dlls()
        except Exception as exc:
            log.warning("onnxruntime.preload_dlls: %s", exc)
    out: dict[str, Any] = {}
    for name, graphs in (("onnxruntime_cuda", False), ("onnxruntime_cuda_graph", True)):
        opts = {"use_tf32": "0", "enable_cuda_graph": "1" if graphs else "0"}
        try:
            sess = ort.InferenceSession(m.SerializeToString(),
                                        providers=[("CUDAExecutionProvider", opts),
                                                   "CPUExecutionProvider"])
        except Exception as exc:  # a model the CUDA graph mode refuses: recorded
            log.warning("%s: %s refused: %s", m.graph.name, name, exc)
            continue
        if sess.get_providers()[0] != "CUDAExecutionProvider":
            log.warning("%s: %s fell back to %s", m.graph.name, name, sess.get_providers())
            continue
        out[name] = _ort_cuda_runner(ort, sess, graphs, m)
    return out


def _ort_cuda_runner(ort: Any, sess: Any, graphs: bool, m: Any) -> tuple[Any, Any, Any, dict]:
    """(prep, call, host, info) for an onnxruntime CUDA session with IOBinding; with CUDA
    graphs the outputs are bound to arrays made once (their shapes from a CPU run), as
    the provider's graphs need fixed addresses."""
    outs_names = [o.name for o in sess.get_outputs()]
    shaper: list[Any] = []
    graph_ids = iter(range(1 << 30))  # one captured graph per binding (its addresses)

    def prep(feeds):
        options = ort.RunOptions()
        if graphs:
            options.add_run_config_entry("gpu_graph_id", str(next(graph_ids)))
        binding = sess.io_binding()
        keep = []
        for k, v in feeds.items():
            ov = ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0)
            keep.append(ov)
            binding.bind_ortvalue_input(k, ov)
        if graphs:
            if not shaper:
                shaper.append(ort.InferenceSession(m.SerializeToString(),
                                                   providers=["CPUExecutionProvider"]))
            for o, like in zip(outs_names, shaper[0].run(None, feeds), strict=True):
                ov = ort.OrtValue.ortvalue_from_shape_and_type(like.shape, like.dtype,
                                                               "cuda", 0)
                keep.append(ov)
                binding.bind_ortvalue_output(o, ov)
        else:
            for o in outs_names:
                binding.bind_output(o, "cuda")
        return binding, keep, options

    def call(state):
        binding, _, options = state
        sess.run_with_iobinding(binding, options)
        binding.synchronize_outputs()
        return binding

    def host(binding):
        return binding.copy_outputs_to_cpu()

    return prep, call, host, {"provider": sess.get_providers()[0], "version": ort.__version__,
                              "io_binding": True, "cuda_graph": graphs, "use_tf32": False}


def check(impls: dict[str, Any], feeds: dict[str, np.ndarray], want: list[np.ndarray]) -> dict:
    """Each implementation's max error relative to the output's scale, vs onnxruntime CPU."""
    errors = {}
    for name, (prep, call, host, _) in impls.items():
        got = host(call(prep(feeds)))
        errors[name] = max(float(np.abs(np.asarray(g) - w).max() / max(np.abs(w).max(), 1e-12))
                           for g, w in zip(got, want, strict=True))
    return errors


def time_model(m: Any, inputs: Any, batches: tuple[int, ...], gpu: bool,
               repeats: int, channels_last: bool = False,
               only: set[str] | None = None) -> dict[str, Any]:
    import onnxruntime as ort

    from pyc_lab.profiling import benchmark

    impls = implementations(m, gpu, channels_last, only)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = inputs(m, 3, 11)
    errors = check(impls, feeds, ref.run(None, feeds))
    bad = {k: e for k, e in errors.items() if not e < 1e-3}
    result: dict[str, Any] = {"info": {k: v[3] for k, v in impls.items()}, "max_rel_error":
                              errors, "rows": []}
    for name in bad:
        log.warning("%s: %s is wrong (max relative error %.2e); not timed", m.graph.name,
                    name, bad[name])
        impls.pop(name)
    for batch in batches:
        feeds = inputs(m, batch, batch)
        for name, (prep, call, _, _) in impls.items():
            try:
                state = prep(feeds)
                # batch 1 is the latency point: enough calls for a p99
                n = max(repeats, 200) if batch == 1 else repeats
                t = benchmark(call, (state,), repeats=n, warmup=3, gpu=False,
                              min_time_s=0.5, name=name)
                med = statistics.median(t.cpu_s)
                result["rows"].append({"impl": name, "batch": batch, "median_ms": med * 1e3,
                                       "p99_ms": float(np.percentile(t.cpu_s, 99)) * 1e3,
                                       "rows_per_s": batch / med, "repeats": len(t.cpu_s)})
            except Exception as exc:  # record, keep going (out of memory at 4096 ...)
                result["rows"].append({"impl": name, "batch": batch,
                                       "error": f"{type(exc).__name__}: {exc}"[:300]})
        log.info("%s batch %d done", m.graph.name, batch)
    result["vs_onnxruntime_cuda"] = against_onnxruntime_cuda(result["rows"])
    return result


def against_onnxruntime_cuda(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """pyc_lab against the better onnxruntime CUDA run at each batch: the throughput
    ratio (target >= 1.5) and, at batch 1, both p99 latencies (target: pyc_lab's is not
    above onnxruntime's) — for ``model.run`` (fresh output arrays) and for
    ``model.io_binding`` (inputs and outputs in place, as onnxruntime's IOBinding with
    CUDA graphs). ``None`` where onnxruntime's CUDA provider did not run."""
    by: dict[int, dict[str, dict]] = {}
    for r in rows:
        if "median_ms" in r:
            by.setdefault(r["batch"], {})[r["impl"]] = r
    out: dict[str, Any] = {}
    for ours, suffix in (("pyc_lab", ""), ("pyc_lab_io_binding", "_io_binding"),
                         ("pyc_lab_channels_first", "_channels_first"),
                         ("pyc_lab_channels_last", "_channels_last")):
        ratios = {}
        p99 = None
        for batch, impls in sorted(by.items()):
            ort = [impls[k] for k in ("onnxruntime_cuda", "onnxruntime_cuda_graph")
                   if k in impls]
            if not ort or ours not in impls:
                continue
            best = max(ort, key=lambda r: r["rows_per_s"])
            ratios[str(batch)] = impls[ours]["rows_per_s"] / best["rows_per_s"]
            if batch == 1:
                low = min(ort, key=lambda r: r["p99_ms"])
                p99 = {"pyc_lab_ms": impls[ours]["p99_ms"], "onnxruntime_ms": low["p99_ms"],
                       "within_target": impls[ours]["p99_ms"] <= low["p99_ms"]}
        if ratios:
            out.update({f"throughput_ratio{suffix}": ratios,
                        f"min_ratio{suffix}": min(ratios.values()),
                        f"throughput_within_target{suffix}": min(ratios.values()) >= 1.5,
                        f"batch1_p99{suffix}": p99})
    return out or None


#: The batched settings measured under 64 clients: (max_batch, max_delay_ms).
BATCHED_SETTINGS = ((64, 2.0), (32, 2.0), (16, 2.0))


def dynamic_batching(duration_s: float, names: list[str],
                     clients: tuple[str, ...] = ("loop",)) -> dict[str, Any]:
    """64 clients: each of :data:`BATCHED_SETTINGS` vs max_batch=1, for each zoo model
    of ``names`` (requests of one row from ``zoo.example_inputs``), for each placement
    of the clients (``load_test``'s ``clients``: on an event loop thread of their own,
    or callbacks on the server's worker thread) — batched and unbatched always measured
    with the same one. ``by_clients`` holds each; the first placement's figures are
    also given at the top level, and its first model's above them (the astro MLP: the
    cheapest model, where the request path weighs most)."""
    from pyc_lab.inference import zoo

    by_clients = {}
    for placement in clients:
        per_model = {name: _batching_one(name, duration_s, placement) for name in names}
        ratios = {name: r["throughput_ratio"] for name, r in per_model.items()}
        by_clients[placement] = {
            "models": per_model, "throughput_ratios": ratios,
            "min_ratio": min(ratios.values()),
            "p99_within_target_all": all(r["p99_within_target"]
                                         for r in per_model.values())}
    top = by_clients[clients[0]]
    return {**top["models"][names[0]], "model": names[0], **top, "clients": clients[0],
            "by_clients": by_clients, "zoo": zoo.names()}


def _batching_one(name: str, duration_s: float, clients: str = "loop") -> dict[str, Any]:
    import pyc_lab as pl
    from pyc_lab.inference import zoo

    model = pl.inference.load(zoo.build(name))
    named = zoo.example_inputs(name, 1, 7)
    inputs = [named[n] for n in model.input_names]
    out: dict[str, Any] = {"settings": {}}
    runs = [(f"max_batch={mb}", mb, delay) for mb, delay in BATCHED_SETTINGS]
    for label, mb, delay in [*runs, ("unbatched", 1, 0.0)]:
        with pl.serve(model, max_batch=mb, max_delay_ms=delay) as server:
            frame = pl.inference.load_test(server, [64], duration_s=duration_s,
                                           warmup_s=0.5, inputs=inputs, clients=clients)
            row = frame.iloc[0].to_dict()
            row["batch_hist"] = {str(k): v for k, v in row["batch_hist"].items()}
            row["warmup_ms"] = {str(k): v for k, v in frame.attrs["warmup_ms"].items()}
            ex = server._batcher(None).executor
            row["executor"] = "host (model.run)" if inspect.ismethod(ex) else type(ex).__name__
            row["p99_target_ms"] = delay + 2 * (row["compute_p99_ms"] or 0.0)
            row["p99_within_target"] = bool(row["p99_ms"] <= row["p99_target_ms"])
        if label == "unbatched":
            out["unbatched"] = row
        else:
            out["settings"][label] = row
        log.info("%s %s (clients on the %s): %.0f requests/s, p99 %.2f ms", name, label,
                 clients, row["throughput_rps"], row["p99_ms"])
    u = out["unbatched"]["throughput_rps"]
    best = max(out["settings"], key=lambda k: out["settings"][k]["throughput_rps"])
    b = out["batched"] = out["settings"][best]
    out["best"] = best
    out["throughput_ratio"] = b["throughput_rps"] / u
    out["throughput_ratio_max_batch_64"] = out["settings"]["max_batch=64"]["throughput_rps"] / u
    out["p99_target_ms"] = b["p99_target_ms"]
    out["p99_within_target"] = b["p99_within_target"]
    return out


def batching_in_child(args: argparse.Namespace) -> dict[str, Any] | None:
    """The dynamic-batching part run as ``--batching-only`` in a child process (the same
    settings, its JSON read back): measured where nothing else has run. ``None``, said
    why, where the child fails."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pyc-batching-") as out:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--batching-only", "--out", out,
               "--batching-s", str(args.batching_s),
               "--batching-clients", *args.batching_clients]
        cmd += ["--small"] if args.small else []
        cmd += ["--models", *args.models] if args.models else []
        run = subprocess.run(cmd, capture_output=True, text=True)
        sys.stderr.write(run.stderr)
        path = Path(out) / "inference.json"
        if run.returncode != 0 or not path.exists():
            log.warning("dynamic batching (child process) failed: rc=%s", run.returncode)
            return None
        result = json.loads(path.read_text())["dynamic_batching"]
    if result is not None:
        result["process"] = "a child process that ran nothing else (--batching-only)"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write inference.json into this folder")
    parser.add_argument("--small", action="store_true", help="fewer batches and repeats")
    parser.add_argument("--require-gpu", action="store_true",
                        help="stop, saying why, where no GPU is usable")
    parser.add_argument("--models", nargs="*", help="zoo model names (default: all)")
    parser.add_argument("--no-cnn", action="store_true", help="skip the shipped ResNet-50")
    parser.add_argument("--cnn-only", action="store_true",
                        help="only the shipped ResNet-50 (no zoo models, no batching)")
    parser.add_argument("--tune-cnn", action="store_true",
                        help="tune the ResNet's convolutions (f32, 3xTF32 CUTLASS) first")
    parser.add_argument("--tune-cnn-s", type=float, default=240.0,
                        help="seconds the ResNet's tuning may start problems within")
    parser.add_argument("--cnn-batches", nargs="*", type=int,
                        help=f"the ResNet's batch sizes (default on a GPU: {CNN_BATCHES})")
    parser.add_argument("--cnn-impls", nargs="*",
                        help="only these implementations for the ResNet (default: all)")
    parser.add_argument("--batching-s", type=float, default=5.0,
                        help="measured seconds of each dynamic-batching setting")
    parser.add_argument("--batching-clients", nargs="*", default=["loop"],
                        choices=["loop", "workers"],
                        help="where the load test's clients run (each measured)")
    parser.add_argument("--no-batching", action="store_true",
                        help="skip the dynamic-batching part")
    parser.add_argument("--batching-only", action="store_true",
                        help="only the dynamic-batching part (no onnxruntime needed)")
    parser.add_argument("--prebuild-cnn", metavar="DIR",
                        help="build the ResNet tuning's kernels into DIR (nvcc, no GPU), "
                             "then stop")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.prebuild_cnn:
        prebuild_cnn_kernels(shipped_cnn(), args.prebuild_cnn)
        return 0

    from pyc_lab.hardware.device import no_gpu_reason

    reason = no_gpu_reason()
    gpu = reason is None
    if not gpu and args.require_gpu:
        print(f"bench_inference: needs a GPU here: {reason}", file=sys.stderr)
        return 2
    try:
        import onnx  # noqa: F401  (the zoo builds ONNX models)
        if not args.batching_only:
            import onnxruntime  # noqa: F401
    except ImportError as exc:
        print(f"bench_inference: needs onnx and onnxruntime ({exc}); pip install "
              "'pyc-lab[serve]' onnxruntime", file=sys.stderr)
        return 2
    from pyc_lab.inference import zoo

    batches = SMALL_BATCHES if args.small else BATCHES
    repeats = 5 if args.small else 20
    models: dict[str, Any] = {}
    payload: dict[str, Any] = {
        "mode": "gpu" if gpu else f"cpu (no GPU: {reason})",
        "method": "host wall time per call incl. device sync, pyc_lab.profiling.benchmark "
                  "(gpu=False, warmup 3, min_time_s 0.5), median",
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "inference_versions": versions("onnx", "onnxruntime", "onnxruntime-gpu", "torch",
                                       "starlette", "uvicorn"),
        "models": models, "dynamic_batching": None, "complete": False,
    }

    def save() -> None:  # after every model: a run cut short keeps what it measured
        if args.out:
            write_result(args.out, "inference", payload)

    for name in [] if args.batching_only or args.cnn_only else args.models or zoo.names():
        def inputs(m, batch, seed, name=name):
            return zoo.example_inputs(name, batch, seed)

        models[name] = time_model(zoo.build(name), inputs, batches, gpu, repeats)
        save()
    # dynamic batching in a process that has run nothing else: after the models against
    # onnxruntime and torch, or the ResNet, the same servers measured up to a fifth slower
    # (H100: 9.52-13.88x in the benchmark's process, 10.53-14.50x in a fresh one)
    if args.no_batching or args.cnn_only:
        batching = None
    elif args.batching_only:  # this process is the child (or asked for batching alone)
        batching = dynamic_batching(2.0 if args.small else args.batching_s,
                                    args.models or zoo.names(), tuple(args.batching_clients))
    else:
        batching = batching_in_child(args)
    payload["dynamic_batching"] = batching
    save()
    if not args.no_cnn and not args.batching_only and (gpu or not args.small):
        cnn_batches = tuple(args.cnn_batches) if args.cnn_batches else \
            CNN_BATCHES if gpu else (1, 8)
        cnn = shipped_cnn()
        if gpu and args.tune_cnn:
            payload["cnn_tuning"] = tune_cnn_convs(cnn, cnn_batches, args.tune_cnn_s)
            save()
        models["resnet50_light"] = time_model(
            cnn, cnn_inputs, cnn_batches, gpu, repeats, channels_last=True,
            only=set(args.cnn_impls) if args.cnn_impls else None)
        save()
    payload["complete"] = True
    save()
    summary = {name: {r["impl"]: round(r["median_ms"], 4) for r in res["rows"]
                      if r.get("batch") == 1 and "median_ms" in r}
               for name, res in models.items()}
    vs_ort = {name: res.get("vs_onnxruntime_cuda") for name, res in models.items()}
    print(json.dumps({"batch1_latency_ms": summary, "vs_onnxruntime_cuda": vs_ort,
                      "dynamic_batching_ratio": batching and {
                          placement: {k: round(v, 2) for k, v in r["throughput_ratios"].items()}
                          for placement, r in batching["by_clients"].items()}},
                     indent=1))
    if args.out:
        print(f"wrote {Path(args.out) / 'inference.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
