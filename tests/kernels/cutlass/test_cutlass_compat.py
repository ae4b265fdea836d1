"""cutlass_cppgen under cuda-bindings 13, with its files kept out of the user's directory."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from pyc_lab.kernels.cutlass import compat as cutlass_compat


@pytest.fixture
def private_cache(monkeypatch, tmp_path):
    import platformdirs

    monkeypatch.setattr(platformdirs, "user_cache_path", lambda app: tmp_path / "cache" / app)
    return tmp_path / "cache" / "pyc_lab" / "cutlass"


def test_contained_restores_cwd_and_tempdir_even_on_error(private_cache, tmp_path,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = tempfile.tempdir
    with pytest.raises(RuntimeError), cutlass_compat.contained() as where:
        assert os.getcwd() == str(where) == str(private_cache)
        tempfile.tempdir = "./"  # what cutlass_cppgen does while compiling
        raise RuntimeError("compile failed")
    assert os.getcwd() == str(tmp_path)
    assert tempfile.tempdir == before


def test_compile_errors_are_collected_and_cleared(private_cache):
    private_cache.mkdir(parents=True)
    (private_cache / "cutlass_python_compilation_host_error.txt").write_text("nvcc: boom")
    assert cutlass_compat.compile_errors() == "nvcc: boom"
    assert cutlass_compat.compile_errors() == ""


def test_aliases_are_installed_once():
    pytest.importorskip("cuda.bindings")
    cutlass_compat.install_cuda_aliases()
    import cuda

    assert sys.modules["cuda.cudart"].__name__ == "cuda.bindings.runtime"
    assert cuda.__version__
    assert cutlass_compat.install_cuda_aliases() == []


def test_import_keeps_cutlass_files_out_of_the_working_directory(tmp_path):
    pytest.importorskip("cutlass_library", reason="nvidia-cutlass is not installed")
    cache = tmp_path / "cache"
    work = tmp_path / "user_dir"
    work.mkdir()
    script = textwrap.dedent(f"""
        import platformdirs, pathlib
        platformdirs.user_cache_path = lambda app: pathlib.Path({str(cache)!r}) / app
        from pyc_lab.kernels.cutlass.compat import import_cutlass
        m = import_cutlass()
        import sys
        c = sys.modules["cutlass_cppgen.backend.compiler"]  # the package shadows the name
        print(m.__name__, c.CACHE_FILE)
    """)
    repo = str(Path(__file__).resolve().parents[3])  # importable however pyc_lab is installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)}
    run = subprocess.run([sys.executable, "-c", script], cwd=work, capture_output=True,
                         text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    name, cache_file = run.stdout.split()
    assert name == "cutlass_cppgen"
    assert cache_file == str(cache / "pyc_lab" / "cutlass" / "compiled_cache.db")
    assert list(work.iterdir()) == []  # nothing left in the user's directory
    assert (cache / "pyc_lab" / "cutlass" / "compiled_cache.db").exists()


def test_missing_cutlass_is_a_clear_error(monkeypatch, private_cache):
    import builtins

    real = builtins.__import__

    def no_cutlass(name, *args, **kwargs):
        if name.startswith("cutlass_cppgen"):
            raise ImportError("No module named 'cutlass_cppgen'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cutlass)
    monkeypatch.delitem(sys.modules, "cutlass_cppgen", raising=False)
    monkeypatch.delitem(sys.modules, "cutlass_cppgen.backend.compiler", raising=False)
    import pyc_lab as pl

    with pytest.raises(pl.DeviceUnavailableError, match=r"pip install 'pyc-lab\[gpu\]'"):
        cutlass_compat.import_cutlass()
