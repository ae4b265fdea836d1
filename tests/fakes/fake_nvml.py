"""Stand-ins for ``pynvml``, ``cuda.core`` and ``cuda.bindings.driver``, built on dicts.

:class:`FakeNVML` exposes exactly the NVML functions and constants that
``pyc_lab.hardware.providers.nvml`` calls. A GPU is a dict (see :func:`nvml_gpu`); its
handle *is* that dict. Any value in it may be an exception instance (or class), which
the matching query raises, so a test can make one query of one GPU fail
(``numa=NVMLError_NotSupported()``) the way a real driver does.

:class:`FakeCudaCore` and :class:`FakeDriver` do the same for the CUDA provider.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

__all__ = [
    "FakeCudaCore",
    "FakeCudaDevice",
    "FakeDriver",
    "FakeNVML",
    "NVMLError",
    "NVMLError_InvalidArgument",
    "NVMLError_LibraryNotFound",
    "NVMLError_NoPermission",
    "NVMLError_NotSupported",
    "NVMLError_Unknown",
    "nvlinks_to",
    "nvml_gpu",
    "switch_links",
]


# -- NVML errors (same names and texts as pynvml's) ---------------------------------
class NVMLError(Exception):
    """Base of the fake NVML errors; the message defaults to pynvml's text."""

    text = "Unknown Error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.text)


class NVMLError_NotSupported(NVMLError):
    text = "Not Supported"


class NVMLError_LibraryNotFound(NVMLError):
    text = "NVML Shared Library Not Found"


class NVMLError_NoPermission(NVMLError):
    text = "Insufficient Permissions"


class NVMLError_InvalidArgument(NVMLError):
    text = "Invalid Argument"


class NVMLError_Unknown(NVMLError):
    text = "Unknown Error"


def _v(value: Any) -> Any:
    """Return ``value``, or raise it when it is an exception (instance or class)."""
    if isinstance(value, BaseException):
        raise value
    if isinstance(value, type) and issubclass(value, BaseException):
        raise value()
    return value


@dataclass
class PciInfo:
    """What ``nvmlDeviceGetPciInfo`` returns (only the field pyc_lab reads)."""

    busId: bytes


@dataclass
class MemoryInfo:
    """What ``nvmlDeviceGetMemoryInfo`` returns."""

    total: int
    free: int
    used: int


def nvml_gpu(bus_id: str | bytes = b"00000000:18:00.0", **overrides: Any) -> dict[str, Any]:
    """One fake NVML GPU (an H200 by default); ``overrides`` replace any key.

    Keys: ``bus_id``, ``name``, ``uuid``, ``cc`` (major, minor), ``memory_total``,
    ``memory_free``, ``bus_width``, ``clock_sm``, ``clock_sm_max``, ``clock_mem``,
    ``clock_mem_max``, ``pcie_gen``, ``pcie_gen_max``, ``pcie_width``,
    ``pcie_width_max``, ``numa``, ``cpu_affinity`` (64-bit words), ``mig`` (current,
    pending) and ``nvlinks`` (a list of link dicts, see :func:`nvlinks_to`).
    """
    gpu: dict[str, Any] = {
        "bus_id": bus_id,
        "name": b"NVIDIA H200",
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "cc": (9, 0),
        "memory_total": 150_754_820_096,
        "memory_free": 150_000_000_000,
        "bus_width": 6144,
        "clock_sm": 345,
        "clock_sm_max": 1980,
        "clock_mem": 2619,
        "clock_mem_max": 3201,
        "pcie_gen": 1,
        "pcie_gen_max": 5,
        "pcie_width": 16,
        "pcie_width_max": 16,
        "numa": 0,
        "cpu_affinity": [0xFF],
        "mig": (0, 0),
        "nvlinks": [],
    }
    unknown = set(overrides) - set(gpu)
    if unknown:
        raise KeyError(f"unknown fake GPU keys {sorted(unknown)}")
    gpu.update(overrides)
    return gpu


