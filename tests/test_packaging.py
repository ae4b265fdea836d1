"""The package as it ships: every folder listed in pyproject, a lean import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pyc_lab
from pyc_lab.paths import native_dir, native_source

REPO = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts)
             for p in (REPO / "pyc_lab").rglob("__init__.py")}
    assert found | {"pyc_lab.native"} == listed


def test_native_sources_are_found_and_described():
    readme = native_source("README.md")
    sources = sorted(p.name for p in native_dir().iterdir() if p.suffix in (".cuh", ".cu"))
    for name in sources:
        assert f"`{name}`" in readme, f"native/README.md does not describe {name}"


def test_import_loads_only_the_face():
    code = ("import sys, pyc_lab; "
            "print(sorted(m for m in sys.modules if m.startswith('pyc_lab')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    assert eval(out) == ["pyc_lab", "pyc_lab._lazy", "pyc_lab._version", "pyc_lab.errors"]


def test_public_names_resolve_lazily():
    for name in pyc_lab.__all__:
        assert getattr(pyc_lab, name) is not None
    assert pyc_lab.kernels.matmul.__name__ == "pyc_lab.kernels.matmul"
    assert "compile" in dir(pyc_lab)
