"""The live convolution runner: CUTLASS candidates built, checked against cuDNN and timed.

For one convolution (channels last, ``groups == 1``) in f16, bf16, tf32 or f32 (float32
at its own accuracy: CUTLASS 2's 3xTF32 kernels, against cuDNN with TF32 off) on this
machine's GPU — the forward one, or one of its gradients (``direction`` ``"dgrad"``:
``dy, w -> dx``; ``"wgrad"``: ``dy, x -> dw``), whose candidates are the Hopper kernels
where they take the problem (the channels a multiple of 16 bytes; unit strides for
dgrad) and the CUTLASS 2 gradient kernels (:func:`~pyc_lab.kernels.cutlass.conv_2x.
conv2x_grad_configs`: strided dgrad, wgrad with split-K), the two families
interleaved best-ranked first:

1. the candidates — the configurations worth building for the problem, best-ranked
   first, cut to ``max_candidates`` — are built in parallel into the kernel cache (a
   kernel depends on the dtype and epilogue, not on the sizes, so the layers of a
   network share them). They are of one family: the Hopper kernels' CTA tiles and
   clusters (:func:`~pyc_lab.kernels.cutlass.conv.conv_configs`) where TMA can load the
   channels, else — a stem's three channels, any count that is not a multiple of 16
   bytes — the CUTLASS 2 kernels' tiles, stages, iterators and channel padding
   (:func:`~pyc_lab.kernels.cutlass.conv_2x.conv2x_configs`, 1-D and 2-D problems);
2. each runs on inputs uniform in [-1, 1] into a NaN-poisoned output, twice, each launch
   watched for a hang, and is compared with the convolution in float32 (cuDNN with TF32
   off; the bias, a residual and the activation applied in float32); NaN/Inf or an
   error above the dtype's tolerance rejects it, with the reason;
3. correct ones are timed with the tuner's one timing
   (:func:`~pyc_lab.kernels.tuning.gemm_runner.gpu_ms`: CUDA events, L2 flushed, launch
   gaps kept out);
4. cuDNN (torch's convolution in its benchmark mode, channels last, the bias, a residual
   and the activation applied by torch as a user would; for a gradient, torch's
   ``convolution_backward`` computing that gradient alone) is timed the same way in the
   same run and recorded as the ``"cudnn"`` baseline row; the run's winner is the faster
   of the best CUTLASS candidate and cuDNN.

Needs CuPy and torch (the inputs, the reference and the baseline are torch tensors on
the GPU).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...errors import PycLabError
from ...hardware.device import require_cupy
from ...search import Outcome
from ..arrays import torch_raw_stream, torch_stream
from ..conv_cutlass import conv_config_of, conv_problem_key, kernel_call
from ..conv_grad import torch_conv_backward
from ..conv_library import cudnn_conv, tf32_allowed
from ..cutlass.conv import (
    ConvConfig,
    ConvGeometry,
    ConvKernel,
    CutlassConv,
    build_conv_many,
    conv_configs,
)
from ..cutlass.conv_2x import (
    Conv2xConfig,
    CutlassConv2x,
    build_conv2x_many,
    conv2x_configs,
    conv2x_grad_configs,
    conv2x_widths,
    geometry_issue,
)
from ..cutlass.nvcc import BuildResult
from .gemm_reference import TOLERANCE
from .gemm_runner import gpu_ms, run_watched
from .kernel_rows import CandidateRows
from .keys import DeviceKey, device_key
from .options import GemmTuneOptions

__all__ = ["ConvRunner", "gradient_candidates", "torch_dtype"]

log = logging.getLogger(__name__)


class _AnyConfig:
    """Either family's configuration read from a candidate (a gradient's space holds
    both; the fields of the other family are ``None`` there)."""

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Any:
        return conv_config_of({k: v for k, v in d.items() if v is not None})


def gradient_candidates(geometry: ConvGeometry, kernel: ConvKernel, sm_count: int = 132,
                        restrict: Callable[[Any], bool] | None = None
                        ) -> list[ConvConfig | Conv2xConfig]:
    """A gradient's ranked candidates over both kernel families.

    Parameters
    ----------
    geometry
        The forward problem.
    kernel
        The gradient's kernel (``direction`` ``"dgrad"`` or ``"wgrad"``).
    sm_count
        The GPU's SMs (the ranking models how tiles fill them).
    restrict
        ``restrict(config) -> bool``: only configurations it accepts are listed.

    Returns
    -------
    list
        The Hopper kernels' configurations where they take the problem
        (:meth:`ConvGeometry.issue`) and the CUTLASS 2 ones' (1-D and 2-D problems,
        :func:`~pyc_lab.kernels.cutlass.conv_2x.conv2x_grad_configs`), interleaved, each
        family best-ranked first.
    """
    keep = restrict or (lambda _cfg: True)
    hopper = [] if geometry.issue(kernel) else \
        [c for c in conv_configs(geometry, kernel, sm_count) if keep(c)]
    ampere = [c for c in conv2x_grad_configs(kernel, geometry, sm_count) if keep(c)] \
        if geometry.spatial in (1, 2) else []
    return [c for pair in zip(hopper, ampere, strict=False) for c in pair] + \
        hopper[len(ampere):] + ampere[len(hopper):]


def torch_dtype(dtype: str) -> Any:
    """The torch dtype of a kernel dtype (tf32 and f32 kernels take float32 tensors)."""
    import torch

    return {"f16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32,
            "f32": torch.float32}[dtype]


class ConvRunner(CandidateRows):
    """Measures CUTLASS convolution candidates for one problem on this GPU.

    Parameters
    ----------
    geometry
        The problem, channels last.
    options
        dtype (``f16``, ``bf16``, ``tf32`` or ``f32``: float32 at float32's accuracy,
        3xTF32, whose baseline is cuDNN with TF32 off), bias, activation, candidate cut,
        repeats,
        workers, hang limit (a :class:`~pyc_lab.kernels.tuning.options.GemmTuneOptions`).
    restrict
        ``restrict(config) -> bool``: only configurations it accepts are considered.
    cache
        The kernel cache builds go to (the user's by default).
    direction
        ``"fprop"`` (the forward convolution), ``"dgrad"`` or ``"wgrad"``; a gradient
        takes no bias or activation.
    residual
        Tune forward kernels that add a residual of the output's shape after the bias
        (``options.bias`` must be set): CUTLASS 2 kernels, whose epilogue reads it.

    Attributes
    ----------
    problem, device
        The tuning-database keys.
    configs
        The ranked configurations the search may evaluate.
    baselines
        ``{"cudnn": ms}``, timed in the same run.
    rows
        ``config id -> the table row`` of every candidate evaluated.

    Raises
    ------
    PycLabError
        No GPU or torch, a GPU that is not Hopper, or a problem the kernels cannot take.
    """

    def __init__(self, geometry: ConvGeometry, options: GemmTuneOptions, *,
                 restrict: Callable[[ConvConfig], bool] | None = None,
                 cache: Any = None, direction: str = "fprop",
                 residual: bool = False) -> None:
        cp = require_cupy("autotune_conv")
        try:
            import torch
        except ImportError:
            raise PycLabError("autotune_conv needs torch: cuDNN, through torch, is the "
                              "reference and the baseline") from None
        opts = options
        if opts.dtype not in ("f16", "bf16", "tf32", "f32"):
            raise PycLabError(f"autotune_conv: dtype {opts.dtype!r}; CUTLASS convolutions "
                              "take f16, bf16, tf32 or f32 (float32 at its own accuracy, "
                              "as 3xTF32)")
        kernel = ConvKernel(opts.dtype, geometry.spatial, opts.bias, opts.activation,
                            direction, residual)
        why = geometry.issue(kernel)
        c, k = geometry.act[-1], geometry.flt[0]
        if why and geometry_issue(geometry):  # neither family takes it
            raise PycLabError(f"autotune_conv {geometry}: {why}; pl.conv uses cuDNN for it")
        device, cc, sm_count = device_key()
        if cc < 90:
            raise PycLabError(f"CUTLASS convolutions here are built for Hopper (sm_90a); this "
                              f"GPU is sm_{cc}")
        self._deadline = time.perf_counter() + opts.budget_s if opts.budget_s else None
        self.geometry, self.kernel, self.options = geometry, kernel, opts
        self.flops = geometry.flops
        self.device: DeviceKey = device
        self.sm_count = sm_count
        self.problem = conv_problem_key(geometry, kernel)
        if direction != "fprop":  # both families where they take the problem
            self.config_type = _AnyConfig
            ranked = gradient_candidates(geometry, kernel, sm_count, restrict)
            if not ranked:
                raise PycLabError(f"autotune_conv {direction} {geometry}: {why}, and no "
                                  f"CUTLASS 2 configuration takes {c} -> {k} channels; "
                                  "pl.conv uses cuDNN for it")
        elif not why:  # the Hopper kernels take it
            self.config_type, ranked = ConvConfig, conv_configs(geometry, kernel, sm_count)
        else:
            self.config_type, ranked = Conv2xConfig, conv2x_configs(kernel, c, k)
            if not ranked:
                raise PycLabError(f"autotune_conv {geometry}: {why}, and no CUTLASS 2 "
                                  f"configuration takes {c} -> {k} channels; pl.conv uses "
                                  "cuDNN for it")
        if restrict is not None:
            ranked = [c for c in ranked if restrict(c)]
        if not ranked:
            raise PycLabError(f"autotune_conv {geometry}: every configuration excluded")
        if opts.max_candidates is not None:
            ranked = ranked[:opts.max_candidates]
        self.configs = ranked
        self._cp, self._torch = cp, torch
        self._make_inputs(opts.seed)
        self._libraries = {"cudnn": self._cudnn}
        self.baselines = {"cudnn": gpu_ms(self._cudnn, opts.repeats)}
        self._builds: dict[ConvConfig, BuildResult] = {}
        def done(r: BuildResult) -> None:
            self._builds[r.config] = r

        hopper_cfgs = [cfg for cfg in ranked if isinstance(cfg, ConvConfig)]
        ampere_cfgs = [cfg for cfg in ranked if isinstance(cfg, Conv2xConfig)]
        futures = {}
        if hopper_cfgs:
            futures.update(build_conv_many(hopper_cfgs, kernel, cc, opts.workers, cache, done))
        if ampere_cfgs:
            futures.update(build_conv2x_many(ampere_cfgs, kernel, c, k, cc, opts.workers,
                                             cache, done))
        self._futures = {cfg: futures[cfg] for cfg in ranked}
        self._loaded: dict[ConvConfig, CutlassConv] = {}
        self._init_rows()
        self._hung: str | None = None

    def _make_inputs(self, seed: int) -> None:
        """Inputs uniform in [-1, 1], the float32 reference, and cuDNN's call."""
        torch = self._torch
        g = self.geometry
        dt = torch_dtype(self.kernel.dtype)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        def uniform(*shape: int) -> Any:
            return torch.rand(shape, device="cuda", generator=gen).mul_(2).sub_(1).to(dt)
        direction = self.kernel.direction
        self._x = uniform(*g.act)                      # (N, *spatial, C)
        self._w = uniform(*g.flt)                      # (K, *kernel, C)
        self._dy = uniform(*g.out_shape) if direction != "fprop" else None  # (N, *out, K)
        self._b = uniform(g.flt[0]) if self.kernel.bias else None
        r = uniform(*g.out_shape) if self.kernel.residual else None  # (N, *out, K)
        self._y = torch.empty(self.kernel.operands(g)[2], device="cuda", dtype=dt)
        nd = g.spatial
        to_first = (0, nd + 1, *range(1, nd + 1))
        xf, wf = self._x.permute(*to_first), self._w.permute(*to_first)
        dyf = None if self._dy is None else self._dy.permute(*to_first)
        rf = self._rf = None if r is None else r.permute(*to_first)
        self._first = (xf, wf)
        fn = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d,
              3: torch.nn.functional.conv3d}[nd]
        args = dict(stride=g.stride, padding=g.pad, dilation=g.dilation)
        geo = {"stride": g.stride, "pads": g.pad, "dilation": g.dilation, "groups": 1}
        needs = (direction == "dgrad", direction == "wgrad", False)
        index = 0 if direction == "dgrad" else 1
        was = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            if direction == "fprop":
                ref = fn(xf.float(), wf.float(),
                         None if self._b is None else self._b.float(), **args)
                if rf is not None:
                    ref = ref + rf.float()
                ref = _activation(ref, self.kernel.activation)
            else:
                ref = torch_conv_backward(xf.float(), wf.float(), dyf.float(), bias=False,
                                          needs=needs, **geo)[index]
        finally:
            torch.backends.cudnn.allow_tf32 = was
        self._ref = ref.permute(0, *range(2, nd + 2), 1).contiguous()
        self._ref_max = float(self._ref.abs().max()) or 1.0
        act = self.kernel.activation

        exact = self.kernel.dtype == "f32"  # the baseline at float32's accuracy too

        def cudnn() -> Any:
            with tf32_allowed(False if exact else None):
                y = cudnn_conv(xf, wf, self._b, g.stride, g.pad, g.dilation, 1)
            return _activation(y if rf is None else y.add_(rf), act)

        def cudnn_grad() -> Any:
            return torch_conv_backward(xf, wf, dyf, bias=False, needs=needs, **geo)[index]

        self._cudnn = cudnn if direction == "fprop" else cudnn_grad

    # -- the runner protocol (space() comes from CandidateRows) -----------------------
    def evaluate(self, candidate: Mapping[str, Any], fidelity: int) -> Outcome:
        """Build (wait for), run twice, check and time one configuration."""
        cfg = self.config_type.from_dict(dict(candidate))
        library, outcome = self._library_of(cfg)
        if outcome is not None:
            return outcome
        try:
            conv = self._loaded.get(cfg) or self._load(cfg, library)
            self._loaded[cfg] = conv
            if not conv.can_implement(self._read(cfg)):
                return self._finish(cfg, "skipped", message="can_implement refused the problem")
        except Exception as exc:
            return self._finish(cfg, "wrong_result", message=f"{type(exc).__name__}: {exc}")
        launch = self._launch(conv)

        status, ms, err, msg = self._check_and_time(launch, cfg.id, fidelity)
        if status == "ok":
            self._launches[cfg.id] = (cfg, launch)
        return self._finish(cfg, status, ms, err, msg)

    def _load(self, cfg: Any, library: Any) -> CutlassConv:
        if isinstance(cfg, ConvConfig):
            return CutlassConv(library, cfg, self.kernel, self.sm_count)
        align, align_out = conv2x_widths(cfg, self.kernel, self.geometry.act[-1],
                                         self.geometry.flt[0])
        return CutlassConv2x(library, cfg, self.kernel, self.sm_count, align=align,
                             align_out=align_out)

    def _read(self, cfg: Any) -> ConvGeometry:
        """The geometry the kernel reads (a ``pad_to`` configuration's padded channels)."""
        from ..cutlass.conv_2x import padded_geometry

        pad_to = getattr(cfg, "pad_to", 0)
        return padded_geometry(self.geometry, pad_to) if pad_to else self.geometry

    def _launch(self, conv: CutlassConv) -> Callable[[], None]:
        """One call of the kernel into the poisoned output: on the tensors' pointers for a
        Hopper kernel and a gradient; for a CUTLASS 2 forward one, as ``pl.conv`` calls it
        (:func:`~pyc_lab.kernels.conv_cutlass.kernel_call`: any channel padding and the
        out-of-window guard included)."""
        if isinstance(conv, CutlassConv2x) and self.kernel.direction == "fprop":
            call, (xf, wf), b, y = kernel_call(conv, self.geometry), self._first, self._b, \
                self._y
            rf = self._rf

            def through_pl_conv() -> None:
                call(xf, wf, b, rf, out=y)

            return through_pl_conv
        stream = torch_raw_stream()
        a, b = {"fprop": (self._x, self._w), "dgrad": (self._dy, self._w),
                "wgrad": (self._dy, self._x)}[self.kernel.direction]
        ptrs = (a.data_ptr(), b.data_ptr(),
                None if self._b is None else self._b.data_ptr(), self._y.data_ptr())
        return lambda: conv.run(self.geometry, *ptrs, stream)

    def _check_and_time(self, launch: Callable[[], None], name: str, repeats: int
                        ) -> tuple[str, float | None, float | None, str]:
        torch = self._torch
        try:
            self._y.fill_(float("nan"))
            # the watch's event goes on the stream the launches use (torch's current)
            with torch_stream(self._torch.cuda.current_device()):
                hung = run_watched((launch, launch), self._cp, self.options.hang_s)
            if hung:
                self._hung = name
                return "timeout", None, None, hung
        except Exception as exc:
            return "wrong_result", None, None, f"{type(exc).__name__}: {exc}"
        got = self._y.float()
        if not bool(torch.isfinite(got).all()):
            return "nan", None, None, "NaN or Inf in the output"
        err = float((got - self._ref).abs().max()) / self._ref_max
        tol = TOLERANCE[self.kernel.dtype]
        if err > tol:
            return "wrong_result", None, err, f"max error {err:.3g} > {tol} vs float32"
        return "ok", gpu_ms(launch, repeats), err, ""


def _activation(y: Any, activation: str | None) -> Any:
    """torch's activation on a fresh tensor (gelu in the tanh form, as the kernels')."""
    if activation is None:
        return y
    import torch.nn.functional as F

    return {"relu": F.relu, "silu": F.silu,
            "gelu": lambda t: F.gelu(t, approximate="tanh")}[activation](y)
