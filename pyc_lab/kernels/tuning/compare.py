"""Tuned kernels against the libraries, across problems: TFLOP/s, % of peak, ratios.

:class:`Comparison` takes tuning results (live or replayed) or plain rows and answers
what a comparison chart and table show: per problem and kernel the time, TFLOP/s, the
fraction of the GPU's dense peak and the speed relative to cuBLAS, and the tuned
kernel's median ratio.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import PycLabError
from ...hardware.peaks import peak_tflops
from ...units import gemm_flops
from .result import TuneResult, kernel_rates

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["KERNEL_LABELS", "Comparison", "kernel_label"]

#: How kernels are named in frames and charts.
KERNEL_LABELS = {"tuned CUTLASS": "tuned CUTLASS", "cublas": "cuBLAS", "torch": "torch",
                 "cublaslt": "cuBLASLt"}

Problem = tuple[int, int, int, str, str]


def kernel_label(name: str) -> str:
    """How a kernel of :meth:`TuneResult.compare` is named (``cublas`` -> cuBLAS)."""
    return KERNEL_LABELS.get(name, name)


def problem_label(problem: Problem) -> str:
    """``"4096x4096x4096 f16 tn"``."""
    m, n, k, dtype, layout = problem
    return f"{m}x{n}x{k} {dtype} {layout}"


class Comparison:
    """Kernel times per problem, and what they mean against the libraries and the peak.

    Parameters
    ----------
    results_or_rows
        Tuning results (:class:`~pyc_lab.kernels.tuning.result.TuneResult`, live or
        replayed), or rows — a DataFrame or dicts — with columns ``m``, ``n``, ``k``,
        ``dtype``, ``kernel`` (``"tuned CUTLASS"``, ``"cublas"``, ``"torch"``) and ``ms``;
        optional ``layout``, ``gpu_name`` and ``source``.

    Raises
    ------
    PycLabError
        For an empty input or rows missing a column.
    """

    def __init__(self, results_or_rows: Any) -> None:
        self.rows = self._rows(results_or_rows)
        if not self.rows:
            raise PycLabError("a kernel comparison needs at least one tuning result or row")

    @classmethod
    def from_recording(cls, source: str | Path | None = None, dtype: str | None = None,
                       layout: str | None = None) -> Comparison:
        """Every problem of a recording (the shipped H200 one by default), optionally of
        one dtype / layout."""
        from .recording import recorded_results

        results = recorded_results(source, dtype=dtype, layout=layout)
        if not results:
            raise PycLabError(f"the recording holds no GEMM problem with dtype={dtype!r}, "
                              f"layout={layout!r}; see pyc_lab.kernels.tuning.recording."
                              "recorded_problems()")
        return cls(results)

    # -- rows ---------------------------------------------------------------------------
    @staticmethod
    def _rows(data: Any) -> list[dict[str, Any]]:
        if isinstance(data, TuneResult):
            data = [data]
        if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a DataFrame
            data = data.to_dict("records")
        if not isinstance(data, Iterable):
            raise PycLabError(f"a kernel comparison takes tuning results or rows, not "
                              f"{type(data).__name__}")
        rows: list[dict[str, Any]] = []
        for item in data:
            if isinstance(item, TuneResult):
                rows += Comparison._result_rows(item)
            elif isinstance(item, dict):
                missing = {"m", "n", "k", "dtype", "kernel", "ms"} - set(item)
                if missing:
                    raise PycLabError(f"comparison row {item!r} lacks {sorted(missing)}; "
                                      "give m, n, k, dtype, kernel, ms")
                rows.append({"m": int(item["m"]), "n": int(item["n"]), "k": int(item["k"]),
                             "dtype": str(item["dtype"]),
                             "layout": str(item.get("layout") or "tn"),
                             "kernel": str(item["kernel"]), "ms": item["ms"],
                             "gpu_name": str(item.get("gpu_name") or ""),
                             "source": str(item.get("source") or "")})
            else:
                raise PycLabError(f"a kernel comparison takes TuneResults or dict rows, not "
                                  f"{type(item).__name__}")
        return rows

    @staticmethod
    def _result_rows(res: TuneResult) -> list[dict[str, Any]]:
        info = getattr(res, "replay", None)
        source = info.label if info is not None else f"tuned live on {res.device.gpu_name}"
        m, n, k = res.problem.shape
        entries = [("tuned CUTLASS", res.best.time_ms if res.best else None),
                   *res.baselines.items()]
        return [{"m": m, "n": n, "k": k, "dtype": res.problem.dtype_a,
                 "layout": res.problem.layout, "kernel": name, "ms": ms,
                 "gpu_name": res.device.gpu_name, "source": source} for name, ms in entries]

    # -- what the rows say --------------------------------------------------------------
    def default_title(self) -> str:
        """The devices and, for recordings, where and when they were recorded."""
        gpus = sorted({r["gpu_name"] for r in self.rows if r["gpu_name"]})
        sources = sorted({r["source"] for r in self.rows if r["source"]})
        text = f"{len(self.problems())} problem(s)"
        if sources:  # "recorded on <GPU>, <date>" / "tuned live on <GPU>"
            return f"{text} — " + "; ".join(sources)
        return f"{text} on " + ", ".join(gpus) if gpus else text

    def problems(self) -> list[Problem]:
        """The problems ``(m, n, k, dtype, layout)``, in first-seen order."""
        seen: dict[Problem, None] = {}
        for r in self.rows:
            seen.setdefault((r["m"], r["n"], r["k"], r["dtype"], r["layout"]), None)
        return list(seen)

    def kernels(self) -> list[str]:
        """The kernels compared: tuned CUTLASS first, then cuBLAS, torch, others."""
        order = {"tuned CUTLASS": 0, "cublas": 1, "torch": 2}
        return sorted({r["kernel"] for r in self.rows},
                      key=lambda name: (order.get(name, 3), name))

    def peaks(self) -> list[float]:
        """The dense peaks (TFLOP/s) of the devices and dtypes compared, where known."""
        return sorted({peak_tflops(r["gpu_name"], r["dtype"]) for r in self.rows
                       if r["gpu_name"]} - {None})

    def to_frame(self) -> pd.DataFrame:
        """One row per problem and kernel: ms, TFLOP/s, % of the dense peak, speed vs
        cuBLAS (``cublas_ms / ms``: above 1 is faster than cuBLAS), device, source."""
        import pandas as pd

        cublas = {(r["m"], r["n"], r["k"], r["dtype"], r["layout"]): r["ms"]
                  for r in self.rows if r["kernel"] == "cublas" and r["ms"]}
        out = []
        for r in self.rows:
            key = (r["m"], r["n"], r["k"], r["dtype"], r["layout"])
            ms = r["ms"] if r["ms"] and r["ms"] == r["ms"] else None
            peak = peak_tflops(r["gpu_name"], r["dtype"]) if r["gpu_name"] else None
            out.append({"problem": problem_label(key), "kernel": kernel_label(r["kernel"]),
                        "ms": ms, **kernel_rates(gemm_flops(*key[:3]), ms, peak,
                                                 cublas.get(key)),
                        "gpu_name": r["gpu_name"], "source": r["source"]})
        return pd.DataFrame(out, columns=["problem", "kernel", "ms", "tflops", "pct_of_peak",
                                          "vs_cublas", "gpu_name", "source"])

    def ratios(self) -> pd.DataFrame:
        """One row per problem: TFLOP/s of each kernel, the tuned kernel's % of the dense
        peak, and each kernel's speed relative to cuBLAS (``x cuBLAS``)."""
        import pandas as pd

        frame = self.to_frame()
        labels = [kernel_label(k) for k in self.kernels()]
        rows = []
        for problem in self.problems():
            name = problem_label(problem)
            part = frame[frame["problem"] == name].set_index("kernel")
            row: dict[str, Any] = {"problem": name}
            for label in labels:
                row[f"{label} TFLOP/s"] = part["tflops"].get(label)
            row["tuned % of peak"] = part["pct_of_peak"].get("tuned CUTLASS")
            if "cuBLAS" in labels:
                for label in labels:
                    if label != "cuBLAS":
                        row[f"{label} x cuBLAS"] = part["vs_cublas"].get(label)
            rows.append(row)
        return pd.DataFrame(rows)

    def summary(self) -> str:
        """One line: the tuned kernel's median speed relative to cuBLAS, or why not."""
        frame = self.to_frame()
        tuned = frame[(frame["kernel"] == "tuned CUTLASS") & frame["vs_cublas"].notna()]
        if tuned.empty:
            return ("no cuBLAS time to compare with (the results hold no cuBLAS baseline; "
                    "a recording has them when its run recorded baseline rows)")
        ratios = tuned["vs_cublas"].tolist()
        faster = sum(r > 1.0 for r in ratios)
        return (f"tuned CUTLASS vs cuBLAS: median {statistics.median(ratios):.2f}x over "
                f"{len(ratios)} problem(s), faster on {faster}")
