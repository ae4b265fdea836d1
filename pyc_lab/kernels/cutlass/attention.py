"""pyc_lab's fused attention forward for Hopper: configurations, sources, builds, launches.

The kernel (``native/attention_fwd_sm90.cuh``) is pyc_lab's own FlashAttention-3-style
forward written with CuTe's building blocks: a producer warpgroup issuing TMA loads of
Q once and of K and V through two shared-memory pipelines, consumer warpgroups of 64
query rows each running both GEMMs as warpgroup MMAs (``wgmma``; P stays in the
registers S was accumulated in), and a float32 online softmax in base 2. It is written
in CUDA C++ and built by the same nvcc path and hash-verified kernel cache as the
GEMMs and convolutions (:func:`~pyc_lab.kernels.cutlass.nvcc.build_source`): CuTe's
headers ship in the nvidia-cutlass wheel, the build needs no GPU (kernels are prebuilt
off the GPU and carried), and a launch is one ctypes call.

A kernel is fixed by :class:`AttnKernel` (dtype, head dimension); a configuration
(:class:`AttnConfig`) is what the tuner searches: the key block, the pipeline depth and
the number of consumer warpgroups (64 query rows each) and whether the consumer loop is
software-pipelined. One build serves every batch, head count and sequence length.

What it takes (:meth:`AttnGeometry.issue` says what is wrong otherwise): float16 or
bfloat16 operands viewed as ``(B, H, S, D)`` with the head dimension contiguous, every
other stride a multiple of 8 elements (TMA's 16 bytes) and every pointer 16-byte
aligned; ``D`` 64 or 128; query heads a multiple of key/value heads; a positive scale;
no mask other than causal (top-left aligned, as torch's ``is_causal``).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import PycLabError
from ...paths import native_source
from ..cache import KernelCache
from .launch import load_library
from .nvcc import BuildResult, build_parallel, build_source, cached_library

__all__ = ["ATTN_DTYPES", "HEAD_DIMS", "AttnConfig", "AttnGeometry", "AttnKernel",
           "FusedAttention", "attention_configs", "build_attention", "build_attention_many",
           "cached_attention", "emit_attention_source"]

#: Element types and their C++ types.
ATTN_DTYPES = {"f16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t"}
#: Head dimensions the kernel is written for.
HEAD_DIMS = (64, 128)
#: Hopper's largest dynamic shared memory per CTA (bytes).
SMEM_LIMIT = 232448
_BARRIERS = 1024  # the pipelines' and Q's mbarriers, padded to the next 1024-byte line


def _line(n: int) -> int:
    """``n`` bytes rounded up to the 1024-byte alignment of a shared-memory buffer."""
    return -(-n // 1024) * 1024


@dataclass(frozen=True)
class AttnConfig:
    """A configuration: keys per block, buffers per K/V pipeline, consumer warpgroups,
    the consumer loop: software-pipelined (``overlap``: a block's S = Q K^T issued
    with the previous block's P V, its softmax while P V runs, the consumer warpgroups
    taking turns at the tensor cores) or one block at a time; and the schedule: one CTA
    per query block, or ``persistent`` (one CTA per SM looping over query blocks, the
    next block's Q, K and V loaded while the last one's P V and stores finish)."""

    block_n: int = 128
    stages: int = 2
    warpgroups: int = 2
    overlap: bool = True
    persistent: bool = False

    @property
    def block_m(self) -> int:
        """Query rows per CTA (64 per consumer warpgroup)."""
        return 64 * self.warpgroups

    @property
    def id(self) -> str:
        """``attn_n128_s2_w2_o`` (``_o``: overlapped, ``_p``: persistent): the tuning
        database's config id."""
        tail = ("_o" if self.overlap else "") + ("_p" if self.persistent else "")
        return f"attn_n{self.block_n}_s{self.stages}_w{self.warpgroups}{tail}"

    def to_dict(self) -> dict[str, Any]:
        """The configuration as the tuning database stores it."""
        return {"block_n": self.block_n, "stages": self.stages,
                "warpgroups": self.warpgroups, "overlap": int(self.overlap),
                "persistent": int(self.persistent)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttnConfig:
        """Inverse of :meth:`to_dict`."""
        try:
            return cls(int(d["block_n"]), int(d["stages"]), int(d["warpgroups"]),
                       bool(int(d["overlap"])), bool(int(d.get("persistent", 0))))
        except (KeyError, TypeError, ValueError) as exc:
            raise PycLabError(f"not an attention configuration: {d!r}") from exc

    def _pipelines_bytes(self, head_dim: int) -> int:
        """Q, the K and V rings (2-byte elements) and the barriers."""
        return (_line(self.block_m * head_dim * 2)
                + 2 * _line(self.stages * self.block_n * head_dim * 2) + _BARRIERS)

    def stores_through_smem(self, head_dim: int) -> bool:
        """Whether the output tile is staged in shared memory and stored by TMA (when
        there is room beside the pipelines; else each thread stores its registers)."""
        return self._pipelines_bytes(head_dim) + _line(self.block_m * head_dim * 2) \
            <= SMEM_LIMIT

    def q_buffers(self, head_dim: int) -> int:
        """Q buffers: 2 for a persistent configuration where shared memory has room for
        a second one beside the output's staging tile (the producer then loads the next
        tile's Q, K and V while the consumers still read this tile's Q), else 1."""
        if not self.persistent:
            return 1
        second = self._base_bytes(head_dim) + _line(self.block_m * head_dim * 2)
        return 2 if second <= SMEM_LIMIT else 1

    def _base_bytes(self, head_dim: int) -> int:
        """One Q buffer, the K and V rings, the barriers and the output's staging tile
        where :meth:`stores_through_smem`."""
        staged = _line(self.block_m * head_dim * 2) if self.stores_through_smem(head_dim) \
            else 0
        return self._pipelines_bytes(head_dim) + staged

    def smem_bytes(self, head_dim: int) -> int:
        """Shared memory of one CTA: the Q buffers (:meth:`q_buffers`), the K and V
        rings, the barriers, and the output's staging tile where
        :meth:`stores_through_smem`."""
        extra = (self.q_buffers(head_dim) - 1) * _line(self.block_m * head_dim * 2)
        return self._base_bytes(head_dim) + extra

    def issue(self, head_dim: int) -> str:
        """Why this configuration cannot be built for ``head_dim`` (``""`` when it can)."""
        if self.block_n % 16 or not 16 <= self.block_n <= 256:
            return f"key block {self.block_n} is not a multiple of 16 in [16, 256]"
        if self.warpgroups not in (2, 3):
            return f"{self.warpgroups} consumer warpgroups (2 or 3)"
        if self.stages < 2:
            return f"{self.stages} pipeline stage(s); at least 2"
        if self.warpgroups == 3 and head_dim > 64:
            # 160 registers a consumer thread cannot hold S, O and P at D = 128
            return "3 consumer warpgroups only for head dimension 64 (register budget)"
        if self.smem_bytes(head_dim) > SMEM_LIMIT:
            return (f"{self.smem_bytes(head_dim)} bytes of shared memory > {SMEM_LIMIT}")
        return ""


@dataclass(frozen=True)
class AttnKernel:
    """What an attention kernel is built for (everything but the configuration)."""

    dtype: str = "bf16"
    head_dim: int = 128

    def __post_init__(self) -> None:
        if self.dtype not in ATTN_DTYPES:
            raise PycLabError(f"pyc_lab's attention kernel takes {sorted(ATTN_DTYPES)}, not "
                              f"{self.dtype!r}")
        if self.head_dim not in HEAD_DIMS:
            raise PycLabError(f"pyc_lab's attention kernel takes head dimension "
                              f"{HEAD_DIMS}, not {self.head_dim}")

    def op(self, causal: bool) -> str:
        """The tuning database's op: ``attention_fwd`` or ``attention_fwd_causal``."""
        return "attention_fwd_causal" if causal else "attention_fwd"


#: The space searched, before each configuration's own check for a head dimension.
SPACE = tuple(AttnConfig(n, s, w, o, p) for o in (True, False) for w in (2, 3)
              for n in (64, 128, 192) for s in (2, 3) for p in (False, True))


def attention_configs(kernel: AttnKernel, causal: bool = False) -> list[AttnConfig]:
    """The configurations worth building for ``kernel``, best first by a cheap rule.

    Every configuration that fits (:meth:`AttnConfig.issue`) is kept. Ranking: the
    overlapped loop before the one-block-at-a-time one; within each, the 128-key block
    with two stages and two consumer warpgroups first (FlashAttention-3's choice at both
    head dimensions), then the wider blocks (fewer softmax rescales per key, more MMA
    work per barrier) before the narrower ones, deeper pipelines after shallower ones of
    the same block; for causal problems the 64-key block moves up (less work masked
    away on the diagonal); each persistent configuration right before its
    one-CTA-per-block twin (it hides a query block's first loads and its stores behind
    the previous block's work), so the first configuration — what an untuned problem
    runs — is the persistent ``attn_n128_s2_w2_o_p``.
    """
    def rank(c: AttnConfig) -> tuple:
        default = (c.block_n, c.stages, c.warpgroups) == (128, 2, 2)
        wide = -c.block_n if not causal else abs(c.block_n - 96)
        return (not c.overlap, not default, c.warpgroups != 2, wide, c.stages,
                not c.persistent)

    return sorted((c for c in SPACE if not c.issue(kernel.head_dim)), key=rank)


def emit_attention_source(config: AttnConfig, kernel: AttnKernel) -> str:
    """The complete CUDA C++ of one attention kernel and its ``extern "C"`` functions."""
    why = config.issue(kernel.head_dim)
    if why:
        raise PycLabError(f"attention {config.id} for D={kernel.head_dim}: {why}")
    defines = {"PYC_ELEMENT": ATTN_DTYPES[kernel.dtype], "PYC_HEAD_DIM": kernel.head_dim,
               "PYC_BLOCK_N": config.block_n, "PYC_STAGES": config.stages,
               "PYC_MMA_WG": config.warpgroups, "PYC_OVERLAP": int(config.overlap),
               "PYC_PERSISTENT": int(config.persistent),
               "PYC_STORE_O": int(config.stores_through_smem(kernel.head_dim)),
               "PYC_Q_STAGES": config.q_buffers(kernel.head_dim)}
    head = (f"// pyc_lab attention forward {kernel.dtype} D={kernel.head_dim}: "
            f"{config.id}\n")
    return head + "".join(f"#define {k} {v}\n" for k, v in defines.items()) + \
        native_source("attention_fwd_sm90.cuh")


def build_attention(config: AttnConfig, kernel: AttnKernel, cc: int = 90,
                    cache: KernelCache | None = None, timeout_s: float = 900.0
                    ) -> BuildResult:
    """Build one attention kernel into the kernel cache (or take it from there); a
    failure is a result carrying nvcc's message, never a raise."""
    if cc < 90:
        return BuildResult(config, "", None, "compile_error", 0.0,
                           f"pyc_lab's attention kernel needs Hopper (sm_90a); this is "
                           f"sm_{cc}")
    try:
        source = emit_attention_source(config, kernel)
    except PycLabError as exc:
        return BuildResult(config, "", None, "compile_error", 0.0, str(exc))
    return build_source(config, source, cc, cache, timeout_s,
                        meta={"config": config.to_dict(), "op": "attention_fwd",
                              "dtype": kernel.dtype, "head_dim": kernel.head_dim})


def build_attention_many(configs: Sequence[AttnConfig], kernel: AttnKernel, cc: int = 90,
                         workers: int | None = None, cache: KernelCache | None = None,
                         on_done: Callable[[BuildResult], None] | None = None) -> dict:
    """Start building ``configs`` on ``workers`` threads (one nvcc each); a future per
    configuration, in the order given."""
    return build_parallel(configs, lambda c: build_attention(c, kernel, cc, cache),
                          workers, on_done, "pyc-nvcc-attn")


def cached_attention(config: AttnConfig, kernel: AttnKernel, cc: int = 90,
                     cache: KernelCache | None = None) -> Path | None:
    """The kernel's library if it is in the kernel cache, else ``None``; never builds
    (what a call of ``pl.attention`` may afford)."""
    if config.issue(kernel.head_dim):
        return None
    return cached_library(emit_attention_source(config, kernel), cc, cache)


@dataclass(frozen=True)
class AttnGeometry:
    """One attention problem as the kernel takes it: sizes, element strides ``(batch,
    head, row)`` of q, k, v and the output (the head dimension contiguous), the scale
    and causality."""

    batch: int
    heads_q: int
    heads_kv: int
    len_q: int
    len_k: int
    head_dim: int
    strides: tuple[tuple[int, int, int], ...]  # q, k, v, o
    scale: float
    causal: bool

    @property
    def flops(self) -> int:
        """``4 B Hq Sq Sk D`` (two GEMMs), halved for causal (as the anchors count)."""
        f = 4 * self.batch * self.heads_q * self.len_q * self.len_k * self.head_dim
        return f // 2 if self.causal else f

    def issue(self, kernel: AttnKernel) -> str:
        """Why ``kernel`` cannot take this problem (``""`` when it can)."""
        if self.head_dim != kernel.head_dim:
            return f"head dimension {self.head_dim}, the kernel's is {kernel.head_dim}"
        if min(self.batch, self.heads_q, self.heads_kv, self.len_q, self.len_k) < 1:
            return "an empty batch, head count or sequence"
        if self.heads_q % self.heads_kv:
            return f"{self.heads_q} query heads are not a multiple of {self.heads_kv}"
        if self.batch > 65535 or self.heads_q > 65535:
            return "more than 65535 batches or heads (the launch grid's limit)"
        if max(self.len_q, self.len_k) >= 2**31:
            return "a sequence of 2^31 or more"
        if not self.scale > 0:
            return f"scale {self.scale}: the kernel takes a positive scale"
        for name, st in zip("qkvo", self.strides, strict=True):
            if any(s % 8 or s <= 0 for s in st):
                return (f"{name}'s strides {st} (elements, batch/head/row): TMA needs "
                        "positive multiples of 8 (16 bytes)")
        return ""

    def arrays(self) -> tuple[Any, ...]:
        """The four ``long long[3]`` stride arrays the C function takes."""
        return tuple((ctypes.c_longlong * 3)(*st) for st in self.strides)


def _declare_attention(lib: ctypes.CDLL) -> None:
    vp, c_int, ll3 = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_longlong)
    lib.pyc_attn_smem_bytes.restype = c_int
    lib.pyc_attn_head_dim.restype = c_int
    lib.pyc_attn_block_m.restype = c_int
    lib.pyc_attn_fwd.argtypes = [vp, vp, vp, vp, vp, c_int, c_int, c_int, c_int, c_int,
                                 ll3, ll3, ll3, ll3, ctypes.c_float, c_int, vp]
    lib.pyc_attn_fwd.restype = c_int


