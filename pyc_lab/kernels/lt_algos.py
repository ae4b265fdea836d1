"""cuBLASLt's heuristic picks for one GEMM, kept to be run again.

cuBLASLt's heuristic (what :class:`~.blas_direct.LtGemm` asks) ranks a few algorithms
with a model of the GPU. The library also lets a caller list every algorithm it has for
the dtypes (``cublasLtMatmulAlgoGetIds``), read what each can be set to (tile shapes,
pipeline stages, split-K with its reduction schemes, CTA swizzling, custom options) and
check one setting against the actual problem (``cublasLtMatmulAlgoCheck``: whether it
runs, and the workspace it needs).

On Hopper the listed space does not reach the kernels the heuristic returns (measured on
an H100: the best listed setting ran at 0.53-0.67x cuBLAS on compute-bound GEMMs,
``benchmarks/results/h100/issue14-7ec7fe4/``), while the heuristic's own lower-ranked
picks were faster than its first on some problems. So the tuner measures the heuristic's
picks (:mod:`.tuning.lt_candidates`), and a winner is kept as an :class:`LtPick`: the
opaque algorithm struct itself, which cuBLASLt documents as serialisable for reuse with
the same library version, with the description it was picked for and that version.
:func:`pyc_lab.matmul` runs it through :class:`~.blas_direct.LtGemm` after checking it
against the problem again. The listing itself lives with the experiment that measured
it (``benchmarks/lt_space.py``, ``benchmarks/exp_cublaslt_search.py``).

Nothing here touches a GPU until a function is called with a cuBLASLt handle.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import PycLabError

__all__ = ["KERNEL", "LtPick", "aligned", "capability", "check", "describe", "is_lt_algo"]

#: The ``"kernel"`` value of a stored :class:`LtPick`.
KERNEL = "cublaslt"


def is_lt_algo(config: Any) -> bool:
    """Whether a stored configuration (a dict) names a kept cuBLASLt pick."""
    return isinstance(config, dict) and config.get("kernel") == KERNEL


#: Configuration attributes :func:`describe` reads (``CUBLASLT_ALGO_CONFIG_*``).
_DESCRIBED = ("ID", "TILE_ID", "STAGES_ID", "SPLITK_NUM", "REDUCTION_SCHEME", "CTA_SWIZZLING",
              "CUSTOM_OPTION", "CLUSTER_SHAPE_ID", "INNER_SHAPE_ID")


def describe(lt: Any, algo: np.ndarray) -> dict[str, int]:
    """What an algorithm struct is set to (``{"id": 66, "tile_id": 20, ...}``; attributes
    this cuBLASLt cannot read are left out)."""
    out = {}
    for name in _DESCRIBED:
        attr = getattr(lt.MatmulAlgoConfigAttribute, name, None)
        if attr is None:
            continue
        buf = np.zeros(1, dtype=lt.get_matmul_algo_config_attribute_dtype(attr))
        written = np.zeros(1, dtype=np.uint64)
        try:
            lt.matmul_algo_config_get_attribute(algo.ctypes.data, attr, buf.ctypes.data,
                                                buf.nbytes, written.ctypes.data)
        except Exception:
            continue
        out[name.lower()] = int(buf[0])
    return out


@dataclass(frozen=True)
class LtPick:
    """One of cuBLASLt's heuristic picks for a problem, kept to be run again.

    Attributes
    ----------
    form
        The description it was picked for: 0 the transposed product with row orders
        (``out^T = b^T a^T``), 1 the product as given (:class:`~.blas_direct.LtGemm`'s
        two forms).
    words
        The ``cublasLtMatmulAlgo_t`` struct, its eight 64-bit words.
    version
        ``cublasLtGetVersion()`` of the library that picked it (the struct is reusable
        with that version only).
    algo_id, tile, stages, splitk, cluster
        What the struct is set to (for names and reports).
    """

    form: int
    words: tuple[int, ...]
    version: int
    algo_id: int = -1
    tile: int = 0
    stages: int = 0
    splitk: int = 1
    cluster: int = 0

    @property
    def id(self) -> str:
        """A short name: ``lt66_t20_s8_k1_c2_f0_3fa2c1`` (the last part from the words)."""
        import hashlib

        digest = hashlib.sha1(np.array(self.words, dtype=np.uint64).tobytes()).hexdigest()
        return (f"lt{self.algo_id}_t{self.tile}_s{self.stages}_k{self.splitk}_"
                f"c{self.cluster}_f{self.form}_{digest[:6]}")

    def struct(self, lt: Any) -> np.ndarray:
        """The algorithm struct (a one-element array of ``lt.matmul_algo_dtype``)."""
        algo = np.zeros(1, dtype=lt.matmul_algo_dtype)
        algo.view(np.uint64)[:] = np.array(self.words, dtype=np.uint64)
        return algo

    @classmethod
    def of(cls, lt: Any, form: int, algo: np.ndarray) -> LtPick:
        """The pick of an algorithm struct (a heuristic result's ``algo``)."""
        words = tuple(int(w) for w in np.ascontiguousarray(algo).view(np.uint64)[:8])
        d = describe(lt, np.ascontiguousarray(algo))
        return cls(form, words, int(lt.get_version()), d.get("id", -1), d.get("tile_id", 0),
                   d.get("stages_id", 0), d.get("splitk_num", 1), d.get("cluster_shape_id", 0))

    def to_dict(self) -> dict[str, Any]:
        """The pick as the tuning database stores it (``kernel: "cublaslt"``)."""
        d = asdict(self)
        d["words"] = [str(w) for w in self.words]  # 64-bit words past JSON's exact range
        return {"kernel": KERNEL, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LtPick:
        """The pick :meth:`to_dict` stored.

        Raises
        ------
        PycLabError
            For a dict that is not a kept cuBLASLt pick.
        """
        if not is_lt_algo(d):
            raise PycLabError(f"not a cuBLASLt pick: {d!r}")
        try:
            words = tuple(int(w) for w in d["words"])
            if len(words) != 8:
                raise ValueError(f"{len(words)} words, not 8")
            return cls(int(d["form"]), words, int(d["version"]),
                       *(int(d.get(f, dflt)) for f, dflt in (
                           ("algo_id", -1), ("tile", 0), ("stages", 0), ("splitk", 1),
                           ("cluster", 0))))
        except (KeyError, TypeError, ValueError) as exc:
            raise PycLabError(f"cuBLASLt pick {d!r} is incomplete: {exc}") from exc


def capability(lt: Any, algo: np.ndarray, name: str) -> list[int]:
    """A capability of an initialised algorithm (``cublasLtMatmulAlgoCapGetAttribute``),
    as a list (empty when the algorithm has none)."""
    attr = getattr(lt.MatmulAlgoCapAttribute, name)
    dt = np.dtype(lt.get_matmul_algo_cap_attribute_dtype(attr))
    written = np.zeros(1, dtype=np.uint64)
    lt.matmul_algo_cap_get_attribute(algo.ctypes.data, attr, 0, 0, written.ctypes.data)
    count = int(written[0]) // dt.itemsize
    if not count:
        return []
    buf = np.zeros(count, dtype=dt)
    lt.matmul_algo_cap_get_attribute(algo.ctypes.data, attr, buf.ctypes.data, buf.nbytes,
                                     written.ctypes.data)
    return [int(x) for x in buf]


def check(lt: Any, handle: int, desc: int, layouts: tuple[int, int, int], algo: np.ndarray,
          max_workspace: int) -> np.ndarray | None:
    """The heuristic-result record (the algorithm first, then its workspace size) of a
    setting the problem takes within ``max_workspace`` bytes, else ``None``."""
    result = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
    la, lb, lc = layouts
    try:
        lt.matmul_algo_check(handle, desc, la, lb, lc, lc, algo.ctypes.data,
                             result.ctypes.data)
    except Exception:  # cuBLASLt refuses the setting for this problem
        return None
    if int(result["workspace_size"][0]) > max_workspace:
        return None
    result["algo"][0] = algo[0]
    return result


def aligned(lt: Any, algo: np.ndarray, alignments: tuple[int, int, int]) -> bool:
    """Whether pointers of these alignments (cuBLASLt's A, B and C/D, in bytes) meet the
    algorithm's minimum alignments (a setting checked on one problem may need 16-byte
    pointers that another call of the same shape does not have)."""
    needs = []
    for which in ("A", "B", "C", "D"):
        try:
            needs.append((capability(lt, algo, f"MIN_ALIGNMENT_{which}_BYTES") or [1])[0])
        except Exception:  # a build without the capability: assume the strictest
            needs.append(16)
    have = (alignments[0], alignments[1], alignments[2], alignments[2])
    return all(h >= n for h, n in zip(have, needs, strict=True))