def nvlinks_to(remote_bus_id: str | bytes, n: int, *, version: int = 6,
               state: int = 1) -> list[dict[str, Any]]:
    """``n`` NVLinks from a GPU straight to the GPU at ``remote_bus_id``.

    ``version`` is the raw ``nvmlNvlinkVersion_t`` value (6 is NVLink 4.0).
    """
    remote = remote_bus_id.encode() if isinstance(remote_bus_id, str) else remote_bus_id
    return [{"state": state, "type": 0, "remote": remote, "version": version}
            for _ in range(n)]


def switch_links(n: int, *, version: int = 6, state: int = 1) -> list[dict[str, Any]]:
    """``n`` NVLinks from a GPU into NVSwitches."""
    return [{"state": state, "type": 2, "remote": b"00000000:00:00.0", "version": version}
            for _ in range(n)]


class FakeNVML:
    """A module-like NVML stand-in over a list of GPU dicts.

    Parameters
    ----------
    gpus
        GPU dicts (see :func:`nvml_gpu`), in NVML index order.
    links
        Per GPU pair (NVML indices, either order): ``{"ancestor": level, "p2p": status}``.
        A pair not given is ``NVML_TOPOLOGY_SYSTEM`` with P2P OK.
    init_error
        Raised by ``nvmlInit`` (e.g. ``NVMLError_LibraryNotFound()``).
    count_error, handle_errors, driver_version, cuda_version
        Failures of ``nvmlDeviceGetCount`` / ``nvmlDeviceGetHandleByIndex(i)`` and the
        system answers (each may be an exception).
    """

    # errors, as pynvml exposes them
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_Unknown = NVMLError_Unknown

    # constants, with pynvml's values (except P2P_CAPS_INDEX_READ, see below)
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_NVLINK_DEVICE_TYPE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_IBMNPU = 1
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    #: pynvml itself defines this as ``0,`` (a tuple); tests that want to reproduce that
    #: set the attribute on an instance.
    NVML_P2P_CAPS_INDEX_READ = 0
    NVML_P2P_STATUS_OK = 0
    NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED = 1
    NVML_P2P_STATUS_NOT_SUPPORTED = 5
    NVML_TOPOLOGY_INTERNAL = 0
    NVML_TOPOLOGY_SINGLE = 10
    NVML_TOPOLOGY_MULTIPLE = 20
    NVML_TOPOLOGY_HOSTBRIDGE = 30
    NVML_TOPOLOGY_NODE = 40
    NVML_TOPOLOGY_SYSTEM = 50

    def __init__(
        self,
        gpus: Sequence[dict[str, Any]] = (),
        links: dict[tuple[int, int], dict[str, Any]] | None = None,
        *,
        init_error: BaseException | None = None,
        count_error: BaseException | None = None,
        handle_errors: dict[int, BaseException] | None = None,
        driver_version: Any = "570.124.06",
        cuda_version: Any = 12080,
    ) -> None:
        self.gpus = [dict(g, index=i) for i, g in enumerate(gpus)]
        self.links = {frozenset(k): v for k, v in (links or {}).items()}
        self.init_error = init_error
        self.count_error = count_error
        self.handle_errors = dict(handle_errors or {})
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.initialised = False

    # -- bookkeeping ----------------------------------------------------------
    def _call(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def called(self, name: str) -> list[tuple[Any, ...]]:
        """The argument tuples of every call to ``name``."""
        return [args for n, args in self.calls if n == name]

    def _need_init(self) -> None:
        if not self.initialised:
            raise NVMLError("Uninitialized")

    def _gpu(self, handle: dict[str, Any], key: str) -> Any:
        self._need_init()
        return _v(handle[key])

    # -- library --------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        _v(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self._need_init()
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._need_init()
        return _v(self.driver_version)

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._need_init()
        return _v(self.cuda_version)

    def nvmlDeviceGetCount(self) -> int:
        self._need_init()
        _v(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        self._call("nvmlDeviceGetHandleByIndex", index)
        self._need_init()
        _v(self.handle_errors.get(index))
        if not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        return self.gpus[index]

    # -- per device -----------------------------------------------------------
    def nvmlDeviceGetPciInfo(self, h: dict[str, Any]) -> PciInfo:
        bus = self._gpu(h, "bus_id")
        return PciInfo(busId=bus.encode() if isinstance(bus, str) else bus)

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> Any:
        return self._gpu(h, "name")

    def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> Any:
        return self._gpu(h, "uuid")

    def nvmlDeviceGetCudaComputeCapability(self, h: dict[str, Any]) -> tuple[int, int]:
        return tuple(self._gpu(h, "cc"))

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> MemoryInfo:
        total, free = self._gpu(h, "memory_total"), self._gpu(h, "memory_free")
        return MemoryInfo(total=total, free=free, used=total - free)

    def nvmlDeviceGetMemoryBusWidth(self, h: dict[str, Any]) -> int:
        return self._gpu(h, "bus_width")

    def _clock(self, h: dict[str, Any], clock: Any, suffix: str) -> int:
        if clock == self.NVML_CLOCK_SM:
            return self._gpu(h, "clock_sm" + suffix)
        if clock == self.NVML_CLOCK_MEM:
            return self._gpu(h, "clock_mem" + suffix)
        raise NVMLError_InvalidArgument()

    def nvmlDeviceGetClockInfo(self, h: dict[str, Any], clock: Any) -> int:
        return self._clock(h, clock, "")

    def nvmlDeviceGetMaxClockInfo(self, h: dict[str, Any], clock: Any) -> int:
        return self._clock(h, clock, "_max")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: dict[str, Any]) -> int:
        return self._gpu(h, "pcie_gen")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: dict[str, Any]) -> int:
        return self._gpu(h, "pcie_gen_max")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: dict[str, Any]) -> int:
        return self._gpu(h, "pcie_width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: dict[str, Any]) -> int:
        return self._gpu(h, "pcie_width_max")

    def nvmlDeviceGetNumaNodeId(self, h: dict[str, Any]) -> int:
        return self._gpu(h, "numa")

    def nvmlDeviceGetCpuAffinity(self, h: dict[str, Any], n_words: int) -> list[int]:
        self._call("nvmlDeviceGetCpuAffinity", h["index"], n_words)
        words = list(self._gpu(h, "cpu_affinity"))
        # NVML fills exactly n_words words: the rest of the mask is cut off, short ones pad.
        return (words + [0] * n_words)[:n_words]

    def nvmlDeviceGetMigMode(self, h: dict[str, Any]) -> list[int]:
        return list(self._gpu(h, "mig"))

    # -- NVLink ---------------------------------------------------------------
    def _link(self, h: dict[str, Any], link: int, key: str) -> Any:
        links = self._gpu(h, "nvlinks")
        if not 0 <= link < len(links):
            raise NVMLError_NotSupported()
        return _v(links[link][key])

    def nvmlDeviceGetNvLinkState(self, h: dict[str, Any], link: int) -> int:
        return self._link(h, link, "state")

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: dict[str, Any], link: int) -> int:
        return self._link(h, link, "type")

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, h: dict[str, Any], link: int) -> PciInfo:
        return PciInfo(busId=self._link(h, link, "remote"))

    def nvmlDeviceGetNvLinkVersion(self, h: dict[str, Any], link: int) -> int:
        return self._link(h, link, "version")

    # -- pairs ----------------------------------------------------------------
    def _pair(self, a: dict[str, Any], b: dict[str, Any], key: str) -> Any:
        self._need_init()
        spec = self.links.get(frozenset((a["index"], b["index"])), {})
        default = {"ancestor": self.NVML_TOPOLOGY_SYSTEM, "p2p": self.NVML_P2P_STATUS_OK}
        return _v(spec.get(key, default[key]))

    def nvmlDeviceGetTopologyCommonAncestor(self, a: dict[str, Any], b: dict[str, Any]) -> int:
        return self._pair(a, b, "ancestor")

    def nvmlDeviceGetP2PStatus(self, a: dict[str, Any], b: dict[str, Any],
                               index: Any) -> int:
        self._call("nvmlDeviceGetP2PStatus", a["index"], b["index"], index)
        if not isinstance(index, int):
            # What ctypes does when pynvml passes a non-integer to the C function.
            raise ctypes.ArgumentError(
                "argument 3: TypeError: Don't know how to convert parameter 3"
            )
        if index != 0:
            raise NVMLError_InvalidArgument()
        return self._pair(a, b, "p2p")


