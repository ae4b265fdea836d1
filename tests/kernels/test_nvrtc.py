"""The NVRTC compile path of the hand-written kernels (``kernels/nvrtc.py``), on the CPU.

CuPy's NVRTC wrapper, its module loader and the device are replaced by recorders: the
options always keep subnormals (``-ftz=false``), template instantiations are looked up by
their mangled names, both the binary and the names are stored on disk and reused by a
new process, a damaged names file compiles again, and each native kernel family (skinny
GEMM, padding copies, convolution patches and guards) is compiled through this path,
never through ``cupy.RawModule(code=...)``, which appends ``-ftz=true``.
"""

from __future__ import annotations

import pytest

cupy = pytest.importorskip("cupy")

from pyc_lab.kernels import nvrtc  # noqa: E402
from pyc_lab.paths import native_source  # noqa: E402

SOURCE = "template <int N> __global__ void k(float* y) { y[0] = N * 1.0f; }\n"


class _Recorder:
    def __init__(self) -> None:
        self.compiles: list[dict] = []
        self.loads: list[str] = []
        self.fail = False

    def compile(self, source, options, arch, name_expressions=None):
        self.compiles.append({"source": source, "options": tuple(options), "arch": arch,
                              "names": name_expressions})
        if self.fail:
            raise RuntimeError("kern.cu(3): error: identifier is undefined")
        mangled = {n: f"_Z1kILi{n[2:-1]}EEvPf" for n in name_expressions or ()}
        return b"CUBIN:" + source.encode(), (mangled or None)

    def module(self, *, path):
        self.loads.append(path)
        return _Module(path)


class _Module:
    def __init__(self, path: str) -> None:
        self.path = path

    def get_function(self, name: str):
        if not name.startswith("_Z") and name != "plain":
            raise RuntimeError(f"named symbol not found: {name}")
        return ("function", name)


@pytest.fixture
def recorder(monkeypatch, tmp_path):
    rec = _Recorder()
    monkeypatch.setenv("PYC_LAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cupy.cuda, "Device",
                        lambda *a: type("D", (), {"compute_capability": "90"})())
    monkeypatch.setattr(cupy.cuda.nvrtc, "getVersion", lambda: (13, 0))
    monkeypatch.setattr(cupy.cuda.compiler, "compile_using_nvrtc", rec.compile)
    monkeypatch.setattr(cupy, "RawModule", rec.module)
    return rec


def test_templates_compile_without_flushing_and_load_by_mangled_name(recorder, tmp_path):
    module = nvrtc.compile_module(SOURCE, ("-std=c++17",), ["k<3>", "k<5>"], "test")
    (call,) = recorder.compiles
    assert "-ftz=false" in call["options"] and "-ftz=true" not in call["options"]
    assert call["names"] == ["k<3>", "k<5>"] and call["arch"] == "90"
    assert module.get_function("k<3>") == ("function", "_Z1kILi3EEvPf")
    assert module.get_function("k<5>") == ("function", "_Z1kILi5EEvPf")
    stored = sorted(p.name for p in (tmp_path / "cache" / "nvrtc").iterdir())
    assert len(stored) == 2 and stored[0].endswith(".bin") and stored[1].endswith(
        ".names.json")
    with pytest.raises(nvrtc.NvrtcError, match=r"test: could not load kernel 'k<7>'"):
        module.get_function("k<7>")


def test_a_caller_s_ftz_choice_is_kept():
    # a caller naming -ftz itself is not overridden (the generated kernels name it)
    assert nvrtc.nvrtc_digest("s", ("-ftz=false",)) != nvrtc.nvrtc_digest("s", ())


def test_a_new_process_reuses_binary_and_names_and_other_instantiations_compile(recorder):
    first = nvrtc.compile_module(SOURCE, ("-std=c++17",), ["k<3>"], "test")
    again = nvrtc.compile_module(SOURCE, ("-std=c++17",), ["k<3>"], "test")
    assert len(recorder.compiles) == 1
    assert again.get_function("k<3>") == first.get_function("k<3>")
    assert recorder.loads[0] == recorder.loads[1]
    nvrtc.compile_module(SOURCE, ("-std=c++17",), ["k<4>"], "test")
    assert len(recorder.compiles) == 2 and recorder.loads[2] != recorder.loads[0]


