"""pyc_lab's own GEMM for few rows: ``out = a @ w.T`` with ``a`` M x K, M <= 64.

A linear layer at decode time multiplies a handful of activation rows by a weight
matrix that is read once: the GEMM is bound by HBM bandwidth, not by the tensor cores,
and the libraries' kernels for it leave bandwidth unused (on the H200, cuBLAS moves
2.5-3.8 TB/s of weights on such layers) or fall off a cliff (an output row that is not
16-byte aligned, N odd: 3.5x slower). ``native/skinny_gemm.cuh`` is written for that
regime in two forms:

* the **warp form** (M <= 64): swapped ``mma.sync`` operands so that M = 1 wastes
  tensor-core lanes, not loads; per-warp ``cp.async`` rings that keep several chunks of
  weights in flight; a deterministic fixed-order reduction and split-k fix-up;
* the **GEMV form** (M <= 8): CUDA-core FMAs fed by a plain load stream, each lane
  holding several 16-byte pieces of each of its warp's weight rows in flight in
  registers (no shared memory, no barrier) — with so few rows the tensor cores add
  nothing and the stream is all that counts.

This module compiles them with NVRTC and launches them on CuPy arrays.

They are *candidates*: the tuner measures their configurations beside the CUTLASS
kernels and the libraries (:mod:`~pyc_lab.kernels.tuning.gemm_runner`), and
:func:`pyc_lab.matmul` runs one only for a problem where it won its tuning run (the
never-slower rule of :mod:`~pyc_lab.kernels.matmul_route`).

Operands: f16 or bf16, ``a`` C-contiguous (M x K), ``b`` F-contiguous (K x N, i.e.
``w.T`` for a row-major N x K weight: layout ``"tn"``), ``out`` C-contiguous; K a
multiple of 8 and ``a``/``b`` 16-byte aligned (any N and M <= 64). The epilogue is
``alpha * a @ b + beta * out`` (no bias or activation).
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import PycLabError
from ..paths import native_source
from .matmul_launch import plain_call_stream
from .nvrtc import compile_module

__all__ = ["GEMV_MAX_M", "MAX_M", "Geometry", "SkinnyConfig", "SkinnyGemm", "candidates",
           "compile_kernels", "geometry", "is_skinny", "nt_for", "skinny_issue", "smem_bytes"]

#: The most rows of ``a`` the kernel takes (8 * the largest token-tile count).
MAX_M = 64
#: The most rows of ``a`` the GEMV form takes (its FMAs grow with them).
GEMV_MAX_M = 8
#: The forms of the kernel (see the module's docstring).
FORMS = ("warp", "gemv")
#: Dynamic shared memory a block may ask for on Hopper (227 KiB).
SMEM_LIMIT = 227 * 1024
#: Kernel dtypes and their BF16 template flag.
_BF16 = {"f16": 0, "bf16": 1}
_ARRAY_DTYPES = {"f16": ("float16",), "bf16": ("bfloat16", "int16", "uint16")}  # bf16 bits too
#: (rows per warp in 16-row tiles, warps, stages): the configurations measured on the
#: H200 to lead for some decode shape (1 <= M <= 64, N 1024..28672, K 2048..28672).
_SHAPES = ((1, 4, 4), (1, 8, 4), (1, 8, 6), (1, 16, 3), (2, 2, 8), (2, 4, 4), (2, 4, 6),
           (2, 8, 3), (2, 8, 4), (4, 4, 3), (4, 4, 4), (4, 8, 2), (8, 4, 3))
_SPLITS = (1, 2)
#: GEMV form (weight rows per warp, warps per block, 16-byte pieces of each row in
#: flight per lane): at most 16 pieces in flight a lane (64 registers).
_GEMV_SHAPES = ((1, 4, 8), (1, 8, 4), (1, 8, 8), (2, 4, 8), (2, 8, 4), (2, 8, 8), (4, 4, 4),
                (4, 8, 2), (4, 8, 4))


def nt_for(m: int) -> int:
    """Token tiles of 8 rows the kernel instantiates for ``m`` rows (1, 2, 4 or 8)."""
    nt = 1
    while nt * 8 < m:
        nt *= 2
    return nt


def mt_for(m: int) -> int:
    """Rows of ``a`` the GEMV form computes for ``m`` rows (1, 2, 4 or 8)."""
    mt = 1
    while mt < m:
        mt *= 2
    return mt


def smem_bytes(rt: int, nt: int, warps: int, stages: int) -> int:
    """Dynamic shared memory of a configuration: the per-warp rings, or the reduction
    tree reusing them, whichever is larger."""
    ring = warps * stages * (rt * 4 + nt * 2) * 32 * 16
    tree = max(1, warps // 2) * rt * nt * 4 * 32 * 4
    return max(ring, tree)


@dataclass(frozen=True)
class SkinnyConfig:
    """One configuration of the skinny GEMM.

    Attributes
    ----------
    rt
        Warp form: 16-row weight tiles per warp (a block owns ``16 * rt`` rows). GEMV
        form: weight rows per warp.
    warps
        Warps per block. Warp form: they split the block's k range in interleaved
        chunks of 64. GEMV form: each on its own rows.
    stages
        Warp form: depth of each warp's ``cp.async`` ring (``stages - 1`` chunks in
        flight). GEMV form: 16-byte pieces of each row a lane loads before using the
        first.
    splits
        Blocks k is split across (their partial tiles added by the last to finish);
        1 in the GEMV form.
    form
        ``"warp"`` or ``"gemv"`` (see the module's docstring).
    """

    rt: int
    warps: int
    stages: int
    splits: int = 1
    form: str = "warp"

    @property
    def id(self) -> str:
        """A short name: ``skinny_rt2_w8_st4_s1``, ``skinny_v_rt2_w8_st4`` (GEMV)."""
        if self.form == "gemv":
            return f"skinny_v_rt{self.rt}_w{self.warps}_st{self.stages}"
        return f"skinny_rt{self.rt}_w{self.warps}_st{self.stages}_s{self.splits}"

    def to_dict(self) -> dict[str, Any]:
        """The configuration as the tuning database stores it (``kernel: "skinny"``;
        warp-form entries without a ``form`` key, as they have always been stored)."""
        d = {"kernel": "skinny", **asdict(self)}
        if self.form == "warp":
            del d["form"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SkinnyConfig:
        """The configuration :meth:`to_dict` stored.

        Raises
        ------
        PycLabError
            For a dict that is not a skinny configuration.
        """
        if not is_skinny(d):
            raise PycLabError(f"not a skinny GEMM configuration: {d!r}")
        form = d.get("form", "warp")
        if form not in FORMS:
            raise PycLabError(f"skinny GEMM configuration {d!r}: form {form!r} is not one of "
                              f"{list(FORMS)}")
        try:
            return cls(int(d["rt"]), int(d["warps"]), int(d["stages"]), int(d.get("splits", 1)),
                       form)
        except (KeyError, TypeError, ValueError) as exc:
            raise PycLabError(f"skinny GEMM configuration {d!r} is incomplete: {exc}") from exc

    def issue(self, m: int) -> str:
        """Why this configuration cannot be instantiated for ``m`` rows, or ``""``."""
        nt = nt_for(m)
        if self.warps & (self.warps - 1) or not 1 <= self.warps <= 32:
            return f"warps={self.warps} is not a power of two up to 32"
        if self.form == "gemv":
            if not 1 <= m <= GEMV_MAX_M:
                return f"M = {m}: the GEMV form takes 1 to {GEMV_MAX_M} rows"
            if self.rt < 1 or self.stages < 1 or self.splits != 1:
                return "the GEMV form takes rt and stages of at least 1 and no splits"
            if self.rt * self.stages > 16:
                return (f"rt={self.rt} rows with stages={self.stages} pieces in flight "
                        "needs more than 64 registers of loads")
            if self.rt * mt_for(m) > 32:
                return f"rt={self.rt} with {m} rows needs more than 32 accumulators"
            return ""
        if self.form != "warp":
            return f"form {self.form!r} is not one of {list(FORMS)}"
        if self.rt < 1 or self.stages < 2 or self.splits < 1:
            return "rt, stages and splits must be at least 1, 2 and 1"
        if self.rt * nt > 32:
            return f"rt={self.rt} with {nt} token tiles needs more than 128 accumulators"
        if smem_bytes(self.rt, nt, self.warps, self.stages) > SMEM_LIMIT:
            return "needs more shared memory than a block may have"
        return ""

    def smem(self, m: int) -> int:
        """Dynamic shared memory of one block for ``m`` rows, bytes (0: GEMV form)."""
        if self.form == "gemv":
            return 0
        return smem_bytes(self.rt, nt_for(m), self.warps, self.stages)

    def expression(self, dtype: str, m: int) -> str:
        """The kernel's template instantiation for ``dtype`` and ``m`` rows."""
        if self.form == "gemv":
            return f"pyc_skinny_gemv<{_BF16[dtype]},{mt_for(m)},{self.rt},{self.stages}>"
        return (f"pyc_skinny_gemm<{_BF16[dtype]},{nt_for(m)},{self.rt},{self.warps},"
                f"{self.stages}>")


def is_skinny(config: Any) -> bool:
    """Whether a stored configuration (a dict) names a skinny GEMM."""
    return isinstance(config, dict) and config.get("kernel") == "skinny"


def skinny_issue(m: int, n: int, k: int, dtype: str, layout: str) -> str:
    """Why the skinny GEMM cannot take a problem, or ``""``."""
    if dtype not in _BF16:
        return f"dtype {dtype}: the skinny GEMM takes f16 and bf16"
    if layout != "tn":
        return (f"layout {layout!r}: the skinny GEMM takes a row-major a and b = w.T "
                "(layout 'tn')")
    if not 1 <= m <= MAX_M:
        return f"M = {m}: the skinny GEMM takes 1 to {MAX_M} rows"
    if n < 1 or k < 8 or k % 8:
        return f"K = {k}: the skinny GEMM needs K a multiple of 8 (16-byte rows)"
    return ""


def candidates(m: int, n: int, k: int) -> list[SkinnyConfig]:
    """The configurations a tuning of ``m x n x k`` measures (empty when none fits)."""
    out = []
    for rt, warps, stages in _SHAPES:
        for splits in _SPLITS:
            if splits > 1 and k < 2048 * splits:
                continue  # each split keeps at least 2048 of k
            out.append(SkinnyConfig(rt, warps, stages, splits))
    out += [SkinnyConfig(rt, warps, stages, 1, "gemv") for rt, warps, stages in _GEMV_SHAPES]
    return [cfg for cfg in out if not cfg.issue(m)]


@dataclass(frozen=True)
class Geometry:
    """How one configuration covers an ``m x n x k`` problem.

    Attributes
    ----------
    nt
        Token tiles of 8 rows (the warp form's instantiation; the GEMV form's rows).
    tiles
        Blocks along N (``16 * rt`` weight rows each; GEMV form: ``rt * warps``):
        ``gridDim.x``.
    splits
        Blocks along k (``gridDim.y``), none of them empty.
    k_per_split
        k elements per split, a multiple of 64 (the last split may hold fewer).
    work_floats
        Split-k partials, ``tiles * splits * rt * nt * 4 * 32`` floats (0 unsplit).
    smem
        Dynamic shared memory per block, bytes.
    """

    nt: int
    tiles: int
    splits: int
    k_per_split: int
    work_floats: int
    smem: int


def geometry(cfg: SkinnyConfig, m: int, n: int, k: int) -> Geometry:
    """The launch geometry of ``cfg`` for an ``m x n x k`` problem."""
    if cfg.form == "gemv":
        return Geometry(mt_for(m), -(-n // (cfg.rt * cfg.warps)), 1, k, 0, 0)
    nt = nt_for(m)
    tiles = -(-n // (16 * cfg.rt))
    chunks = -(-k // 64)
    k_per_split = -(-chunks // cfg.splits) * 64
    splits = -(-k // k_per_split)
    work = tiles * splits * cfg.rt * nt * 4 * 32 if splits > 1 else 0
    return Geometry(nt, tiles, splits, k_per_split, work,
                    smem_bytes(cfg.rt, nt, cfg.warps, cfg.stages))


_FUNCTIONS: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def _key(dtype: str, m: int, cfg: SkinnyConfig) -> tuple:
    """What a compiled function is kept under: the device and the instantiation."""
    import cupy as cp

    return int(cp.cuda.runtime.getDevice()), cfg.expression(dtype, m), cfg.smem(m)


def compile_kernels(dtype: str, m: int, configs: list[SkinnyConfig]) -> dict[str, str]:
    """Compile the kernels of ``configs`` for ``m`` rows (one NVRTC module for those not
    compiled yet in this process; the binary is kept on disk by :mod:`.nvrtc`).

    Returns
    -------
    dict
        ``config id -> NVRTC's message`` for configurations that failed (empty if none).
    """

    from ..hardware.device import require_cupy

    require_cupy("the skinny GEMM")
    todo = {_key(dtype, m, cfg) for cfg in configs} - set(_FUNCTIONS)
    if not todo:
        return {}
    exprs = sorted({key[1] for key in todo})
    try:
        module = compile_module(native_source("skinny_gemm.cuh"), ("-std=c++17",), exprs,
                                "the skinny GEMM")
        functions = {e: module.get_function(e) for e in exprs}
    except Exception as exc:
        msg = f"NVRTC: {type(exc).__name__}: {exc}"[:500]
        return {cfg.id: msg for cfg in configs}
    failed = {}
    with _LOCK:
        for key in todo:
            _, expr, smem = key
            fn = functions[expr]
            try:
                if smem:
                    fn.max_dynamic_shared_size_bytes = smem
            except Exception as exc:  # the device refuses the shared memory
                failed[expr] = f"{type(exc).__name__}: {exc}"[:500]
                continue
            _FUNCTIONS[key] = fn
    by_config = {cfg.id: cfg.expression(dtype, m) for cfg in configs}
    return {cid: failed[e] for cid, e in by_config.items() if e in failed}


class SkinnyGemm:
    """The skinny GEMM of one configuration and dtype, launched on CuPy arrays.

    ``gemm(a, b, out, alpha=1.0, beta=0.0)`` computes ``out = alpha * a @ b + beta *
    out`` for ``a`` M x K C-contiguous and ``b`` K x N F-contiguous (``w.T``). The kernel
    for ``a``'s row count is compiled at the first call that needs it (the tuner and
    :func:`pyc_lab.kernels.prepare` compile ahead; CuPy caches the binary on disk). The
    split-k workspace and arrival counters are kept per device and stream, so launches
    on different streams never share them; the counters are zero between launches (the
    last block of each tile resets its own), which also makes a launch capturable in a
    CUDA graph once the first call has allocated them.

    Parameters
    ----------
    config
        The :class:`SkinnyConfig`.
    dtype
        ``"f16"`` or ``"bf16"``.

    Raises
    ------
    PycLabError
        For an unknown dtype or an impossible configuration.
    """

    layout = "tn"
    #: What :func:`pyc_lab.matmul` reports as the implementation (``last_choice["impl"]``).
    family = "skinny"

    def __init__(self, config: SkinnyConfig, dtype: str) -> None:
        if dtype not in _BF16:
            raise PycLabError(f"SkinnyGemm: dtype {dtype!r} is not one of {sorted(_BF16)}")
        self.config = config
        self.dtype = dtype
        self._scratch: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._bound: tuple | None = None
        self._launch: tuple | None = None

    def __repr__(self) -> str:
        return f"SkinnyGemm({self.config.id}, {self.dtype})"

    def can_implement(self, m: int, n: int, k: int) -> bool:
        """Whether the kernel takes an ``m x n x k`` problem (layout ``"tn"``)."""
        return not skinny_issue(m, n, k, self.dtype, "tn") and not self.config.issue(m)

    def _check(self, a: Any, b: Any, out: Any) -> tuple[int, int, int]:
        if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
            raise PycLabError("SkinnyGemm takes 2-D a, b and out")
        m, k = a.shape
        k2, n = b.shape
        if k != k2 or out.shape != (m, n):
            raise PycLabError(f"SkinnyGemm: a {a.shape} @ b {b.shape} -> out {out.shape} do "
                              "not fit together")
        want = _ARRAY_DTYPES[self.dtype]
        if any(x.dtype.name not in want for x in (a, b, out)):
            raise PycLabError(f"SkinnyGemm built for {self.dtype} got "
                              f"{sorted({x.dtype.name for x in (a, b, out)})} arrays")
        if not (a.flags.c_contiguous and b.flags.f_contiguous and out.flags.c_contiguous):
            raise PycLabError("SkinnyGemm takes a C-contiguous a, an F-contiguous b (w.T) and "
                              "a C-contiguous out")
        why = skinny_issue(m, n, k, self.dtype, "tn") or self.config.issue(m)
        if why:
            raise PycLabError(f"SkinnyGemm {self.config.id}: {why}")
        if a.data.ptr % 16 or b.data.ptr % 16:
            raise PycLabError("SkinnyGemm needs a and b 16-byte aligned")
        return m, n, k

    def _function(self, m: int) -> Any:
        key = _key(self.dtype, m, self.config)
        fn = _FUNCTIONS.get(key)
        if fn is None:
            failed = compile_kernels(self.dtype, m, [self.config])
            if failed:
                raise PycLabError(f"SkinnyGemm {self.config.id}: {failed[self.config.id]}")
            fn = _FUNCTIONS[key]
        return fn

    def _workspace(self, cp: Any, stream_ptr: int, floats: int, tiles: int) -> tuple:
        key = (int(cp.cuda.runtime.getDevice()), stream_ptr)
        work, counters = self._scratch.get(key, (None, None))
        if work is None or work.size < floats or counters.size < tiles:
            work = cp.empty(max(floats, 1), dtype=cp.float32)
            counters = cp.zeros(max(tiles, 1), dtype=cp.int32)
            self._scratch[key] = (work, counters)
        return work, counters

    def bind(self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0,
             stream_ptr: int = 0) -> None:
        """Check a problem and prepare its launch (``__call__`` does it when the arrays,
        scales or stream change)."""
        import cupy as cp
        import numpy as np

        m, n, k = self._check(a, b, out)
        geo = geometry(self.config, m, n, k)
        fn = self._function(m)
        args = (a, np.int64(k), b, np.int64(k), out, np.int64(n), np.float32(alpha),
                np.float32(beta), np.int32(m), np.int32(n), np.int32(k))
        if self.config.form == "warp":
            if geo.splits > 1:
                wp, cnt = self._workspace(cp, stream_ptr, geo.work_floats, geo.tiles)
            else:
                wp = cnt = np.uint64(0)  # null: an unsplit launch touches neither
            args += (np.int32(geo.k_per_split), wp, cnt)
        self._launch = (fn, (geo.tiles, geo.splits), (self.config.warps * 32,), args,
                        geo.smem)
        self._bound = (a.data.ptr, b.data.ptr, out.data.ptr, a.shape, b.shape, float(alpha),
                       float(beta), stream_ptr)

    def __call__(self, a: Any, b: Any, out: Any, c: Any = None, alpha: float = 1.0,
                 beta: float = 0.0, stream: Any = None, bias: Any = None) -> Any:
        """``out = alpha * a @ b + beta * out`` on ``stream`` (the current one).

        Raises
        ------
        PycLabError
            For operands the kernel does not take, a bias, or a ``c`` other than ``out``.
        """
        s = plain_call_stream("SkinnyGemm", out, c, bias, stream)
        key = (a.data.ptr, b.data.ptr, out.data.ptr, a.shape, b.shape, float(alpha),
               float(beta), s.ptr)
        if key != self._bound:
            self.bind(a, b, out, alpha, beta, s.ptr)
        self.launch(s)
        return out

    def launch(self, stream: Any = None) -> None:
        """Launch the bound problem again with nothing checked (the benchmark's path)."""
        if self._launch is None:
            raise PycLabError("SkinnyGemm.launch: call the kernel once first, so that a "
                              "problem is bound")
        fn, grid, block, args, smem = self._launch
        if stream is None:
            import cupy as cp

            stream = cp.cuda.get_current_stream()
        fn(grid, block, args, shared_mem=smem, stream=stream)
