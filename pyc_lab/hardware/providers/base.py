"""What every topology provider returns: facts with their source, or why they are missing."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Fact", "Missing", "ProviderReport", "guarded", "normalize_bus_id"]


@dataclass(frozen=True)
class Fact:
    """A value and the provider (library or file) it came from."""

    value: Any
    source: str


@dataclass(frozen=True)
class Missing:
    """A value a provider was asked for and could not give, with the reason."""

    reason: str
    source: str


@dataclass
class ProviderReport:
    """Everything one provider found.

    ``gpus`` is a list of field dicts, one per GPU, each holding ``pci_bus_id`` (the key
    that matches a GPU across providers) and the provider's own ``index``. ``links`` is
    keyed by a pair of normalised PCI bus ids.

    ``reason`` says why an unavailable provider could not run, in the words a user sees;
    where the device gate (:mod:`pyc_lab.hardware.device`) has a reason for the whole
    machine, that is the reason, and the provider's own error text moves to ``detail``.
    """

    name: str
    available: bool = True
    reason: str = ""
    detail: str = ""
    gpus: list[dict[str, Fact | Missing]] = field(default_factory=list)
    links: dict[tuple[str, str], dict[str, Fact | Missing]] = field(default_factory=dict)
    host: dict[str, Fact | Missing] = field(default_factory=dict)
    system: dict[str, Fact | Missing] = field(default_factory=dict)

    @classmethod
    def unavailable(cls, name: str, reason: str) -> ProviderReport:
        """A report for a provider that could not run at all."""
        return cls(name=name, available=False, reason=reason)

    @property
    def status(self) -> str:
        """``"ok"`` or ``"unavailable: <reason>"``."""
        return "ok" if self.available else f"unavailable: {self.reason}"


_BUS_RE = re.compile(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def normalize_bus_id(bus_id: str | bytes | None) -> str | None:
    """Normalise a PCI bus id to ``dddd:bb:dd.f`` in lower case.

    NVML writes ``00000000:18:00.0`` and CUDA ``0000:18:00.0``; both become
    ``0000:18:00.0``. Returns ``None`` for anything that is not a bus id.
    """
    if bus_id is None:
        return None
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode(errors="replace")
    m = _BUS_RE.match(bus_id.strip().rstrip("\x00"))
    if not m:
        return None
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


def guarded(target: dict, name: str, source: str, getter: Callable[[], Any]) -> None:
    """Store ``getter()`` as a Fact under ``name``, or a Missing with the error's text.

    A provider asks many independent questions; one that fails (NotSupported, a
    missing attribute in an older library) must not lose the others.
    """
    try:
        value = getter()
    except Exception as exc:  # each query is independent; record why it failed
        target[name] = Missing(_reason(exc), source)
        return
    if isinstance(value, Missing):
        target[name] = value
    elif value is None:
        target[name] = Missing("no value", source)
    else:
        target[name] = Fact(value, source)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    name = type(exc).__name__
    return text if name in text else f"{name}: {text}"