# -- cuda.core / cuda.bindings.driver --------------------------------------------------
class _Attrs:
    """Attribute bag whose values may be exceptions, raised when read."""

    def __init__(self, **values: Any) -> None:
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
        try:
            value = object.__getattribute__(self, "_values")[name]
        except KeyError:
            raise AttributeError(name) from None
        return _v(value)


class FakeCudaDevice(_Attrs):
    """A ``cuda.core.Device`` stand-in. Any attribute value may be an exception.

    ``properties`` holds ``multiprocessor_count``, ``global_memory_bus_width``,
    ``clock_rate`` and ``memory_clock_rate`` (kHz, as CUDA reports them) and
    ``host_numa_id``; ``peers`` lists the device ids ``can_access_peer`` says yes to.
    """

    def __init__(
        self,
        device_id: int,
        pci_bus_id: Any = "0000:18:00.0",
        *,
        name: Any = "NVIDIA H200",
        uuid: Any = "00000000-0000-0000-0000-000000000000",
        compute_capability: Any = (9, 0),
        multiprocessor_count: Any = 132,
        global_memory_bus_width: Any = 6144,
        clock_rate: Any = 1_980_000,
        memory_clock_rate: Any = 3_201_000,
        host_numa_id: Any = 0,
        peers: Iterable[int] | BaseException = (),
    ) -> None:
        super().__init__(
            device_id=device_id,
            pci_bus_id=pci_bus_id,
            name=name,
            uuid=uuid,
            compute_capability=compute_capability,
            properties=_Attrs(
                multiprocessor_count=multiprocessor_count,
                global_memory_bus_width=global_memory_bus_width,
                clock_rate=clock_rate,
                memory_clock_rate=memory_clock_rate,
                host_numa_id=host_numa_id,
            ),
            peers=peers if isinstance(peers, BaseException) else frozenset(peers),
        )

    def can_access_peer(self, other: FakeCudaDevice) -> bool:
        return other.device_id in self.peers


