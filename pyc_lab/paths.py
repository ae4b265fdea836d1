"""Where pyc_lab keeps things: the user cache directory and the shipped files.

Everything pyc_lab writes (the tuning database, built kernels, ``cutlass_cppgen``'s
scratch files) lives under one per-user cache directory (``platformdirs``), never in
the working directory. ``$PYC_LAB_CACHE_DIR`` moves it (a shared cache on a cluster, a
scratch directory in CI).

What pyc_lab reads ships inside the package: CUDA C++ sources under ``native/`` (the
repository's top-level ``native/`` folder, installed as ``pyc_lab/native``) and data
files under ``pyc_lab/data``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from .errors import PycLabError

__all__ = ["cache_dir", "data_path", "native_dir", "native_source", "replacing"]

_PACKAGE = Path(__file__).resolve().parent


def cache_dir(*parts: str, create: bool = True) -> Path:
    """``<user cache dir>/pyc_lab[/<parts>...]``, created unless ``create=False``.

    Parameters
    ----------
    *parts
        Sub-folders, e.g. ``cache_dir("kernels")``.
    create
        Make the folder (and its parents) if missing.

    Returns
    -------
    pathlib.Path
        ``$PYC_LAB_CACHE_DIR`` when set, else ``platformdirs.user_cache_path("pyc_lab")``,
        joined with ``parts``.
    """
    override = os.environ.get("PYC_LAB_CACHE_DIR")
    if override:
        root = Path(override).expanduser()
    else:
        import platformdirs

        root = Path(platformdirs.user_cache_path("pyc_lab"))
    path = root.joinpath(*parts)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


@cache
def native_dir() -> Path:
    """The folder of pyc_lab's CUDA C++ sources.

    An installed wheel carries them as ``pyc_lab/native``; a source checkout (an
    editable install, or the checkout on ``PYTHONPATH``) has them in the repository's
    top-level ``native/``.
    """
    for candidate in (_PACKAGE / "native", _PACKAGE.parent / "native"):
        if (candidate / "README.md").is_file():
            return candidate
    raise PycLabError(f"pyc_lab's CUDA sources are missing (looked in {_PACKAGE / 'native'} "
                      f"and {_PACKAGE.parent / 'native'}); reinstall pyc_lab")


@cache
def native_source(name: str) -> str:
    """The text of one CUDA source under :func:`native_dir` (e.g. ``"f16.cuh"``)."""
    path = native_dir() / name
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PycLabError(f"cannot read pyc_lab's CUDA source {path}: {exc}; reinstall "
                          "pyc_lab") from exc


def data_path(*parts: str) -> Path:
    """A file shipped under ``pyc_lab/data`` (snapshots, tuning recordings)."""
    return _PACKAGE.joinpath("data", *parts)


@contextmanager
def replacing(path: str | Path, action: str,
              error: type[PycLabError] = PycLabError) -> Iterator[Path]:
    """A file to write ``path``'s new content into, renamed over ``path`` at the end.

    A write that fails never leaves a truncated file nor destroys the earlier one. A link
    is followed (the file it names is replaced); a target that is not a regular file (a
    pipe, ``/dev/stdout``) is written directly.

    Parameters
    ----------
    path
        The file to replace or create.
    action
        What is being done, for messages (``"export the kernel cache"``).
    error
        The :class:`~pyc_lab.errors.PycLabError` subclass to raise.

    Raises
    ------
    PycLabError
        (``error``) If the folder of ``path`` does not exist, or the file cannot be
        written.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise error(f"cannot {action} to {path}: folder {path.parent} does not exist; "
                    "create it first")
    target = Path(os.path.realpath(path))
    special = target.exists() and not target.is_file()
    partial = target if special else target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        yield partial
        if not special:
            os.replace(partial, target)
    except OSError as exc:
        raise error(f"cannot {action} to {path} ({exc.strerror or exc})") from None
    finally:
        if not special:
            partial.unlink(missing_ok=True)
