"""The hardware profile: what a machine is and how it is wired, with provenance.

A :class:`HardwareProfile` holds the host (CPU, NUMA nodes, memory), each GPU and the
GPU-to-GPU link matrix. Every value remembers which provider gave it (``sources``) and
why the other providers could not answer (``fallbacks``), so that a user can see *why*
pyc_lab believes GPU 0 sits on NUMA node 0.

Profiles are plain data: :meth:`HardwareProfile.to_json` and
:meth:`HardwareProfile.from_json` round-trip them exactly; that is how snapshots of
other machines are shipped and loaded. Loading checks every field against its type, so
that a hand-edited or foreign snapshot fails at once with a
:class:`~pyc_lab.errors.SnapshotError` naming the field, not later in a table or widget.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import json
import logging
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PycLabError, SnapshotError
from ..paths import replacing
from .cpulist import format_cpulist, parse_cpulist

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "LINK_KINDS",
    "GPUInfo",
    "HardwareProfile",
    "HostInfo",
    "LinkInfo",
    "NumaNode",
    "pcie_bandwidth_gbps",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

#: The largest snapshot file read (a real one is a few KiB, a DGX's about 100 KiB).
MAX_SNAPSHOT_BYTES = 16 * 2**20
#: The largest CPU id a snapshot's cpulists may name (Linux builds for at most 8192).
_MAX_CPU_ID = 2**16

#: Usable bandwidth of one PCIe lane in GB/s per direction, by generation
#: (line rate after 8b/10b, 128b/130b or FLIT encoding).
_PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.9846, 4: 1.9692, 5: 3.9385, 6: 7.5625}

#: NVLink bandwidth per link and direction in GB/s, by NVLink version.
NVLINK_LINK_GBPS = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}

#: The connection kinds of ``nvidia-smi topo -m``, nearest first.
LINK_KINDS = {
    "X": "self",
    "NV#": "bonded set of # NVLinks",
    "PIX": "at most one PCIe bridge",
    "PXB": "several PCIe bridges, no host bridge",
    "PHB": "a PCIe host bridge (same root complex)",
    "NODE": "PCIe host bridges within one NUMA node",
    "SYS": "across the inter-socket link (SMP interconnect)",
}


def pcie_bandwidth_gbps(gen: int | None, width: int | None) -> float | None:
    """Theoretical PCIe bandwidth per direction in GB/s for a link generation and width.

    Returns ``None`` when either is unknown. PCIe 5.0 x16 gives 63.02 GB/s.
    """
    if not gen or not width or gen not in _PCIE_LANE_GBPS:
        return None
    return round(_PCIE_LANE_GBPS[gen] * width, 2)


@dataclass
class NumaNode:
    """One NUMA node of the host: its id, CPUs and memory."""

    id: int
    cpus: list[int] = field(default_factory=list)
    memory_total_bytes: int | None = None


@dataclass
class HostInfo:
    """Facts about the host: CPU model, sockets, cores, NUMA nodes and memory."""

    cpu_model: str | None = None
    architecture: str | None = None
    sockets: int | None = None
    cores: int | None = None
    threads: int | None = None
    memory_total_bytes: int | None = None
    numa_nodes: list[NumaNode] = field(default_factory=list)
    process_affinity: list[int] | None = None
    os: str | None = None
    sources: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, list[str]] = field(default_factory=dict)

    def numa_node_of_cpu(self, cpu: int) -> int | None:
        """The NUMA node holding ``cpu``, or ``None`` if no node lists it."""
        for node in self.numa_nodes:
            if cpu in node.cpus:
                return node.id
        return None


@dataclass
class GPUInfo:
    """One GPU: identity, compute resources, memory, clocks, PCIe link and placement.

    ``index`` is the CUDA device ordinal (what ``cupy.cuda.Device(i)`` means) when CUDA
    could be asked, else NVML's index. Values are ``None`` when no provider knew them.
    """

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    compute_capability: str | None = None
    sm_count: int | None = None
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_bus_width_bits: int | None = None
    clock_sm_mhz: int | None = None
    clock_sm_max_mhz: int | None = None
    clock_mem_mhz: int | None = None
    clock_mem_max_mhz: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    numa_node: int | None = None
    cpu_affinity: list[int] | None = None
    mig_mode: str | None = None
    nvlink_version: int | None = None
    sources: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, list[str]] = field(default_factory=dict)

    @property
    def pcie_bandwidth_gbps(self) -> float | None:
        """Theoretical PCIe bandwidth per direction at the link's maximum gen and width."""
        return pcie_bandwidth_gbps(self.pcie_gen_max, self.pcie_width_max)

    @property
    def pcie_bandwidth_current_gbps(self) -> float | None:
        """Theoretical PCIe bandwidth at the current gen and width (idle links downshift)."""
        return pcie_bandwidth_gbps(self.pcie_gen, self.pcie_width)

    @property
    def memory_bandwidth_gbps(self) -> float | None:
        """Theoretical device-memory bandwidth in GB/s: bus width x max memory clock x 2."""
        if not self.memory_bus_width_bits or not self.clock_mem_max_mhz:
            return None
        return round(self.memory_bus_width_bits / 8 * self.clock_mem_max_mhz * 2 / 1e3, 1)

    def source(self, name: str) -> str | None:
        """Which provider gave field ``name`` (``None`` if nobody knew it)."""
        return self.sources.get(name)


