"""CUTLASS GEMM sources: ``cutlass_cppgen``'s kernel plus pyc_lab's host wrapper.

The kernel is CUTLASS's ``CollectiveBuilder`` instance as ``cutlass_cppgen`` emits it
(a fused epilogue spliced into the epilogue builder as its fusion operation); the host
wrapper around ``GemmUniversalAdapter`` (``GemmUniversalBase`` for the CUTLASS 2 SIMT
kernel) is fixed text under ``native/`` — ``cutlass_gemm_includes.cuh``,
``cutlass_gemm_wrapper.cuh`` and the arguments of each generation,
``cutlass_gemm_args_3x.cuh`` / ``cutlass_gemm_args_2x.cuh`` — whose ``extern "C"``
functions (can-implement, workspace size, create, bind a problem once, launch) are what
:mod:`~pyc_lab.kernels.cutlass.launch` calls.

Variants (:class:`~pyc_lab.kernels.cutlass.config.GemmConfig`'s fields beyond the five
``cutlass_cppgen`` lists) are emitted from ``cutlass_cppgen``'s kernel too:

- a lower ``alignment`` is ``construct(..., alignment_A=, alignment_B=, alignment_C=)``;
- ``swap`` emits the swapped problem's kernel (layout :func:`swapped_layout`, C
  column-major);
- a CTA tile ``cutlass_cppgen`` does not list (the narrow small-M tiles) is a listed
  kernel of the same schedules with its tile and cluster shapes rewritten;
- scheduler settings (raster, swizzle, splits, decomposition) are ``#define`` s read by
  ``native/cutlass_gemm_scheduler_3x.cuh``, spliced into the arguments.

A plain configuration's text is exactly what it was before variants existed, so its
kernel-cache key is unchanged.
"""

from __future__ import annotations

import re
from typing import Any

from ...errors import PycLabError
from ...paths import native_source
from .config import (
    _PLAN_LOCK,
    _TMA_EPILOGUES,
    DECOMPOSITIONS,
    RASTERS,
    Epilogue,
    GemmConfig,
    _plan,
    check_dtype_layout,
    swapped_layout,
)

__all__ = ["emit_source", "scheduler_defines"]

_TILE = re.compile(r"cute::Shape<cute::_\d+, cute::_\d+, cute::_\d+>")
_CLUSTER = re.compile(r"cute::Shape<cute::_\d+,cute::_\d+,cute::_\d+>")


def _template(config: GemmConfig, configs: dict[GemmConfig, Any],
              what: str) -> tuple[Any, bool]:
    """The tile description to construct from, and whether its shapes need rewriting."""
    base = config.base
    td = configs.get(base)
    if td is not None:
        return td, False
    for cfg, cand in configs.items():
        if (cfg.kernel_schedule, cfg.epilogue_schedule, cfg.tile_scheduler) == \
                (base.kernel_schedule, base.epilogue_schedule, base.tile_scheduler):
            return cand, True
    raise PycLabError(f"{config.id} is not one of cutlass_cppgen's configurations for "
                      f"{what}, and it offers no kernel with schedules "
                      f"{base.kernel_schedule}/{base.epilogue_schedule} and tile scheduler "
                      f"{base.tile_scheduler} to build it from")


def _reshape(body: str, config: GemmConfig) -> str:
    """Rewrite the emitted CTA tile and cluster shapes to ``config``'s."""
    cm, cn, ck = config.cta_tile
    body, tiles = _TILE.subn(f"cute::Shape<cute::_{cm}, cute::_{cn}, cute::_{ck}>", body)
    x, y, z = config.cluster
    body, clusters = _CLUSTER.subn(f"cute::Shape<cute::_{x},cute::_{y},cute::_{z}>", body)
    if tiles != 2 or clusters != 2:
        raise PycLabError("cutlass_cppgen's emitted kernel has an unexpected form (tile and "
                          "cluster shapes not found twice); nvidia-cutlass changed its emitter")
    return body


