"""The device gate: one reason, decided from the facts, repeated by every GPU feature."""

from __future__ import annotations

import builtins
import ctypes

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.hardware import device as gate
from pyc_lab.hardware.device import CupyFacts, DriverFacts, explain

NO_DRIVER = "no NVIDIA driver on this machine (libcuda not found)"
NO_GPU = "the NVIDIA driver reports no GPU"
NO_CUPY = "CuPy is not installed (pip install 'pyc-lab[gpu]')"

ONE_GPU = DriverFacts(libcuda=True, device_count=1, cuda_version="13.0")
CUPY_OK = CupyFacts(installed=True, device_count=1, cuda_version="13.0")


# -- explain: the reasons, from faked facts ---------------------------------------------
def test_no_libcuda_is_no_driver_whatever_cupy_says():
    for cupy in (None, CUPY_OK, CupyFacts(installed=False)):
        assert explain(DriverFacts(libcuda=False), cupy) == NO_DRIVER


def test_libcuda_without_a_device_is_no_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    facts = DriverFacts(libcuda=True, device_count=0, cuda_version="13.0")
    assert explain(facts) == explain(facts, CUPY_OK) == NO_GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert explain(facts) == f"{NO_GPU} (CUDA_VISIBLE_DEVICES='')"


def test_a_driver_that_does_not_start_names_the_cuda_error():
    facts = DriverFacts(libcuda=True, init_error="CUDA_ERROR_SYSTEM_DRIVER_MISMATCH")
    assert explain(facts) == ("the NVIDIA driver did not start "
                              "(cuInit: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)")


def test_a_gpu_without_cupy_is_fine_for_the_profile_not_for_cupy_features():
    assert explain(ONE_GPU) is None
    assert explain(ONE_GPU, CupyFacts(installed=False)) == NO_CUPY
    broken = CupyFacts(installed=True, import_error="ImportError: libnvrtc.so.13: not found")
    assert explain(ONE_GPU, broken) == (
        "CuPy failed to import (ImportError: libnvrtc.so.13: not found); reinstall it "
        "(pip install 'pyc-lab[gpu]')")
    assert explain(ONE_GPU, CUPY_OK) is None


def test_an_old_driver_is_named_with_both_versions():
    old = DriverFacts(libcuda=True, device_count=1, cuda_version="12.4")
    cupy = CupyFacts(installed=True, cuda_version="13.0",
                     runtime_error="cudaErrorInsufficientDriver: CUDA driver version is "
                                   "insufficient for CUDA runtime version")
    assert explain(old, cupy) == (
        "the NVIDIA driver supports CUDA 12.4 but CuPy needs CUDA 13.0: upgrade the driver, "
        "or install the CuPy built for CUDA 12 (cupy-cuda12x)")
    other = CupyFacts(installed=True, runtime_error="cudaErrorUnknown: unknown error")
    assert explain(ONE_GPU, other) == "CuPy cannot use the GPU (cudaErrorUnknown: unknown error)"


# -- the gate in a process: facts gathered once, every feature repeats the reason --------
@pytest.fixture
def fake_facts(monkeypatch):
    """Replace what the driver and CuPy say; returns a setter."""

    def use(driver: DriverFacts, cupy: CupyFacts | None = None) -> None:
        monkeypatch.setattr(gate, "driver_facts", lambda: driver)
        monkeypatch.setattr(gate, "cupy_facts", lambda: cupy or CupyFacts(installed=False))

    return use


@pytest.mark.parametrize(("driver", "cupy", "reason"), [
    (DriverFacts(libcuda=False), CUPY_OK, NO_DRIVER),
    (DriverFacts(libcuda=True, device_count=0), CUPY_OK, NO_GPU),
    (ONE_GPU, CupyFacts(installed=False), NO_CUPY),
], ids=["no-libcuda", "libcuda-no-device", "no-cupy"])
def test_every_feature_repeats_the_one_reason(fake_facts, monkeypatch, driver, cupy, reason):
    from pyc_lab.compiler import api as compiler_api
    from pyc_lab.kernels.tuning.autotune import autotune_gemm
    from pyc_lab.kernels.tuning.background import TuningRun
    from pyc_lab.profiling.activity import GpuActivity
    from pyc_lab.profiling.bandwidth import probe_bandwidth

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_facts(driver, cupy)
    assert gate.no_gpu_reason() == reason
    assert gate.cupy_status() == (None, reason)
    with pytest.raises(pl.DeviceUnavailableError,
                       match=rf"^the probe needs a CUDA device: {_re(reason)}\."):
        gate.require_cupy("the probe")

    bw = probe_bandwidth(sizes=[4096], min_time_s=0.001)
    gpu_rows = bw[bw["kind"] != "host_memcpy"]
    assert set(gpu_rows["status"]) == {f"needs a CUDA device: {reason}"}
    with pytest.raises(pl.DeviceUnavailableError, match=_re(reason)):
        GpuActivity()
    with pytest.raises(pl.DeviceUnavailableError, match=_re(reason)):
        compiler_api.compile(lambda x: x + 1, backend="cupy")(np.ones(3))
    with pytest.raises(pl.PycLabError, match=_re(reason)):
        autotune_gemm(256, 256, 256)
    with pytest.raises(pl.PycLabError, match=rf"mode='live' needs a CUDA device: {_re(reason)}"):
        TuningRun(mode="live")
    auto = TuningRun(4096, 4096, 4096, mode="auto")  # falls back to the recording, saying why
    assert (auto.mode, auto.fallback, auto.fallback_reason) == ("replay", True, reason)