@dataclass
class LinkInfo:
    """How two GPUs are connected, in the vocabulary of ``nvidia-smi topo -m``."""

    a: int
    b: int
    kind: str | None = None
    nvlinks: int = 0
    p2p: bool | None = None
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def is_nvlink(self) -> bool:
        """Whether the GPUs talk over NVLink."""
        return self.nvlinks > 0


_GPU_FIELDS = [
    f.name for f in dataclasses.fields(GPUInfo) if f.name not in ("sources", "fallbacks")
]


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def _fmt(v: Any) -> str:
    return "?" if v is None else str(v)


@dataclass
class HardwareProfile:
    """A machine's hardware: host, GPUs and links, with where each value came from.

    Build one with :func:`pyc_lab.detect_hardware`; load a saved one with
    :meth:`from_json` or ``detect_hardware(snapshot=...)``.

    ``providers`` holds each provider's status (``"ok"`` or ``"unavailable: <reason>"``);
    where the device gate gave the reason for the whole machine (no driver, no GPU),
    ``provider_details`` keeps each provider's own error text beside it.
    """

    host: HostInfo = field(default_factory=HostInfo)
    gpus: list[GPUInfo] = field(default_factory=list)
    links: list[LinkInfo] = field(default_factory=list)
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    cuda_status: str = "unknown"
    providers: dict[str, str] = field(default_factory=dict)
    provider_details: dict[str, str] = field(default_factory=dict)
    origin: str = "live"
    recorded_at: str | None = None
    pyc_lab_version: str | None = None
    description: str | None = None

    # -- queries --------------------------------------------------------------
    @property
    def has_gpu(self) -> bool:
        """Whether at least one usable CUDA device was found."""
        return bool(self.gpus)

    def gpu(self, index: int) -> GPUInfo:
        """The GPU with CUDA ordinal ``index``."""
        for g in self.gpus:
            if g.index == index:
                return g
        raise PycLabError(
            f"no GPU {index} in this profile; it has {len(self.gpus)} GPU(s)"
            + (f" ({', '.join(str(g.index) for g in self.gpus)})" if self.gpus else "")
        )

    def link(self, a: int, b: int) -> LinkInfo:
        """The link between GPUs ``a`` and ``b`` (``kind == "X"`` when ``a == b``)."""
        if a == b:
            self.gpu(a)
            return LinkInfo(a, a, kind="X", p2p=True)
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        self.gpu(a), self.gpu(b)
        return LinkInfo(min(a, b), max(a, b))

    # -- tables ---------------------------------------------------------------
    def to_frame(self) -> pd.DataFrame:
        """One row per GPU: identity, resources, PCIe link (with theoretical GB/s), NUMA."""
        import pandas as pd

        rows = []
        for g in self.gpus:
            rows.append(
                {
                    "gpu": g.index,
                    "name": g.name,
                    "cc": g.compute_capability,
                    "sms": g.sm_count,
                    "memory_gib": None if g.memory_total_bytes is None
                    else round(g.memory_total_bytes / 2**30, 1),
                    "free_gib": None if g.memory_free_bytes is None
                    else round(g.memory_free_bytes / 2**30, 1),
                    "mem_bw_gbps": g.memory_bandwidth_gbps,
                    "sm_clock_max_mhz": g.clock_sm_max_mhz,
                    "pcie": _pcie_text(g.pcie_gen, g.pcie_width),
                    "pcie_max": _pcie_text(g.pcie_gen_max, g.pcie_width_max),
                    "pcie_gbps": g.pcie_bandwidth_gbps,
                    "numa_node": g.numa_node,
                    "numa_source": g.sources.get("numa_node"),
                    "cpu_affinity": None if g.cpu_affinity is None
                    else format_cpulist(g.cpu_affinity),
                    "mig": g.mig_mode,
                    "pci_bus_id": g.pci_bus_id,
                    "uuid": g.uuid,
                }
            )
        return pd.DataFrame(rows, columns=None if rows else ["gpu", "name"]).set_index("gpu")

    def link_matrix(self) -> pd.DataFrame:
        """The GPU link matrix as ``nvidia-smi topo -m`` shows it, with affinity columns."""
        import pandas as pd

        names = [f"GPU{g.index}" for g in self.gpus]
        data = {}
        for gb in self.gpus:
            data[f"GPU{gb.index}"] = [self.link(ga.index, gb.index).kind or "?" for ga in self.gpus]
        frame = pd.DataFrame(data, index=names)
        frame["CPU Affinity"] = [
            "?" if g.cpu_affinity is None else format_cpulist(g.cpu_affinity) for g in self.gpus
        ]
        frame["NUMA Affinity"] = ["?" if g.numa_node is None else g.numa_node for g in self.gpus]
        return frame

    def numa_frame(self) -> pd.DataFrame:
        """One row per NUMA node: CPUs, memory and the GPUs placed on it."""
        import pandas as pd

        rows = []
        for node in self.host.numa_nodes:
            rows.append(
                {
                    "node": node.id,
                    "cpus": format_cpulist(node.cpus),
                    "n_cpus": len(node.cpus),
                    "memory_gib": None if node.memory_total_bytes is None
                    else round(node.memory_total_bytes / 2**30, 1),
                    "gpus": ",".join(str(g.index) for g in self.gpus if g.numa_node == node.id),
                }
            )
        return pd.DataFrame(rows, columns=None if rows else ["node"]).set_index("node")

    def sources_frame(self) -> pd.DataFrame:
        """Provenance of every value: (scope, field, value, source, why others had none).

        A probed profile without a GPU starts with a ``GPUs`` row saying why (the
        profile's ``cuda_status``), with each GPU provider's own error in ``fallbacks``.
        """
        import pandas as pd

        rows = []
        if not self.gpus and self.providers:
            details = self.provider_details or {
                name: status.removeprefix("unavailable: ")
                for name, status in self.providers.items() if status != "ok"
            }
            rows.append(
                {
                    "scope": "GPUs",
                    "field": "count",
                    "value": "0",
                    "source": self.cuda_status,
                    "fallbacks": "; ".join(f"{k}: {v}" for k, v in details.items()),
                }
            )
        for name in sorted(set(self.host.sources) | set(self.host.fallbacks)):
            rows.append(
                {
                    "scope": "host",
                    "field": name,
                    "value": _short(getattr(self.host, name, None)),
                    "source": self.host.sources.get(name),
                    "fallbacks": "; ".join(self.host.fallbacks.get(name, [])),
                }
            )
        for g in self.gpus:
            for name in _GPU_FIELDS:
                if name == "index":
                    continue
                if name not in g.sources and name not in g.fallbacks:
                    continue
                rows.append(
                    {
                        "scope": f"GPU{g.index}",
                        "field": name,
                        "value": _short(getattr(g, name)),
                        "source": g.sources.get(name),
                        "fallbacks": "; ".join(g.fallbacks.get(name, [])),
                    }
                )
        return pd.DataFrame(rows, columns=["scope", "field", "value", "source", "fallbacks"])

    # -- serialisation --------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The profile as JSON-ready plain data (CPU sets written as cpulists)."""
        d = dataclasses.asdict(self)
        d["schema"] = SCHEMA_VERSION
        for node in d["host"]["numa_nodes"]:
            node["cpus"] = format_cpulist(node["cpus"])
        if d["host"]["process_affinity"] is not None:
            d["host"]["process_affinity"] = format_cpulist(d["host"]["process_affinity"])
        for g in d["gpus"]:
            if g["cpu_affinity"] is not None:
                g["cpu_affinity"] = format_cpulist(g["cpu_affinity"])
        return d

    def to_json(self, path: str | Path | None = None, *, indent: int = 2) -> str:
        """Serialise to JSON; also write it to ``path`` when given. Returns the text.

        The file is written beside ``path`` and renamed into place, so a failed write
        never leaves half a snapshot (or destroys an earlier one).

        Raises
        ------
        PycLabError
            If the folder of ``path`` does not exist or cannot be written.
        """
        text = json.dumps(self.to_dict(), indent=indent, sort_keys=False) + "\n"
        if path is not None:
            with replacing(path, "save the hardware profile") as out:
                out.write_text(text, encoding="utf-8")
        return text

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "") -> HardwareProfile:
        """Rebuild a profile from :meth:`to_dict` output, checking every field's type.

        Fields this version does not know (written by a newer pyc_lab) are ignored, with
        a log record naming them; a missing field takes its default.

        Parameters
        ----------
        data
            The parsed JSON.
        where
            Where the data came from (a file name), for error messages.

        Raises
        ------
        SnapshotError
            If the data is not a pyc_lab hardware profile, has a newer schema or a field
            of the wrong type (the message names the field and the type expected).
        """
        if not isinstance(data, dict) or "host" not in data or "gpus" not in data:
            raise SnapshotError(
                "not a pyc_lab hardware profile: expected a JSON object with 'host' and "
                "'gpus' (make one with pyc_lab.detect_hardware().to_json(path) or "
                "`pyc-lab hw --save PATH`)"
            )
        schema = data.get("schema", 1)
        if isinstance(schema, bool) or not isinstance(schema, int) or schema > SCHEMA_VERSION:
            raise SnapshotError(
                f"hardware profile schema {schema!r} is newer than this pyc_lab understands "
                f"({SCHEMA_VERSION}); upgrade pyc_lab to read it"
            )
        try:
            return _build(cls, {k: v for k, v in data.items() if k != "schema"}, "")
        except _FieldError as exc:
            name, problem = exc.args
            in_file = f" ({where})" if where else ""
            raise SnapshotError(
                f"hardware profile is malformed{in_file}: {name} {problem}; fix the field "
                "or re-record it with `pyc-lab hw --save PATH`"
            ) from None

    @classmethod
    def from_json(cls, source: str | Path | dict[str, Any]) -> HardwareProfile:
        """Load a profile from a JSON file path, a JSON string or an already parsed dict.

        Raises
        ------
        SnapshotError
            If the file is missing, unreadable, not UTF-8 text, not JSON or not a valid
            hardware profile.
        """
        if isinstance(source, dict):
            return cls.from_dict(source)
        text: str
        if isinstance(source, Path) or (
            isinstance(source, str) and not source.lstrip().startswith(("{", "["))
        ):
            path = Path(source)
            if not path.is_file():
                raise SnapshotError(
                    f"hardware snapshot {str(path)!r} does not exist; pass a JSON file written "
                    "by HardwareProfile.to_json() or a shipped name from "
                    "pyc_lab.hardware.list_snapshots()"
                )
            text = _read_snapshot(path)
            where = str(path)
        else:
            text = str(source)
            where = "the given string"
        try:
            data = json.loads(text)
        except RecursionError:
            raise SnapshotError(f"hardware snapshot {where} is not a hardware profile: its "
                                "JSON is nested too deeply") from None
        except json.JSONDecodeError as exc:
            raise SnapshotError(f"hardware snapshot {where} is not valid JSON: {exc}") from None
        return cls.from_dict(data, where=where if where != "the given string" else "")

    # -- display --------------------------------------------------------------
    def summary_lines(self) -> list[str]:
        """Short human-readable lines: host, then each GPU, then the CUDA status."""
        h = self.host
        lines = [
            f"Host: {_fmt(h.cpu_model)} | {_fmt(h.sockets)} socket(s), {_fmt(h.cores)} cores, "
            f"{_fmt(h.threads)} threads | {_gib(h.memory_total_bytes)} RAM | "
            f"{len(h.numa_nodes)} NUMA node(s)"
        ]
        for node in h.numa_nodes:
            gpus = [str(g.index) for g in self.gpus if g.numa_node == node.id]
            lines.append(
                f"  NUMA {node.id}: CPUs {format_cpulist(node.cpus) or '-'}, "
                f"{_gib(node.memory_total_bytes)}, GPUs {','.join(gpus) or '-'}"
            )
        if self.gpus:
            lines.append(
                f"Driver {_fmt(self.driver_version)}, CUDA {_fmt(self.cuda_driver_version)}"
            )
        for g in self.gpus:
            lines.append(
                f"GPU{g.index}: {_fmt(g.name)} (cc {_fmt(g.compute_capability)}, "
                f"{_fmt(g.sm_count)} SMs, {_gib(g.memory_total_bytes)}) | PCIe "
                f"{_pcie_text(g.pcie_gen_max, g.pcie_width_max)} = "
                f"{_fmt(g.pcie_bandwidth_gbps)} GB/s | NUMA {_fmt(g.numa_node)}"
                f" (from {_fmt(g.sources.get('numa_node'))})"
            )
        if not self.gpus:
            lines.append(self.cuda_status)
        return lines

    def to_text(self) -> str:
        """A deterministic multi-line text view: summary plus the link matrix."""
        lines = [f"HardwareProfile ({self.origin})", *self.summary_lines()]
        if len(self.gpus) > 1:
            lines.append("")
            lines.append(self.link_matrix().to_string())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.to_text()

    def _repr_html_(self) -> str:
        parts = [f"<div class='pyc-lab-hw'><b>HardwareProfile</b> ({html.escape(self.origin)})"]
        parts.append("<ul>" + "".join(
            f"<li>{html.escape(line.strip())}</li>" for line in self.summary_lines()
        ) + "</ul>")
        if self.gpus:
            parts.append(self.to_frame().to_html())
        if len(self.gpus) > 1:
            parts.append(self.link_matrix().to_html())
        parts.append("</div>")
        return "".join(parts)