def scheduler_defines(config: GemmConfig) -> str:
    """The ``#define`` lines of a configuration's scheduler settings (``""`` if default)."""
    if (config.raster, config.swizzle, config.splits, config.decomposition) == \
            ("Heuristic", 1, 1, "Heuristic"):
        return ""
    return (f"#define PYC_RASTER {RASTERS.index(config.raster)}\n"
            f"#define PYC_SWIZZLE {config.swizzle}\n"
            f"#define PYC_STREAMK {int(config.tile_scheduler == 'StreamK')}\n"
            f"#define PYC_SPLITS {config.splits}\n"
            f"#define PYC_DECOMPOSITION {DECOMPOSITIONS.index(config.decomposition)}\n")


def emit_source(config: GemmConfig, dtype: str = "f16", layout: str = "tn",
                cc: int = 90, epilogue: Epilogue | None = None) -> str:
    """The complete CUDA C++ of one kernel and its host wrapper.

    A fused ``epilogue`` is spliced into the epilogue ``CollectiveBuilder`` as its fusion
    operation (CUTLASS 3 kernels with a TMA epilogue schedule only). ``layout`` is the
    problem's; a swapped configuration's kernel is emitted for the swapped problem.
    """
    check_dtype_layout(dtype, layout)
    epilogue = epilogue or Epilogue()
    if config.swap:
        if epilogue.bias:
            raise PycLabError(f"{config.id}: a swapped kernel cannot fuse a per-column bias")
        plan, configs = _plan(dtype, swapped_layout(layout), cc, "n")
    else:
        plan, configs = _plan(dtype, layout, cc)
    td, reshape = _template(config, configs, f"{dtype} {layout} on sm_{cc}")
    align = config.alignment
    with _PLAN_LOCK:
        op = (plan.construct(td, alignment_A=align, alignment_B=align, alignment_C=align)
              if align else plan.construct(td))
        body = op.rt_module.emit()
    if reshape:
        body = _reshape(body, config)
    name = re.search(r"struct (\w+)_type\s*:", body)
    if name is None:
        raise PycLabError("cutlass_cppgen's emitted kernel has no named type; "
                          "nvidia-cutlass changed its emitter")
    cutlass3 = "CollectiveBuilder" in body
    if epilogue.fused:
        if not cutlass3 or config.epilogue_schedule not in _TMA_EPILOGUES:
            raise PycLabError(f"{config.id}: a fused {epilogue.name} epilogue needs a CUTLASS "
                              "3 kernel with a TMA epilogue schedule")
        head, sep, rest = body.partition("using CollectiveMainloop")
        cut = head.rfind(">::CollectiveOp;")
        if not sep or cut < 0:
            raise PycLabError("cutlass_cppgen's emitted epilogue has an unexpected form; "
                              "nvidia-cutlass changed its emitter")
        head = (head[:cut].rstrip() + f",\n    {epilogue.fusion_op(dtype)}\n  "
                + head[cut:])
        body = head + sep + rest
    defines = scheduler_defines(config)
    if defines and not cutlass3:
        raise PycLabError(f"{config.id}: scheduler settings need a CUTLASS 3 kernel")
    header = (f"// pyc_lab CUTLASS GEMM {dtype} {layout} sm_{cc}: {config.id}"
              f"{' epilogue ' + epilogue.name if epilogue.fused else ''}\n"
              f"#define PYC_BIAS {int(epilogue.bias)}\n" + defines
              + native_source("cutlass_gemm_includes.cuh"))
    device = "cutlass::gemm::device::" + ("GemmUniversalAdapter" if cutlass3
                                          else "GemmUniversalBase")
    arguments = native_source("cutlass_gemm_args_3x.cuh" if cutlass3
                              else "cutlass_gemm_args_2x.cuh")
    if defines:
        ret = "  return args;\n}"
        if arguments.count(ret) != 1:
            raise PycLabError("native/cutlass_gemm_args_3x.cuh changed: pyc_arguments() must "
                              "end with one 'return args;'")
        arguments = arguments.replace(ret, native_source("cutlass_gemm_scheduler_3x.cuh")
                                      + ret)
    wrapper = native_source("cutlass_gemm_wrapper.cuh").replace("__ARGUMENTS__", arguments)
    return header + body + wrapper.replace("__NAME__", name.group(1)).replace("__DEVICE__",
                                                                              device)
