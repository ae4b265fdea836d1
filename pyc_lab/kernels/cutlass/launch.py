"""CUTLASS GEMM launches: a built kernel loaded with ctypes, bound once, launched cheaply.

``gemm(a, b, out)`` binds the problem and its pointers once (TMA descriptors,
workspace) and afterwards only launches: a few microseconds of host time per call;
:meth:`CutlassGemm.capture` returns a CUDA graph of one launch.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import PycLabError
from .config import DTYPES, Epilogue, GemmConfig

__all__ = ["CutlassGemm", "load_library"]

_LIBS: dict[str, ctypes.CDLL] = {}
_LIBS_LOCK = threading.Lock()


def load_library(path: Path, declare: Callable[[ctypes.CDLL], None]) -> ctypes.CDLL:
    """A built kernel's shared library, loaded once per path; ``declare(lib)`` sets its
    functions' argument and result types when it is first loaded."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()
    with _LIBS_LOCK:
        lib = _LIBS.get(digest)
        if lib is None:
            lib = ctypes.CDLL(str(path))
            declare(lib)
            _LIBS[digest] = lib
        return lib


def _declare_gemm(lib: ctypes.CDLL) -> None:
    vp, c_int = ctypes.c_void_p, ctypes.c_int
    lib.pyc_can_implement.argtypes = [c_int, c_int, c_int]
    lib.pyc_can_implement.restype = c_int
    lib.pyc_workspace_size.argtypes = [c_int, c_int, c_int, c_int]
    lib.pyc_workspace_size.restype = ctypes.c_ulonglong
    lib.pyc_create.restype = vp
    lib.pyc_destroy.argtypes = [vp]
    lib.pyc_initialize.argtypes = [vp, c_int, c_int, c_int, vp, vp, vp, vp,
                                   ctypes.c_float, ctypes.c_float, vp, vp, c_int, vp]
    lib.pyc_initialize.restype = c_int
    lib.pyc_run.argtypes = [vp, vp]
    lib.pyc_run.restype = c_int
    lib.pyc_kernel_name.restype = ctypes.c_char_p
    lib.pyc_has_bias.restype = c_int


def _load(path: Path) -> ctypes.CDLL:
    return load_library(path, _declare_gemm)