def _pcie_text(gen: int | None, width: int | None) -> str | None:
    if gen is None and width is None:
        return None
    return f"Gen{_fmt(gen)} x{_fmt(width)}"


def _short(v: Any) -> str:
    if isinstance(v, list):
        if v and all(isinstance(x, int) for x in v):
            return format_cpulist(v)
        return f"[{len(v)} item(s)]"
    return _fmt(v)


# -- loading and checking snapshots -------------------------------------------------------

class _FieldError(Exception):
    """A snapshot field is wrong: ``(dotted name, what is wrong)``."""


#: Fields held as CPU id lists in memory and as cpulist text ("0-3,8") in files.
_CPULIST_FIELDS = {"cpus", "process_affinity", "cpu_affinity"}


def _read_snapshot(path: Path) -> str:
    """The text of a snapshot file, with every way of failing as a :class:`SnapshotError`."""
    try:
        size = path.stat().st_size
        if size > MAX_SNAPSHOT_BYTES:
            raise SnapshotError(f"hardware snapshot {path} is {size} bytes, more than the "
                                f"{MAX_SNAPSHOT_BYTES} a profile can take; is it a snapshot?")
        raw = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"hardware snapshot {path} cannot be read ({exc.strerror or exc})"
                            ) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SnapshotError(
            f"hardware snapshot {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
            f"offset {exc.start}); snapshots are JSON files written by "
            "HardwareProfile.to_json() or `pyc-lab hw --save PATH`") from None