def test_a_damaged_names_file_compiles_again(recorder, tmp_path):
    nvrtc.compile_module(SOURCE, ("-std=c++17",), ["k<3>"], "test")
    (names,) = (tmp_path / "cache" / "nvrtc").glob("*.names.json")
    names.write_text("{not json")
    module = nvrtc.compile_module(SOURCE, ("-std=c++17",), ["k<3>"], "test")
    assert len(recorder.compiles) == 2
    assert module.get_function("k<3>") == ("function", "_Z1kILi3EEvPf")


def test_nvrtc_failure_is_a_clear_error_and_stores_nothing(recorder, tmp_path):
    recorder.fail = True
    with pytest.raises(nvrtc.NvrtcError, match=r"test: NVRTC failed.*undefined"):
        nvrtc.compile_module(SOURCE, ("-std=c++17",), ["k<3>"], "test")
    folder = tmp_path / "cache" / "nvrtc"
    assert not folder.exists() or not any(folder.iterdir())


def test_an_unwritable_cache_keeps_binary_and_names_for_the_process(recorder, tmp_path,
                                                                     monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("PYC_LAB_CACHE_DIR", str(blocker))
    module = nvrtc.compile_module(SOURCE, ("-std=c++17",), ["k<3>"], "test")
    assert not recorder.loads[0].startswith(str(blocker))
    assert module.get_function("k<3>") == ("function", "_Z1kILi3EEvPf")


@pytest.mark.parametrize("family", ["skinny", "padded", "conv_gemm", "conv_guard",
                                    "conv_direct"])
def test_every_native_kernel_family_compiles_through_nvrtc(family, monkeypatch):
    """Each family's loader calls :func:`nvrtc.compile_module` with its own source and
    instantiations (never ``cupy.RawModule(code=...)``)."""
    import importlib

    mod = importlib.import_module(f"pyc_lab.kernels.{family}")
    calls = []

    def fake(source, options=("-std=c++17",), names=(), label="kernel"):
        calls.append((source, tuple(names)))
        raise nvrtc.NvrtcError(f"{label}: recorded")

    monkeypatch.setattr(mod, "compile_module", fake)
    monkeypatch.setattr(cupy, "RawModule", lambda *a, **k: pytest.fail("RawModule(code=)"))
    expected = {"skinny": "skinny_gemm.cuh", "padded": "pad_copy.cuh",
                "conv_gemm": "conv_patches.cuh", "conv_guard": "conv_guard.cuh",
                "conv_direct": "conv_direct.cuh"}[family]
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(cupy.cuda, "Device", _NullDevice)
    from pyc_lab.errors import PycLabError
    from pyc_lab.hardware import device

    monkeypatch.setattr(device, "require_cupy", lambda feature: cupy)
    if family == "skinny":  # a failed build is reported per configuration
        _load(family, mod)
    else:
        with pytest.raises(PycLabError, match="recorded"):
            _load(family, mod)
    assert calls, f"{family} compiled nothing through kernels.nvrtc"
    source, names = calls[0]
    assert native_source(expected) in source and names


class _NullDevice:
    def __init__(self, *a) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _load(family: str, mod) -> None:
    """Ask ``family`` for its kernels the way its launcher does."""
    if family == "skinny":
        cfg = mod.SkinnyConfig(rt=1, warps=4, stages=3)
        message = mod.compile_kernels("f16", 8, [cfg])
        assert message == {cfg.id: "NVRTC: NvrtcError: the skinny GEMM: recorded"}
    elif family == "padded":
        mod._functions(0, "__half")
    elif family == "conv_gemm":
        mod.gather_patches(0, 2, 0, 0, (1,) * 14, (64, 8, 1), 6, 64, None)
    elif family == "conv_direct":
        mod._function(0, 2, mod.Config(False, 8, 4), 1, (0,) * 20)
    else:
        mod._function(0, 2, "pyc_conv_fixup")
