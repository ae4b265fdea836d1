"""Trace the GPU work of a block of code: every kernel, copy and memset, per stream.

:class:`GpuActivity` collects CUDA's own activity records (CUPTI) for whatever the GPU
ran while the block ran — whichever library launched it: CuPy, CUTLASS, cuBLAS, PyTorch,
a :class:`~pyc_lab.runtime.pipeline.Pipeline` — and turns them into a
:class:`~pyc_lab.profiling.trace.Trace`: one lane per CUDA stream (``stream <id>``), kernels
as stage ``compute``, copies as ``h2d`` / ``d2h`` / ``d2d`` / ``copy``, memsets as
``memset``, each span with the kernel's name and launch shape or the copy's bytes. The
timeline widget and :meth:`Trace.overlap` then work on it as on a belt's trace (copy time
hidden behind kernels, GPU idle, starvation gaps, achieved GB/s).

Backends, tried in this order by ``backend="auto"``:

``cupti``
    NVIDIA's ``cupti-python`` (``pip install cupti-python``): the CUPTI Activity API
    itself (concurrent-kernel, memcpy and memset records).
``torch``
    PyTorch's profiler, which drives CUPTI through Kineto; its Chrome-trace export is
    read back.

Without a usable GPU or without either backend, :class:`GpuActivity` raises
:class:`~pyc_lab.errors.DeviceUnavailableError` saying which. One trace at a time per
process (CUPTI's activity buffers are process-wide).
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import DeviceUnavailableError, PycLabError
from ..hardware.device import cupy_status
from .spans import Span
from .trace import Trace

__all__ = ["BACKENDS", "GpuActivity", "spans_from_chrome", "spans_from_cupti"]

log = logging.getLogger(__name__)

BACKENDS = ("cupti", "torch")

#: CUPTI activity kinds (``CUpti_ActivityKind``) and memcpy kinds (``CUpti_ActivityMemcpyKind``)
KIND_MEMCPY, KIND_MEMSET, KIND_KERNEL, KIND_CONCURRENT_KERNEL = 1, 2, 3, 10
_COPY_STAGE = {1: "h2d", 2: "d2h", 8: "d2d", 10: "copy"}  # HTOD, DTOH, DTOD, PTOP
_NAME_MAX = 120

_ACTIVE = threading.Lock()  # one GpuActivity recording at a time in this process


def _short(name: str) -> str:
    return name if len(name) <= _NAME_MAX else name[: _NAME_MAX - 3] + "..."


def spans_from_cupti(records: Iterable[Mapping[str, Any]], offset_s: float = 0.0
                     ) -> list[Span]:
    """Spans from CUPTI activity records (as plain mappings of their fields).

    Parameters
    ----------
    records
        Each with ``kind``, ``start``, ``end`` (ns on CUPTI's clock), ``stream_id`` and,
        per kind, ``name``/``grid``/``block`` (kernels), ``bytes``/``copy_kind``
        (copies) or ``bytes`` (memsets). Other kinds are skipped.
    offset_s
        Added to every time (seconds): CUPTI's clock mapped onto ``perf_counter``.

    Returns
    -------
    list of Span
        In start order, ``item`` numbering them from 0.
    """
    spans = []
    for rec in sorted(records, key=lambda r: (r["start"], r["end"])):
        kind = int(rec["kind"])
        meta: dict[str, Any] = {}
        if kind in (KIND_KERNEL, KIND_CONCURRENT_KERNEL):
            stage, nbytes = "compute", 0
            meta = {"name": _short(str(rec.get("name", "kernel"))),
                    "grid": list(rec.get("grid", ())), "block": list(rec.get("block", ()))}
        elif kind == KIND_MEMCPY:
            stage = _COPY_STAGE.get(int(rec.get("copy_kind", 0)), "copy")
            nbytes = int(rec.get("bytes", 0))
            meta = {"name": f"memcpy {stage}"}
        elif kind == KIND_MEMSET:
            stage, nbytes = "memset", int(rec.get("bytes", 0))
            meta = {"name": "memset"}
        else:
            continue
        start = rec["start"] * 1e-9 + offset_s
        end = max(rec["end"] * 1e-9 + offset_s, start)
        spans.append(Span(len(spans), stage, f"stream {rec.get('stream_id', '?')}", start, end,
                          nbytes, meta))
    return spans


def _chrome_copy_stage(name: str) -> str:
    text = name.lower()
    for key, stage in (("htod", "h2d"), ("dtoh", "d2h"), ("dtod", "d2d"), ("ptop", "copy")):
        if key in text:
            return stage
    return "copy"


def spans_from_chrome(events: Iterable[Mapping[str, Any]]) -> list[Span]:
    """Spans from the GPU events of a PyTorch profiler (Kineto) Chrome trace.

    Complete events (``"ph": "X"``) of category ``kernel``, ``gpu_memcpy`` and
    ``gpu_memset`` are kept; ``ts``/``dur`` are microseconds, ``args.stream`` the
    stream and ``args.bytes`` a copy's size.
    """
    spans = []
    gpu = [e for e in events if e.get("ph") == "X"
           and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    for ev in sorted(gpu, key=lambda e: (float(e["ts"]), float(e.get("dur", 0)))):
        args = ev.get("args", {}) or {}
        cat, name = ev["cat"], str(ev.get("name", ""))
        if cat == "kernel":
            stage, nbytes = "compute", 0
            meta = {"name": _short(name), "grid": list(args.get("grid", ())),
                    "block": list(args.get("block", ()))}
        elif cat == "gpu_memcpy":
            stage, nbytes, meta = _chrome_copy_stage(name), int(args.get("bytes", 0)), {
                "name": name}
        else:
            stage, nbytes, meta = "memset", int(args.get("bytes", 0)), {"name": name}
        start = float(ev["ts"]) * 1e-6
        end = start + max(float(ev.get("dur", 0.0)), 0.0) * 1e-6
        spans.append(Span(len(spans), stage, f"stream {args.get('stream', '?')}", start, end,
                          nbytes, meta))
    return spans


class _CuptiBackend:  # pragma: no cover - needs a GPU and cupti-python
    """The CUPTI Activity API through ``cupti-python``."""

    _sink: list[dict[str, Any]] | None = None

    def __init__(self) -> None:
        from cupti import cupti

        self._c = cupti
        self._kinds = [cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMCPY,
                       cupti.ActivityKind.MEMSET]
        self.offset_s = 0.0

    @staticmethod
    def _fields(a: Any) -> dict[str, Any]:
        """Copy what we use out of a record (it lives in CUPTI's buffer)."""
        rec = {"kind": int(a.kind), "start": int(a.start), "end": int(a.end),
               "stream_id": int(getattr(a, "stream_id", 0))}
        if rec["kind"] in (KIND_KERNEL, KIND_CONCURRENT_KERNEL):
            rec["name"] = str(getattr(a, "name", "kernel"))
            rec["grid"] = [int(getattr(a, f"grid_{d}", 0)) for d in "xyz"]
            rec["block"] = [int(getattr(a, f"block_{d}", 0)) for d in "xyz"]
        else:
            rec["bytes"] = int(getattr(a, "bytes", 0))
            rec["copy_kind"] = int(getattr(a, "copy_kind", 0))
        return rec

    @classmethod
    def _requested(cls, *_args: Any) -> tuple[int, int]:
        return 8 << 20, 0  # an 8 MiB buffer, as many records as fit

    @classmethod
    def _completed(cls, *args: Any) -> None:
        activities = next((a for a in reversed(args) if isinstance(a, list | tuple)), [])
        sink = cls._sink
        if sink is None:
            return
        for a in activities:
            try:
                sink.append(cls._fields(a))
            except Exception as exc:  # an unexpected record type: skip it, say so once
                log.debug("GpuActivity: skipped a CUPTI record: %s", exc)

    def start(self, sink: list[dict[str, Any]]) -> None:
        c = self._c
        # every time: another CUPTI client in this process (PyTorch's profiler, say) may
        # have registered its own buffer callbacks since, and would get our records
        c.activity_register_callbacks(_CuptiBackend._requested, _CuptiBackend._completed)
        _CuptiBackend._sink = sink
        for kind in self._kinds:
            c.activity_enable(kind)
        before = time.perf_counter()
        ts = c.get_timestamp()
        after = time.perf_counter()
        self.offset_s = (before + after) / 2 - ts * 1e-9

    def stop(self) -> None:
        c = self._c
        try:
            c.activity_flush_all(1)  # forced: hands over every buffer, completed or not
        finally:
            for kind in self._kinds:
                c.activity_disable(kind)
            _CuptiBackend._sink = None


class _TorchBackend:  # pragma: no cover - needs a GPU and PyTorch
    """PyTorch's profiler (Kineto, on CUPTI), GPU activities only."""

    def __init__(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CUDA])

    def start(self, sink: list[dict[str, Any]]) -> None:
        self._sink = sink
        self._prof.start()

    def stop(self) -> None:
        self._prof.stop()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            self._prof.export_chrome_trace(str(path))
            doc = json.loads(path.read_text(encoding="utf-8"))
        events = doc.get("traceEvents", doc) if isinstance(doc, dict) else doc
        self._sink.extend(e for e in events if isinstance(e, dict))


#: backend -> (module to import, how to name it in a message)
_MODULES = {"cupti": ("cupti.cupti", "cupti-python"), "torch": ("torch.profiler",
                                                              "torch.profiler")}


def _backend_errors(wanted: tuple[str, ...] = BACKENDS, *, first: bool = False
                    ) -> dict[str, str]:
    """Why each of ``wanted`` cannot be imported here (no entry for those that can).

    With ``first`` the check stops at the first importable backend, so that PyTorch
    (seconds to import) is not imported when cupti-python will do.
    """
    import importlib

    errors = {}
    for name in wanted:
        module, label = _MODULES[name]
        try:
            importlib.import_module(module)
        except Exception as exc:
            errors[name] = f"{label}: {type(exc).__name__}: {exc}"
        else:
            if first:
                break
    return errors


class GpuActivity:
    """Record the GPU activity (kernels, copies, memsets) of a ``with`` block.

    Parameters
    ----------
    backend
        ``"auto"`` (cupti-python, else PyTorch's profiler), ``"cupti"`` or ``"torch"``.
    name
        The resulting trace's name (shown in the timeline's title).

    Raises
    ------
    DeviceUnavailableError
        No usable CUDA device, or no tracing backend importable (the reasons for each).
    PycLabError
        An unknown ``backend``, or another GpuActivity is recording.

    Examples
    --------
    ::

        with pl.GpuActivity() as act:
            y = cp.sin(cp.asarray(x)).get()
        act.trace.overlap().headline()
        pl.TimelineWidget(act.trace)
    """

    def __init__(self, backend: str = "auto", *, name: str = "GPU activity") -> None:
        if backend not in ("auto", *BACKENDS):
            raise PycLabError(f"GpuActivity: backend must be 'auto', 'cupti' or 'torch', "
                              f"not {backend!r}")
        cp, reason = cupy_status()
        if cp is None:
            raise DeviceUnavailableError(
                f"GpuActivity traces CUDA work and needs a CUDA device: {reason}")
        self._cp = cp
        wanted = BACKENDS if backend == "auto" else (backend,)
        errors = _backend_errors(wanted, first=True)
        usable = [b for b in wanted if b not in errors]
        if not usable:
            why = "; ".join(errors[b] for b in wanted)
            raise DeviceUnavailableError(
                f"GpuActivity needs a CUPTI backend: {why}. Install cupti-python "
                "(pip install cupti-python) or PyTorch.")
        self.backend = usable[0]
        self.name = name
        self.trace = Trace(name=name)
        self._impl: Any = None
        self._raw: list[dict[str, Any]] = []
        self._recording = False

    def __enter__(self) -> GpuActivity:  # pragma: no cover - needs a GPU
        if not _ACTIVE.acquire(blocking=False):
            raise PycLabError("another GpuActivity is recording in this process; CUPTI's "
                              "activity records are process-wide, so trace one block at a "
                              "time")
        try:
            self._cp.cuda.Device().synchronize()  # earlier work stays out of the trace
            self._impl = _CuptiBackend() if self.backend == "cupti" else _TorchBackend()
            self._raw = []
            self._impl.start(self._raw)
            self._recording = True
        except BaseException:
            _ACTIVE.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - needs a GPU
        if not self._recording:
            return
        try:
            try:
                self._cp.cuda.Device().synchronize()  # the block's work has finished
            except Exception as err:  # a failed kernel: keep what was recorded
                log.warning("GpuActivity: device synchronise failed: %s", err)
            self._impl.stop()
        finally:
            self._recording = False
            _ACTIVE.release()
        if self.backend == "cupti":
            spans = spans_from_cupti(self._raw, self._impl.offset_s)
        else:
            spans = spans_from_chrome(self._raw)
        self.trace = Trace(spans, name=self.name)
        log.info("GpuActivity (%s): %d spans on %d stream(s)", self.backend, len(spans),
                 len({s.lane for s in spans}))

    def __repr__(self) -> str:
        return (f"GpuActivity(backend={self.backend!r}, {len(self.trace)} spans, "
                f"lanes {self.trace.lanes})")
