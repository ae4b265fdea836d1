"""CUDA C++ sources compiled with NVRTC into cubins kept on disk, loaded as CuPy modules.

Every runtime-compiled kernel of the package (the compiler's generated kernels and the
hand-written ones under ``native/``: the skinny GEMM, the padding copies, the convolution
helpers) is compiled here, through CuPy's NVRTC wrapper, for the current device:

* **subnormals kept** — ``-ftz=false`` is always among the options. ``cupy.RawModule
  (code=...)`` appends ``-ftz=true`` after a caller's options, which flushes float32 (and
  bfloat16) subnormal operands and results to zero; NumPy keeps them.
* **compiled once per machine** — the binary is stored under ``cache_dir("nvrtc")`` by
  the SHA-256 of the source, the options and the template instantiations asked for,
  with the device's compute capability and NVRTC's version in the file name; a new
  process loads it (``cupy.RawModule(path=...)``) without compiling. The mangled names of
  template instantiations are stored beside it. Writes are atomic; when the cache folder
  cannot be written the files go to a folder of this process's own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import PycLabError
from ..paths import cache_dir, replacing

__all__ = ["NvrtcError", "NvrtcModule", "compile_module", "nvrtc_digest"]

log = logging.getLogger(__name__)

_COMPILE_LOCK = threading.Lock()


class NvrtcError(PycLabError):
    """NVRTC rejected a source, or a kernel asked for is not in it."""


def nvrtc_digest(source: str, options: Sequence[str], names: Sequence[str] = ()) -> str:
    """SHA-256 of a source, its NVRTC options and its template instantiations."""
    text = source + "\0" + " ".join(options) + "\0" + "\n".join(names)
    return hashlib.sha256(text.encode()).hexdigest()


class NvrtcModule:
    """A loaded module and the mangled names of its template instantiations.

    Parameters
    ----------
    module
        The ``cupy.RawModule`` loaded from the cubin.
    mangled
        Name expression (``"pyc_pad_lines<2>"``) -> the symbol NVRTC gave it.
    label
        What the source is, for error messages.
    """

    def __init__(self, module: Any, mangled: dict[str, str], label: str) -> None:
        self.module = module
        self.mangled = mangled
        self.label = label

    def get_function(self, name: str) -> Any:
        """The kernel ``name`` (a plain ``extern "C"`` name or a name expression)."""
        try:
            return self.module.get_function(self.mangled.get(name, name))
        except Exception as exc:
            raise NvrtcError(f"{self.label}: could not load kernel {name!r}: {exc}") from exc


def compile_module(source: str, options: Sequence[str] = ("-std=c++17",),
                   name_expressions: Sequence[str] = (), label: str = "kernel") -> NvrtcModule:
    """``source`` compiled for the current device (or loaded from the disk cache).

    Parameters
    ----------
    source
        The CUDA C++ source.
    options
        NVRTC options; ``-ftz=false`` is added unless ``-ftz`` is given.
    name_expressions
        Template instantiations to compile (``"pyc_skinny<__half, 8>"``), looked up by
        :meth:`NvrtcModule.get_function` under the same text.
    label
        What the source is, for error messages and logs.

    Raises
    ------
    NvrtcError
        When NVRTC rejects the source (its log is in the message).
    """
    import cupy

    opts = tuple(options)
    if not any(o.startswith("-ftz") or o.startswith("--ftz") for o in opts):
        opts += ("-ftz=false",)
    names = tuple(name_expressions)
    digest = nvrtc_digest(source, opts, names)
    with _COMPILE_LOCK:  # one compile and one cache write of a source at a time
        path, mangled = _stored(cupy, source, opts, names, digest, label)
    module = cupy.RawModule(path=str(path))
    log.debug("loaded %s (%s...)", label, digest[:12])
    return NvrtcModule(module, mangled, label)


def _stored(cupy: Any, source: str, options: tuple[str, ...], names: tuple[str, ...],
            digest: str, label: str) -> tuple[Path, dict[str, str]]:
    """The cubin file (PTX where NVRTC does not know the device's architecture) and
    the mangled names: from the disk cache, else compiled now and stored there."""
    arch = str(cupy.cuda.Device().compute_capability)
    major, minor = cupy.cuda.nvrtc.getVersion()
    name = f"{digest}-sm{arch}-nvrtc{major}.{minor}.bin"
    try:
        folder = cache_dir("nvrtc")
    except OSError as exc:
        log.info("the kernel cache folder cannot be made (%s); compiling for this "
                 "process only", exc)
        folder = _scratch()
    path = folder / name
    names_file = path.with_suffix(".names.json")
    if path.is_file() and (not names or names_file.is_file()):
        try:
            mangled = json.loads(names_file.read_text()) if names else {}
            if all(n in mangled for n in names):
                return path, mangled
        except (OSError, ValueError):
            pass  # a damaged names file: compile again
    from cupy.cuda import compiler

    try:
        if names:
            binary, mangled = compiler.compile_using_nvrtc(
                source, options, arch, name_expressions=list(names))
        else:
            binary, _ = compiler.compile_using_nvrtc(source, options, arch)
    except Exception as exc:
        raise NvrtcError(f"{label}: NVRTC failed: {exc}"[:4000]) from exc
    mangled = {str(k): str(v) for k, v in (mangled or {}).items()} if names else {}
    try:
        if names:
            with replacing(names_file, "store kernel names") as tmp:
                tmp.write_text(json.dumps(mangled))
        with replacing(path, "store a compiled kernel") as tmp:
            tmp.write_bytes(binary)
    except (OSError, PycLabError) as exc:
        log.info("cannot store the compiled kernel in %s (%s); keeping it for this "
                 "process only", folder, exc)
        path = _scratch() / name
        path.write_bytes(binary)
    return path, mangled


@cache
def _scratch() -> Path:
    """A folder of this process's own for binaries the cache folder could not take (a
    module loads from its file)."""
    return Path(tempfile.mkdtemp(prefix=f"pyc-nvrtc-{os.getpid()}-"))
