"""Make NVIDIA's ``cutlass_cppgen`` (nvidia-cutlass 4.x) usable, and keep it contained.

Two problems:

1. ``cutlass_cppgen`` imports ``cuda.cuda``, ``cuda.cudart`` and ``cuda.nvrtc`` and reads
   ``cuda.__version__``, all removed in cuda-bindings 13. :func:`install_cuda_aliases`
   points those names at ``cuda.bindings.driver`` / ``.runtime`` / ``.nvrtc``.
2. It writes into the current directory: ``compiled_cache.db`` when imported, temporary
   host libraries (it sets ``tempfile.tempdir = "./"``) and
   ``cutlass_python_compilation_*_error.txt`` when compiling. :func:`import_cutlass`
   imports it from pyc_lab's own work directory in the user cache and points its cache
   file there; :func:`contained` runs compilation with that directory as the current
   one and restores the caller's directory and ``tempfile.tempdir`` afterwards.

The current directory is process-wide: :func:`contained` holds a lock so that pyc_lab's
own builds (parallel threads inside one ``contained()`` block) never race each other,
but other code changing directory at the same time is not guarded against.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from ...errors import DeviceUnavailableError
from ...paths import cache_dir

__all__ = ["compile_errors", "contained", "import_cutlass", "install_cuda_aliases",
           "prepare_offline", "workdir"]

log = logging.getLogger(__name__)

_LOCK = threading.RLock()
_ERROR_FILES = ("cutlass_python_compilation_device_error.txt",
                "cutlass_python_compilation_host_error.txt")


def workdir() -> Path:
    """pyc_lab's private directory for cutlass_cppgen's files (created on demand)."""
    return cache_dir("cutlass")


def install_cuda_aliases() -> list[str]:
    """Alias the cuda-python 12 module names cutlass_cppgen imports to cuda-bindings 13.

    Idempotent; names that already exist are left alone.

    Returns
    -------
    list of str
        The names that were added (empty when nothing was needed).

    Raises
    ------
    DeviceUnavailableError
        If cuda-bindings is not installed.
    """
    try:
        import cuda
        import cuda.bindings
        from cuda.bindings import driver, nvrtc, runtime
    except ImportError as exc:
        raise DeviceUnavailableError(
            f"CUTLASS kernels need cuda-bindings ({exc}); pip install 'pyc-lab[gpu]'"
        ) from None
    added = []
    for name, module in (("cuda", driver), ("cudart", runtime), ("nvrtc", nvrtc)):
        full = f"cuda.{name}"
        if full not in sys.modules:
            sys.modules[full] = module
            added.append(full)
        if not hasattr(cuda, name):
            setattr(cuda, name, module)
    if not hasattr(cuda, "__version__"):
        cuda.__version__ = cuda.bindings.__version__
        added.append("cuda.__version__")
    if added:
        log.debug("aliased %s for cutlass_cppgen", ", ".join(added))
    return added


@contextlib.contextmanager
def contained() -> Iterator[Path]:
    """Run cutlass_cppgen work with pyc_lab's work directory as the current directory.

    Restores the caller's current directory and ``tempfile.tempdir`` on exit, whatever
    happens inside. Yields the work directory.
    """
    with _LOCK:
        target = workdir()
        before_cwd = os.getcwd()
        before_tmp = tempfile.tempdir
        os.chdir(target)
        try:
            yield target
        finally:
            os.chdir(before_cwd)
            tempfile.tempdir = before_tmp


def import_cutlass() -> ModuleType:
    """Import ``cutlass_cppgen`` with the aliases and its files kept in :func:`workdir`.

    Raises
    ------
    DeviceUnavailableError
        If nvidia-cutlass (or cuda-bindings) is not installed.
    """
    install_cuda_aliases()
    with contained() as where:
        try:
            module = importlib.import_module("cutlass_cppgen")
            compiler = importlib.import_module("cutlass_cppgen.backend.compiler")
        except ImportError as exc:
            raise DeviceUnavailableError(
                f"CUTLASS kernels need nvidia-cutlass ({exc}); pip install 'pyc-lab[gpu]'"
            ) from None
        cache_file = str(where / "compiled_cache.db")
        module.CACHE_FILE = cache_file
        compiler.CACHE_FILE = cache_file
    return module


def prepare_offline(cc: int) -> ModuleType:
    """Import ``cutlass_cppgen`` set up for compute capability ``cc`` without a GPU.

    A plan normally asks the device for its compute capability (and fails without a
    driver); here its option registry is built for ``cc`` and its nvcc version read from
    the ``nvcc`` on the PATH, so that kernel configurations can be enumerated and their
    sources emitted on a machine with the CUDA toolkit and no GPU (the build machine).

    Raises
    ------
    DeviceUnavailableError
        If nvidia-cutlass is not installed or no ``nvcc`` is found.
    """
    module = import_cutlass()
    with _LOCK:
        if getattr(module, "_nvcc_version", None) is None:
            try:
                module._nvcc_version = module.nvcc_version()
            except Exception as exc:
                raise DeviceUnavailableError(
                    f"CUTLASS kernel sources need the CUDA toolkit's nvcc ({exc})") from None
        registry = getattr(module, "_option_registry", None)
        if registry is None or getattr(registry, "_pyc_cc", cc) != cc:
            # the registry calls cutlass_library.generator, which `import cutlass_library`
            # alone does not load
            importlib.import_module("cutlass_library.generator")
            from cutlass_cppgen.library_defaults import OptionRegistry

            with contained():
                registry = OptionRegistry(cc)
            registry._pyc_cc = cc
            module._option_registry = registry
    return module


def compile_errors(clear: bool = True) -> str:
    """The text cutlass_cppgen left in its compilation error files (and remove them)."""
    parts = []
    with _LOCK:
        for name in _ERROR_FILES:
            path = workdir() / name
            if path.is_file():
                parts.append(path.read_text(errors="replace"))
                if clear:
                    path.unlink()
    return "\n".join(p for p in parts if p.strip())
