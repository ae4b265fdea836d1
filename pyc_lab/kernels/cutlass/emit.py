"""CUTLASS GEMM sources: ``cutlass_cppgen``'s kernel plus pyc_lab's host wrapper.

The kernel is CUTLASS's ``CollectiveBuilder`` instance as ``cutlass_cppgen`` emits it
(a fused epilogue spliced into the epilogue builder as its fusion operation); the host
wrapper around ``GemmUniversalAdapter`` (``GemmUniversalBase`` for the CUTLASS 2 SIMT
kernel) is fixed text under ``native/`` — ``cutlass_gemm_includes.cuh``,
``cutlass_gemm_wrapper.cuh`` and the arguments of each generation,
``cutlass_gemm_args_3x.cuh`` / ``cutlass_gemm_args_2x.cuh`` — whose ``extern "C"``
functions (can-implement, workspace size, create, bind a problem once, launch) are what
:mod:`~pyc_lab.kernels.cutlass.launch` calls.
"""

from __future__ import annotations

import re

from ...errors import PycLabError
from ...paths import native_source
from .config import _PLAN_LOCK, _TMA_EPILOGUES, Epilogue, GemmConfig, _plan, check_dtype_layout

__all__ = ["emit_source"]


def emit_source(config: GemmConfig, dtype: str = "f16", layout: str = "tn",
                cc: int = 90, epilogue: Epilogue | None = None) -> str:
    """The complete CUDA C++ of one kernel and its host wrapper.

    A fused ``epilogue`` is spliced into the epilogue ``CollectiveBuilder`` as its fusion
    operation (CUTLASS 3 kernels with a TMA epilogue schedule only).
    """
    check_dtype_layout(dtype, layout)
    epilogue = epilogue or Epilogue()
    plan, configs = _plan(dtype, layout, cc)
    td = configs.get(config)
    if td is None:
        raise PycLabError(f"{config.id} is not one of cutlass_cppgen's configurations for "
                          f"{dtype} {layout} on sm_{cc}")
    with _PLAN_LOCK:
        body = plan.construct(td).rt_module.emit()
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
    header = (f"// pyc_lab CUTLASS GEMM {dtype} {layout} sm_{cc}: {config.id}"
              f"{' epilogue ' + epilogue.name if epilogue.fused else ''}\n"
              f"#define PYC_BIAS {int(epilogue.bias)}\n"
              + native_source("cutlass_gemm_includes.cuh"))
    device = "cutlass::gemm::device::" + ("GemmUniversalAdapter" if cutlass3
                                          else "GemmUniversalBase")
    arguments = native_source("cutlass_gemm_args_3x.cuh" if cutlass3
                              else "cutlass_gemm_args_2x.cuh")
    wrapper = native_source("cutlass_gemm_wrapper.cuh").replace("__ARGUMENTS__", arguments)
    return header + body + wrapper.replace("__NAME__", name.group(1)).replace("__DEVICE__",
                                                                              device)