@dataclass
class FusedAttention:
    """A built attention kernel, launched on device pointers.

    ``attn.run(geometry, q, k, v, o, lse, stream)`` computes
    ``o = softmax(q k^T scale [causal]) v`` and, when ``lse`` is not 0, the rows'
    natural log-sum-exp (float32, ``(B, Hq, Sq)`` contiguous). Pointers are raw device
    addresses (``int``), so CuPy arrays and torch tensors go through the same call.
    """

    library: Path
    config: AttnConfig = field(default_factory=AttnConfig)
    kernel: AttnKernel = field(default_factory=AttnKernel)
    _lib: Any = field(default=None, repr=False)
    _arrays: tuple[AttnGeometry, tuple[Any, ...]] | None = field(default=None, repr=False)
    _lock: Any = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self._lib = load_library(Path(self.library), _declare_attention)
        if self._lib.pyc_attn_head_dim() != self.kernel.head_dim or \
                self._lib.pyc_attn_block_m() != self.config.block_m:
            raise PycLabError(f"{self.library} is not a D={self.kernel.head_dim} "
                              f"{self.config.id} attention kernel")

    def run(self, geometry: AttnGeometry, q: int, k: int, v: int, o: int, lse: int,
            stream: int) -> None:
        """Launch on ``stream``.

        Raises
        ------
        PycLabError
            A problem the kernel cannot take, a pointer not 16-byte aligned, or a
            launch error.
        """
        with self._lock:
            if self._arrays is None or self._arrays[0] != geometry:
                why = geometry.issue(self.kernel)
                if why:
                    raise PycLabError(f"pyc_lab attention {self.config.id}: {why}")
                self._arrays = (geometry, geometry.arrays())
            arrays = self._arrays[1]
        if any(p % 16 for p in (q, k, v)) or o % 4 or lse % 4:
            raise PycLabError("pyc_lab attention: q, k and v must start on 16-byte "
                              "boundaries (TMA), the output on 4")
        st = self._lib.pyc_attn_fwd(q, k, v, o, lse or None, geometry.batch, geometry.heads_q,
                                    geometry.heads_kv, geometry.len_q, geometry.len_k,
                                    *arrays, geometry.scale, int(geometry.causal), stream)
        if st != 0:
            raise PycLabError(f"pyc_lab attention {self.config.id} launch failed (CUDA "
                              f"error {st})")
