"""The settings of a GEMM tuning, in one place: the defaults of every way to tune.

:func:`~pyc_lab.kernels.tuning.autotune.autotune_gemm`,
:func:`~pyc_lab.kernels.tuning.autotune.replay_autotune`, ``pyc-lab tune gemm``,
``%pyc_tune`` and :class:`~pyc_lab.widgets.AutotuneWidget` all take their defaults from
:class:`GemmTuneOptions`, so that they never disagree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import PycLabError
from ...search import Budget
from ...search.registry import normalise_name
from ..cutlass.config import ACTIVATIONS, Epilogue, check_dtype_layout

__all__ = ["GemmTuneOptions"]


def _whole(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = f"a whole number >= {minimum}" + (", or None for no limit" if allow_none else "")
        raise PycLabError(f"GEMM tuning option {name}={value!r}: give {what}")


def _seconds(name: str, value: Any, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        what = "seconds >= 0" + (", or None for no limit" if allow_none else "")
        raise PycLabError(f"GEMM tuning option {name}={value!r}: give {what}")


@dataclass(frozen=True)
class GemmTuneOptions:
    """How to tune one GEMM problem.

    Parameters
    ----------
    dtype
        ``"f16"`` or ``"bf16"`` (tensor cores, float32 accumulation, output in the same
        dtype), ``"tf32"`` (float32 arrays, TF32 tensor cores) or ``"f32"`` (float32 on
        the CUDA cores).
    layout
        ``"tn"`` (``a`` row-major, ``b`` column-major, as a linear layer's weight),
        ``"tt"``, ``"nt"`` or ``"nn"``.
    strategy
        ``"exhaustive"``, ``"random"``, ``"successive_halving"`` or ``"evolutionary"``.
    budget_s
        Stop starting new candidates after this many seconds (``None``: no limit).
    max_candidates
        Consider at most this many configurations, the best-ranked (``None``: all).
    repeats
        Timed runs at full fidelity (successive halving screens with fewer).
    seed
        The strategies' random seed: the same seed searches the same way.
    workers
        Live tuning: parallel ``nvcc`` builds (default: the CPU count).
    hang_s
        Live tuning: a candidate still running after this many seconds is recorded as
        ``"timeout"`` and the search stops (a hung kernel holds the GPU).
    bias, activation
        Tune kernels with this fused epilogue, ``act(a @ b + bias)`` (bias: a length-N
        row; activation ``"relu"``, ``"gelu"`` or ``"silu"``).
    stream_k
        Include ``cutlass_cppgen``'s listed Stream-K tile-scheduler candidates.
    wide
        Widen the space per problem (:func:`~pyc_lab.kernels.tuning.gemm_space.
        problem_configs`): lower-alignment kernels for extents that are not multiples
        of 8, swapped narrow tiles and split-K for small M, split-K / Stream-K for few
        output tiles and a long K, raster order and swizzle for many tiles.
    skinny
        Also measure pyc_lab's own skinny GEMM (:mod:`~pyc_lab.kernels.skinny`) for
        plain ``"tn"`` f16/bf16 problems of at most 64 rows: every configuration is
        checked and timed beside the CUTLASS candidates (no nvcc build; NVRTC compiles
        them in seconds), and the fastest of all is the winner.
    cutlass
        Search the CUTLASS candidates (each a ~1 minute nvcc build, once); ``False``
        measures only the skinny GEMM and cuBLASLt's picks beside the libraries, a
        tuning of seconds.
    lt_search
        Also measure cuBLASLt's heuristic picks beyond its first for plain f16/bf16
        problems (:mod:`~pyc_lab.kernels.tuning.lt_candidates`: eight for each way of
        describing the product, timed coarsely, the fastest few checked and timed
        beside the libraries); a winner is kept (cuBLASLt's algorithm struct, reusable
        with the same library version) and runs through cuBLASLt. Needs nvmath-python.

    Raises
    ------
    PycLabError
        For a value out of range, an unknown dtype, layout, strategy or activation.
    """

    dtype: str = "f16"
    layout: str = "tn"
    strategy: str = "successive_halving"
    budget_s: float | None = 180.0
    max_candidates: int | None = 16
    repeats: int = 20
    seed: int = 0
    workers: int | None = None
    hang_s: float = 20.0
    bias: bool = False
    activation: str | None = None
    stream_k: bool = False
    wide: bool = True
    skinny: bool = True
    cutlass: bool = True
    lt_search: bool = True

    def __post_init__(self) -> None:
        check_dtype_layout(self.dtype, self.layout)
        object.__setattr__(self, "strategy", normalise_name(self.strategy))
        _seconds("budget_s", self.budget_s, allow_none=True)
        _whole("max_candidates", self.max_candidates, 1, allow_none=True)
        _whole("repeats", self.repeats, 1)
        _whole("seed", self.seed, 0)
        _whole("workers", self.workers, 1, allow_none=True)
        _seconds("hang_s", self.hang_s, allow_none=False)
        if not isinstance(self.bias, bool):
            raise PycLabError(f"GEMM tuning option bias={self.bias!r}: give True or False")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise PycLabError(f"GEMM tuning option activation={self.activation!r}: give None "
                              f"or one of {sorted(ACTIVATIONS)}")
        if not isinstance(self.wide, bool):
            raise PycLabError(f"GEMM tuning option wide={self.wide!r}: give True or False")
        for name in ("skinny", "cutlass", "lt_search"):
            if not isinstance(getattr(self, name), bool):
                raise PycLabError(f"GEMM tuning option {name}={getattr(self, name)!r}: give "
                                  "True or False")
        if not (self.skinny or self.cutlass or self.lt_search):
            raise PycLabError("GEMM tuning options skinny=False, cutlass=False and "
                              "lt_search=False leave nothing to tune")
        if not isinstance(self.stream_k, bool):
            raise PycLabError(f"GEMM tuning option stream_k={self.stream_k!r}: give True "
                              "or False")

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The option names, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def resolve(cls, options: GemmTuneOptions | None = None,
                settings: Mapping[str, Any] | None = None) -> GemmTuneOptions:
        """``options`` (or the defaults) with ``settings`` applied.

        Raises
        ------
        PycLabError
            For a setting that is not an option (the message lists them).
        """
        base = cls() if options is None else options
        if not isinstance(base, cls):
            raise PycLabError(f"options= takes a GemmTuneOptions, got {type(base).__name__}")
        settings = dict(settings or {})
        unknown = sorted(set(settings) - set(cls.fields()))
        if unknown:
            raise PycLabError(f"unknown GEMM tuning option(s) {', '.join(unknown)}; the "
                              f"options are: {', '.join(cls.fields())}")
        return dataclasses.replace(base, **settings) if settings else base

    @property
    def epilogue(self) -> Epilogue:
        """The fused epilogue tuned for (the plain one without bias and activation)."""
        return Epilogue(self.bias, self.activation)

    def budget(self) -> Budget:
        """The search budget in seconds (the candidate cut happens before the search)."""
        return Budget(max_seconds=self.budget_s)

    def strategy_options(self, n_candidates: int) -> dict[str, Any]:
        """The options the search strategy gets, live and replayed alike.

        Successive halving screens at ``repeats // 9`` timed runs and refines at
        ``repeats`` (eta 3); evolutionary breeds populations of up to 8 for 4
        generations; the others time every candidate ``repeats`` times.
        """
        if self.strategy == "successive_halving":
            return {"eta": 3, "min_fidelity": max(2, self.repeats // 9),
                    "max_fidelity": self.repeats}
        if self.strategy == "evolutionary":
            return {"fidelity": self.repeats, "population": max(2, min(8, n_candidates)),
                    "generations": 4}
        return {"fidelity": self.repeats}

    def describe(self) -> str:
        """The search settings in words (for widgets and command output)."""
        budget = "no time limit" if self.budget_s is None else f"budget {self.budget_s:g} s"
        cands = ("all candidates" if self.max_candidates is None
                 else f"at most {self.max_candidates} candidates")
        return f"strategy {self.strategy}, {budget}, {cands}"