def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return {int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


_NAMES = {int: ("an integer", "integers"), str: ("a string", "strings"),
          bool: ("true or false", "true/false values"), float: ("a number", "numbers"),
          type(None): ("null", "nulls")}


def _expected(tp: Any, plural: bool = False) -> str:
    """``tp`` in the words of JSON: ``int | None`` is "an integer or null"."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected(a, plural) for a in args)
    if origin is list:
        return ("lists of " if plural else "a list of ") + _expected(args[0], True)
    if origin is dict:
        return ("objects of " if plural else "an object of ") + _expected(args[1], True)
    if tp in _NAMES:
        return _NAMES[tp][plural]
    return getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if tp is type(None):
        return value is None
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, list) and all(_matches(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items())
    return isinstance(value, tp)


def _cpulist(value: Any, optional: bool, name: str) -> list[int] | None:
    """A cpulist field: text such as ``"0-3,8"`` (or null where allowed) to CPU ids."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _FieldError(name, f"must be a CPU list string such as '0-3,8'"
                                f"{' or null' if optional else ''}, got {_short_value(value)} "
                                f"({_json_type(value)})")
    ids = [int(d) for d in re.findall(r"[0-9]+", value)] if len(value) < 65536 else [-1]
    if any(not 0 <= i < _MAX_CPU_ID for i in ids):
        raise _FieldError(name, f"names CPU ids beyond {_MAX_CPU_ID - 1} (or is too long)")
    try:
        return parse_cpulist(value)
    except PycLabError as exc:
        raise _FieldError(name, f"is not a CPU list: {exc}") from None


