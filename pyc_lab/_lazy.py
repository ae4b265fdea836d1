"""Lazy package faces: names resolved to their defining module on first use.

A face lists what its package offers without importing it, so that ``import pyc_lab``
(and ``import pyc_lab.kernels``) stays cheap and no layer is loaded before something
asks for it (PEP 562 module ``__getattr__``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_face"]


def lazy_face(package: str, exports: Mapping[str, str],
              namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for a package face.

    Parameters
    ----------
    package
        The package's ``__name__``.
    exports
        Public name -> ``"relative.module"`` (the attribute of that name) or
        ``"relative.module:attr"`` (another attribute name).
    namespace
        The package's ``globals()``; a resolved name is cached there.

    Returns
    -------
    getattr, dir
        Assign them to the package's ``__getattr__`` and ``__dir__``. An unknown name that
        is a submodule of the package is imported (``pl.kernels.matmul``).
    """

    def __getattr__(name: str) -> Any:
        target = exports.get(name)
        if target is None:
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        else:
            module, _, attr = target.partition(":")
            value = getattr(importlib.import_module(f"{package}.{module}"), attr or name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