@dataclass
class CutlassGemm:
    """A built CUTLASS GEMM, ready to launch on CuPy arrays.

    Parameters
    ----------
    library
        Path of the kernel's shared library (:attr:`BuildResult.library`).
    config, dtype, layout, epilogue
        What it was built for (kept for reports; ``epilogue`` is the plain one when not
        given).
    sm_count
        SMs the persistent tile scheduler may use (the device's count by default).

    Notes
    -----
    ``gemm(a, b, out, bias=...)`` computes ``out = act(alpha * a @ b + beta * c + bias)``
    for ``a`` (M x K) and ``b`` (K x N) whose memory order matches ``layout``. A swapped
    configuration (``config.swap``) runs ``C^T = B^T A^T``: the problem and operands are
    handed to the kernel swapped, here, so callers see an ordinary ``a @ b``. The first
    call with a set of pointers binds them (``initialize``: TMA descriptors, workspace);
    later calls with the same pointers only launch.
    """

    library: Path
    config: GemmConfig | None = None
    dtype: str = "f16"
    layout: str = "tn"
    sm_count: int = 0
    epilogue: Epilogue = field(default_factory=Epilogue)
    _lib: Any = field(default=None, repr=False)
    _handle: int | None = field(default=None, repr=False)
    _bound: tuple | None = field(default=None, repr=False)
    _workspace: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._lib = _load(Path(self.library))
        if bool(self._lib.pyc_has_bias()) != self.epilogue.bias:
            has = "has a" if self.epilogue.bias is False else "has no"
            raise PycLabError(f"{self.library}: the kernel {has} bias but was loaded as "
                              f"epilogue {self.epilogue.name!r}")
        self._handle = self._lib.pyc_create()
        if not self.sm_count:
            from ...hardware.device import require_cupy

            cp = require_cupy("CUTLASS GEMM")
            self.sm_count = int(cp.cuda.Device().attributes["MultiProcessorCount"])

    @property
    def name(self) -> str:
        """CUTLASS's procedural name of the kernel."""
        return self._lib.pyc_kernel_name().decode()

    @property
    def swapped(self) -> bool:
        """Whether the kernel computes the swapped problem ``C^T = B^T A^T``."""
        return self.config is not None and self.config.swap

    def can_implement(self, m: int, n: int, k: int) -> bool:
        """Whether the kernel accepts an ``m x n x k`` problem."""
        if self.swapped:
            m, n = n, m
        return self._lib.pyc_can_implement(m, n, k) == 0

    def _check(self, a: Any, b: Any, out: Any, bias: Any) -> tuple[int, int, int]:
        if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
            raise PycLabError("CutlassGemm takes 2-D a, b and out")
        m, k = a.shape
        k2, n = b.shape
        if k != k2 or out.shape != (m, n):
            raise PycLabError(f"CutlassGemm: a {a.shape} @ b {b.shape} -> out {out.shape} do "
                              "not fit together")
        want = DTYPES[self.dtype]
        got = {x.dtype.name for x in (a, b, out)}
        ok = got <= {"int16", "uint16", "bfloat16"} if self.dtype == "bf16" else got == {want}
        if not ok:
            raise PycLabError(f"CutlassGemm built for {self.dtype} got {sorted(got)} arrays "
                              f"(a, b and out must all be {want})")
        order_a = "t" if a.flags.c_contiguous else "n" if a.flags.f_contiguous else "?"
        order_b = "t" if b.flags.c_contiguous else "n" if b.flags.f_contiguous else "?"
        if order_a + order_b != self.layout or not out.flags.c_contiguous:
            raise PycLabError(
                f"CutlassGemm built for layout {self.layout!r} got a {order_a!r}, b "
                f"{order_b!r}, out {'row-major' if out.flags.c_contiguous else 'strided'} "
                "(t = C-contiguous, n = F-contiguous; out must be C-contiguous)")
        if self.epilogue.bias:
            if bias is None or bias.shape != (n,) or not bias.flags.c_contiguous \
                    or bias.dtype != out.dtype:
                raise PycLabError(f"CutlassGemm with a bias epilogue needs a contiguous bias "
                                  f"of shape ({n},) and dtype {out.dtype.name}, got "
                                  f"{None if bias is None else (bias.shape, bias.dtype.name)}")
        elif bias is not None:
            raise PycLabError("this CutlassGemm has no bias epilogue; build one with "
                              "Epilogue(bias=True)")
        return m, n, k

    def bind(self, a: Any, b: Any, out: Any, c: Any = None, alpha: float = 1.0,
             beta: float = 0.0, stream: Any = None, bias: Any = None) -> None:
        """Bind a problem's pointers (done by ``__call__`` when they change)."""
        import cupy as cp

        m, n, k = self._check(a, b, out, bias)
        km, kn, pa, pb = (n, m, b.data.ptr, a.data.ptr) if self.swapped else \
            (m, n, a.data.ptr, b.data.ptr)
        ws = int(self._lib.pyc_workspace_size(km, kn, k, self.sm_count))
        if self._workspace is None or self._workspace.nbytes < ws:
            self._workspace = cp.empty(max(ws, 1), dtype=cp.uint8)
        s = stream if stream is not None else cp.cuda.get_current_stream()
        c_ptr = (c if c is not None else out).data.ptr
        bias_ptr = bias.data.ptr if bias is not None else None
        st = self._lib.pyc_initialize(self._handle, km, kn, k, pa, pb, c_ptr,
                                      out.data.ptr, float(alpha), float(beta), bias_ptr,
                                      self._workspace.data.ptr, self.sm_count, s.ptr)
        if st != 0:
            self._bound = None
            raise PycLabError(f"CUTLASS kernel {self.config.id if self.config else ''} cannot "
                              f"run {m}x{n}x{k} (cutlass::Status {st})")
        self._bound = (a.data.ptr, b.data.ptr, c_ptr, out.data.ptr, m, n, k, float(alpha),
                       float(beta), s.ptr, bias_ptr)

    def __call__(self, a: Any, b: Any, out: Any, c: Any = None, alpha: float = 1.0,
                 beta: float = 0.0, stream: Any = None, bias: Any = None) -> Any:
        """``out = act(alpha * a @ b + beta * c + bias)`` on ``stream`` (the current one)."""
        s_ptr = stream.ptr if stream is not None else _current_stream_ptr()
        key = (a.data.ptr, b.data.ptr, (c if c is not None else out).data.ptr, out.data.ptr,
               a.shape[0], b.shape[1], a.shape[1], float(alpha), float(beta), s_ptr,
               bias.data.ptr if bias is not None else None)
        if key != self._bound:
            self.bind(a, b, out, c, alpha, beta, stream, bias)
        st = self._lib.pyc_run(self._handle, s_ptr)
        if st != 0:
            raise PycLabError(f"CUTLASS kernel launch failed (cutlass::Status {st})")
        return out

    def launch(self, stream_ptr: int = 0) -> None:
        """Launch the bound problem again with nothing checked (the benchmark's path)."""
        st = self._lib.pyc_run(self._handle, stream_ptr)
        if st != 0:
            raise PycLabError(f"CUTLASS kernel launch failed (cutlass::Status {st})")

    def capture(self, stream: Any = None) -> Any:
        """A CUDA graph holding one launch of the bound problem.

        ``graph.launch(stream)`` then replays it for about 3 us of host time (the issue's
        low-overhead path next to :meth:`launch`). Bind first (call the kernel once with
        the arrays the graph should use); the graph keeps those pointers.
        """
        import cupy as cp

        if self._bound is None:
            raise PycLabError("CutlassGemm.capture: call the kernel once first, so that a "
                              "problem and its pointers are bound")
        s = stream if stream is not None else cp.cuda.Stream(non_blocking=True)
        s.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
        try:
            self._lib.pyc_run(self._handle, s.ptr)
        finally:
            graph = s.end_capture()
        return graph

    def __del__(self) -> None:
        lib, handle = getattr(self, "_lib", None), getattr(self, "_handle", None)
        if lib is not None and handle:
            lib.pyc_destroy(handle)
            self._handle = None


def _current_stream_ptr() -> int:
    import cupy as cp

    return cp.cuda.get_current_stream().ptr