def _short_value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type, data: Any, where: str) -> Any:
    """An instance of dataclass ``cls`` from JSON data, every field's type checked
    against its annotation; nested profiles (host, GPUs, links, NUMA nodes) recurse."""
    label = where or "the profile"
    if not isinstance(data, dict):
        raise _FieldError(label, f"must be an object, got {_short_value(data)} "
                                 f"({_json_type(data)})")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        log.info("hardware snapshot: ignoring fields %s of %s (written by a newer pyc_lab?)",
                 unknown, label)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        dotted = f"{where}.{name}" if where else name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _FieldError(dotted, f"is missing ({_expected(hints[name])} expected)")
            continue
        value, tp = data[name], hints[name]
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else None
        if name in _CPULIST_FIELDS:
            kwargs[name] = _cpulist(value, _matches(None, tp), dotted)
        elif dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value, dotted)
        elif item is not None and dataclasses.is_dataclass(item):
            if not isinstance(value, list):
                raise _FieldError(dotted, f"must be a list of objects, got "
                                          f"{_short_value(value)} ({_json_type(value)})")
            kwargs[name] = [_build(item, v, f"{dotted}[{i}]") for i, v in enumerate(value)]
        elif _matches(value, tp):
            kwargs[name] = value
        else:
            raise _FieldError(dotted, f"must be {_expected(tp)}, got {_short_value(value)} "
                                      f"({_json_type(value)})")
    return cls(**kwargs)
