"""The generated kernels' compile cache (``codegen/cache.py``), on the CPU.

CuPy's NVRTC wrapper, its module loader and the device are replaced by recorders, so
these tests check what is asked of them: the options (subnormals kept), the cubin
stored on disk by digest and reused by a new process, the in-process module table, a
compile failure as a clear error, and an unwritable cache folder. That the compiled
kernels keep subnormals on a GPU is checked in ``backend/test_math_ops_gpu.py``.
"""

from __future__ import annotations

import pytest

cupy = pytest.importorskip("cupy")

from pyc_lab.compiler.codegen import cache  # noqa: E402
from pyc_lab.hardware import device  # noqa: E402

SOURCE = 'extern "C" __global__ void k(float* y) { y[0] = 1.0f; }\n'


class _Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.compiles: list[tuple[str, tuple[str, ...], str]] = []
        self.loads: list[str] = []
        self.fail = fail

    def compile(self, source, options, arch):
        self.compiles.append((source, tuple(options), arch))
        if self.fail:
            raise RuntimeError("kern.cu(1): error: expected a ';'")
        return b"CUBIN:" + source.encode(), {}

    def module(self, *, path):
        self.loads.append(path)
        return ("module", path)


@pytest.fixture
def recorder(monkeypatch, tmp_path):
    rec = _Recorder()
    monkeypatch.setenv("PYC_LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(device, "require_cupy", lambda feature: cupy)
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(cupy.cuda, "Device",
                        lambda *a: type("D", (), {"compute_capability": "90"})())
    monkeypatch.setattr(cupy.cuda.nvrtc, "getVersion", lambda: (13, 0))
    monkeypatch.setattr(cupy.cuda.compiler, "compile_using_nvrtc",
                        lambda s, o, a: rec.compile(s, o, a))
    monkeypatch.setattr(cupy, "RawModule", rec.module)
    cache.clear_cache()
    yield rec
    cache.clear_cache()


def test_kernels_keep_subnormals_and_are_stored_by_digest(recorder, tmp_path):
    module = cache.compile_module(SOURCE, "k")
    ((source, options, arch),) = recorder.compiles
    assert source == SOURCE and arch == "90"
    assert "-ftz=false" in options and "-ftz=true" not in options and "-fmad=false" in options
    path = recorder.loads[0]
    assert module == ("module", path)
    stored = tmp_path / "cache" / "nvrtc"
    (file,) = stored.iterdir()
    assert str(file) == path and file.read_bytes() == b"CUBIN:" + SOURCE.encode()
    assert file.name.startswith(cache.source_digest(SOURCE)) and "sm90-nvrtc13.0" in file.name
    # the same source again: the loaded module, nothing compiled or loaded
    assert cache.compile_module(SOURCE, "k") is module
    assert len(recorder.compiles) == 1 and len(recorder.loads) == 1
    assert cache.cache_stats() == {"hits": 1, "misses": 1, "modules": 1}


def test_a_new_process_loads_the_stored_cubin_without_compiling(recorder):
    cache.compile_module(SOURCE, "k")
    cache.clear_cache()  # what a new process starts with
    cache.compile_module(SOURCE, "k")
    assert len(recorder.compiles) == 1
    assert recorder.loads[0] == recorder.loads[1]
    other = SOURCE.replace("1.0f", "2.0f")
    cache.compile_module(other, "k")
    assert len(recorder.compiles) == 2 and recorder.loads[2] != recorder.loads[0]


def test_nvrtc_failure_is_a_compile_error_and_stores_nothing(recorder, tmp_path):
    recorder.fail = True
    with pytest.raises(cache.CompileError, match=r"k: NVRTC failed.*expected a ';'"):
        cache.compile_module(SOURCE, "k")
    assert not any((tmp_path / "cache" / "nvrtc").iterdir())
    assert cache.cache_stats()["modules"] == 0
    recorder.fail = False  # the next attempt compiles
    cache.compile_module(SOURCE, "k")
    assert len(recorder.compiles) == 2


def test_an_unwritable_cache_folder_keeps_the_cubin_for_the_process(recorder, tmp_path,
                                                                     monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("PYC_LAB_CACHE_DIR", str(blocker))
    cache.compile_module(SOURCE, "k")
    path = recorder.loads[0]
    assert not path.startswith(str(blocker))
    with open(path, "rb") as f:
        assert f.read() == b"CUBIN:" + SOURCE.encode()