class FakeCudaCore:
    """A ``cuda.core`` stand-in: ``FakeCudaCore(devices).Device.get_all_devices()``."""

    def __init__(self, devices: Sequence[FakeCudaDevice] = (), *,
                 error: BaseException | None = None) -> None:
        self.devices = list(devices)
        self.error = error

        def get_all_devices() -> tuple[FakeCudaDevice, ...]:
            _v(self.error)
            return tuple(self.devices)

        self.Device = SimpleNamespace(get_all_devices=get_all_devices)


class FakeDriver:
    """A ``cuda.bindings.driver`` stand-in: calls return ``(CUresult, value)`` tuples.

    ``errors`` maps a function name to the non-zero CUresult it returns.
    """

    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_DEVICE = 101

    def __init__(self, total_mem: dict[int, int] | None = None, *, version: int = 12080,
                 errors: dict[str, int] | None = None) -> None:
        self.total_mem = dict(total_mem or {})
        self.version = version
        self.errors = dict(errors or {})

    def _err(self, name: str) -> int:
        return self.errors.get(name, 0)

    def cuDriverGetVersion(self) -> tuple[int, int | None]:
        err = self._err("cuDriverGetVersion")
        return (err, None if err else self.version)

    def cuDeviceGet(self, ordinal: int) -> tuple[int, Any]:
        err = self._err("cuDeviceGet")
        if not err and ordinal not in self.total_mem:
            err = self.CUDA_ERROR_INVALID_DEVICE
        return (err, None if err else ("CUdevice", ordinal))

    def cuDeviceTotalMem(self, handle: Any) -> tuple[int, int | None]:
        err = self._err("cuDeviceTotalMem")
        return (err, None if err else self.total_mem[handle[1]])