def test_the_profile_shows_the_gate_reason_with_the_providers_detail(fake_facts, monkeypatch):
    from pyc_lab.hardware.providers import cuda as cuda_provider
    from pyc_lab.hardware.providers import nvml as nvml_provider
    from pyc_lab.hardware.providers.base import ProviderReport

    fake_facts(DriverFacts(libcuda=False))
    monkeypatch.setattr(nvml_provider, "collect_nvml", lambda: ProviderReport.unavailable(
        "nvml", "NVMLError_LibraryNotFound: NVML Shared Library Not Found"))
    monkeypatch.setattr(cuda_provider, "collect_cuda", lambda: ProviderReport.unavailable(
        "cuda.core", "DynamicLibNotFoundError: cuda"))
    hw = pl.detect_hardware()
    assert hw.cuda_status == f"no CUDA device: {NO_DRIVER}"
    assert hw.summary_lines()[-1] == hw.cuda_status
    assert hw.providers["nvml"] == hw.providers["cuda.core"] == f"unavailable: {NO_DRIVER}"
    assert hw.provider_details == {
        "nvml": "NVMLError_LibraryNotFound: NVML Shared Library Not Found",
        "cuda.core": "DynamicLibNotFoundError: cuda"}
    row = hw.sources_frame().iloc[0]
    assert (row["scope"], row["field"], row["value"]) == ("GPUs", "count", "0")
    assert row["source"] == hw.cuda_status
    assert row["fallbacks"] == ("nvml: NVMLError_LibraryNotFound: NVML Shared Library Not "
                                "Found; cuda.core: DynamicLibNotFoundError: cuda")
    again = pl.hardware.HardwareProfile.from_json(hw.to_json())
    assert again.provider_details == hw.provider_details


def test_the_profile_keeps_provider_reasons_when_the_driver_has_a_gpu(fake_facts, monkeypatch):
    """The gate only speaks for the machine: with a GPU, a provider's own reason stands."""
    from pyc_lab.hardware.detect import gate_reason
    from pyc_lab.hardware.providers.base import ProviderReport

    reports = [ProviderReport.unavailable("nvml", "nvidia-ml-py is not installed"),
               ProviderReport(name="sysfs")]
    gate_reason(reports, None)
    assert reports[0].status == "unavailable: nvidia-ml-py is not installed"
    assert reports[0].detail == "" and reports[1].status == "ok"
    gate_reason(reports, NO_GPU)
    assert (reports[0].reason, reports[0].detail) == (NO_GPU, "nvidia-ml-py is not installed")
    assert reports[1].status == "ok"


def test_facts_are_gathered_once_per_process(monkeypatch):
    loads = []
    real = ctypes.CDLL

    def counting(name, *args, **kwargs):
        loads.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(ctypes, "CDLL", counting)
    gate.driver_facts.cache_clear()
    try:
        first = gate.driver_facts()
        assert gate.driver_facts() is first
        assert loads.count(gate._LIBCUDA) == 1
    finally:
        gate.driver_facts.cache_clear()


def test_missing_cupy_is_not_installed(monkeypatch):
    real_import = builtins.__import__

    def no_cupy(name, *args, **kwargs):
        if name == "cupy":
            raise ModuleNotFoundError("No module named 'cupy'", name="cupy")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cupy)
    gate.cupy_facts.cache_clear()
    try:
        assert gate.cupy_facts() == CupyFacts(installed=False)
    finally:
        gate.cupy_facts.cache_clear()


def test_this_machine_agrees_with_its_facts():
    driver = gate.driver_facts()
    reason = gate.no_gpu_reason()
    if not driver.libcuda:
        assert reason == NO_DRIVER
        assert pl.detect_hardware().cuda_status == f"no CUDA device: {NO_DRIVER}"
    elif reason is None:  # pragma: no cover - a GPU machine
        assert gate.cupy_status()[0] is not None


def _re(text: str) -> str:
    import re

    return re.escape(text)
