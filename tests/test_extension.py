"""The IPython extension on a real InteractiveShell: load, unload, reload, %pyc_hw."""

from __future__ import annotations

import subprocess
import sys

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output


@pytest.fixture
def shell():
    ip = InteractiveShell.instance()
    yield ip
    if "pyc_lab" in ip.extension_manager.loaded:
        ip.run_line_magic("unload_ext", "pyc_lab")


def test_import_prints_nothing_and_needs_no_gpu():
    code = ("import pyc_lab, sys; "
            "assert 'cupy' not in sys.modules and 'pynvml' not in sys.modules")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "" and run.stderr == ""


def test_load_registers_magics_and_prints_nothing(shell):
    with capture_output() as cap:
        shell.run_line_magic("load_ext", "pyc_lab")
    assert cap.stdout == "" and cap.stderr == "" and cap.outputs == []
    assert "pyc_hw" in shell.magics_manager.magics["line"]


def test_unload_removes_and_reload_restores(shell):
    shell.run_line_magic("load_ext", "pyc_lab")
    shell.run_line_magic("unload_ext", "pyc_lab")
    assert "pyc_hw" not in shell.magics_manager.magics["line"]
    shell.run_line_magic("load_ext", "pyc_lab")
    shell.run_line_magic("reload_ext", "pyc_lab")
    assert "pyc_hw" in shell.magics_manager.magics["line"]


def test_help_documents_the_arguments(shell):
    shell.run_line_magic("load_ext", "pyc_lab")
    doc = shell.magics_manager.magics["line"]["pyc_hw"].__doc__
    assert "--snapshot" in doc and "--bandwidth" in doc


def test_pyc_hw_shows_the_widget_for_this_machine(shell):
    shell.run_line_magic("load_ext", "pyc_lab")
    with capture_output() as cap:
        result = shell.run_cell("%pyc_hw")
    assert result.success
    (out,) = cap.outputs
    text = out.data["text/plain"]
    assert text.startswith("HardwareProfile (live)")
    assert "NUMA 0" in text
    assert "<div class='pyc-lab-topology'>" in out.data["text/html"]


def test_pyc_hw_snapshot_shows_the_dgx(shell):
    shell.run_line_magic("load_ext", "pyc_lab")
    with capture_output() as cap:
        assert shell.run_cell("%pyc_hw --snapshot dgx-h100").success
    text = cap.outputs[0].data["text/plain"]
    assert "GPU7: NVIDIA H100 80GB HBM3" in text
    assert "NV18" in text


def test_pyc_hw_bandwidth_measures_this_machine(shell):
    import pyc_lab as pl

    shell.run_line_magic("load_ext", "pyc_lab")
    with capture_output() as cap:
        assert shell.run_cell("%pyc_hw --bandwidth").success
    text = cap.outputs[0].data["text/plain"]
    assert "Bandwidth (best per kind)" in text
    # host memcpy without a GPU; the PCIe copies with one
    assert ("h2d_pinned" if pl.detect_hardware().gpus else "host_memcpy") in text


def test_bad_arguments_give_a_clear_usage_error(shell):
    shell.run_line_magic("load_ext", "pyc_lab")
    with capture_output() as cap:
        result = shell.run_cell("%pyc_hw --snapshot no-such-machine")
    assert not result.success
    assert "no hardware snapshot 'no-such-machine'" in cap.stderr + cap.stdout
    with capture_output() as cap:
        result = shell.run_cell("%pyc_hw --snapshot h200 --bandwidth")
    assert not result.success
    assert "cannot be combined" in cap.stderr + cap.stdout


def test_pyc_compile_magic_compiles_and_explains(shell):
    import numpy as np

    shell.run_line_magic("load_ext", "pyc_lab")
    shell.user_ns["np"] = np
    shell.user_ns["x"] = np.random.default_rng().standard_normal((4, 6))
    cell = "def f(x):\n    return np.tanh(x) * 2.0 + 1.0\n\ny = f(x)\n"
    with capture_output() as cap:
        result = shell.run_cell_magic("pyc_compile", "--show decisions --mode memory_first",
                                      cell)
    assert result is None
    import pyc_lab as pl

    assert isinstance(shell.user_ns["f"], pl.CompiledFunction)
    assert shell.user_ns["f"].mode == "memory_first"
    np.testing.assert_allclose(shell.user_ns["y"], np.tanh(shell.user_ns["x"]) * 2 + 1)
    (out,) = cap.outputs
    assert "NUMPY_REFERENCE" in out.data["text/html"]


def test_pyc_compile_magic_with_example_and_ir(shell):
    import numpy as np

    shell.run_line_magic("load_ext", "pyc_lab")
    shell.user_ns.update(np=np, v=np.ones(3))
    with capture_output() as cap:
        shell.run_cell_magic("pyc_compile", "--show ir --example v",
                             "def g(a):\n    return a * 3.0\n")
    text = cap.outputs[0].data["text/plain"]
    assert text.startswith("# IR before\ngraph g(%0: f64[3] a)")


def test_pyc_compile_magic_needs_a_function(shell):
    shell.run_line_magic("load_ext", "pyc_lab")
    with capture_output() as cap:
        result = shell.run_cell("%%pyc_compile\nx = 1\n")
    assert not result.success
    assert "defines no function" in cap.stderr + cap.stdout


def test_pyc_timeline_shows_the_last_pipeline(shell, tmp_path):
    import json

    import numpy as np

    import pyc_lab as pl

    shell.run_line_magic("load_ext", "pyc_lab")
    with pl.Pipeline(lambda i: np.full((4, 4), float(i)), lambda a: a * 2, depth=2,
                     mode="cpu") as pipe:
        outs = list(pipe.run(range(5)))
    np.testing.assert_array_equal(outs[3], np.full((4, 4), 6.0))
    path = tmp_path / "belt.json"
    with capture_output() as cap:
        assert shell.run_cell(f"%pyc_timeline --chrome {path}").success
    assert "compute" in cap.outputs[0].data["text/plain"]
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["name"] for e in events if e["ph"] == "X"} >= {"prepare", "compute"}
    with pl.Pipeline(lambda i: np.ones(4), lambda a: a, mode="cpu", trace=False) as quiet:
        list(quiet.run(range(3)))
    with capture_output() as cap:
        assert not shell.run_cell("%pyc_timeline").success
    assert "trace=False" in cap.stderr + cap.stdout


def test_pyc_tune_replays_without_a_gpu(shell):
    shell.run_line_magic("load_ext", "pyc_lab")
    doc = shell.magics_manager.magics["line"]["pyc_tune"].__doc__
    assert "--replay" in doc and "--max-candidates" in doc
    with capture_output() as cap:
        result = shell.run_cell("%pyc_tune gemm 4096 4096 4096 --dtype f16 --replay "
                                "--strategy exhaustive --max-candidates 4")
    assert result.success
    (out,) = cap.outputs
    lines = out.data["text/plain"].splitlines()
    assert lines[0] == ("AutotuneWidget: GEMM 4096x4096x4096 f16 tn; strategy exhaustive, "
                        "budget 180 s, at most 4 candidates")
    assert lines[1].startswith("Replayed from a recording made on NVIDIA H200, ")
    assert lines[2] == "state: done: 4 of 4 candidates (4 ok, 0 failed); stopped by exhausted"
    assert "class='pyc-lab-autotune'" in out.data["text/html"]


def test_pyc_tune_without_replay_falls_back_to_the_recording_on_a_cpu(shell):
    from pyc_lab.hardware.device import cupy_status

    if cupy_status()[0] is not None:
        pytest.skip("a GPU is present: %pyc_tune would tune live")
    shell.run_line_magic("load_ext", "pyc_lab")
    with capture_output() as cap:
        assert shell.run_cell("%pyc_tune gemm 4096 4096 4096 --dtype f16").success
    text = cap.outputs[0].data["text/plain"]
    assert "(no usable CUDA device on this machine)" in text
    assert "state: done" in text


def test_pyc_tune_bad_input_is_a_usage_error(shell):
    shell.run_line_magic("load_ext", "pyc_lab")
    with capture_output() as cap:
        result = shell.run_cell("%pyc_tune gemm 100 100 100 --replay")
    assert not result.success
    assert "no recorded tuning of GEMM 100x100x100 f16 tn" in cap.stderr + cap.stdout
    with capture_output() as cap:
        result = shell.run_cell("%pyc_tune conv 1 2 3")
    assert not result.success


# -- %pyc_timeit ------------------------------------------------------------------------------
def test_pyc_timeit_line_form_times_the_statement_and_returns_the_timing(shell):
    from pyc_lab.profiling import Timing

    shell.run_line_magic("load_ext", "pyc_lab")
    shell.user_ns["calls"] = []
    with capture_output() as cap:
        result = shell.run_cell('t = %pyc_timeit -o -n 5 -w 1 calls.append("a  b")')
    assert result.success
    t = shell.user_ns["t"]
    assert isinstance(t, Timing) and t.n == 5 and t.warmup == 1
    assert shell.user_ns["calls"] == ["a  b"] * 6  # the statement kept verbatim
    (out,) = cap.outputs  # displayed once (the assignment shows nothing more)
    with capture_output() as cap:
        shell.run_cell("%pyc_timeit -n 2 -w 0 1 + 1")
    assert len(cap.outputs) == 1  # without -o nothing is returned: shown once, not twice
    assert out.data["text/plain"] == t.summary()
    assert out.data["text/plain"].startswith('calls.append("a  b"): ')
    assert "<table class='pyc-lab-timing'>" in out.data["text/html"]


def test_pyc_timeit_cell_form_times_the_body(shell):
    shell.run_line_magic("load_ext", "pyc_lab")
    shell.user_ns["ys"] = []
    with capture_output():
        t = shell.run_cell_magic("pyc_timeit", "-o -n3 -w0 --cpu", "x = 2\nys.append(x)\n")
    assert shell.user_ns["ys"] == [2, 2, 2] and t.n == 3 and t.warmup == 0
    assert t.name == "x = 2 ... (2 lines)"


def test_pyc_timeit_on_the_host_says_why_there_is_no_gpu_time(shell):
    from pyc_lab.hardware.device import cupy_status

    shell.run_line_magic("load_ext", "pyc_lab")
    with capture_output():
        forced = shell.run_line_magic("pyc_timeit", "--cpu -o -n 2 sum(range(10))")
    assert forced.gpu_s is None
    assert forced.summary().endswith("(2 calls, 2 warm-up; CPU (no GPU: gpu=False asks for "
                                     "host timing))")
    if cupy_status()[0] is not None:
        return  # with a GPU, the default times on it
    with capture_output():
        auto = shell.run_line_magic("pyc_timeit", "-o -n 2 sum(range(10))")
    assert auto.gpu_s is None and "CPU (no GPU: " in auto.summary()
    assert auto.summary().startswith("sum(range(10)): CPU ")


def test_pyc_timeit_passes_its_options_to_benchmark(shell, monkeypatch):
    from pyc_lab.profiling import timing

    seen = []
    real = timing.benchmark

    def spy(fn, **kwargs):
        seen.append(kwargs)
        return real(fn, **{**kwargs, "gpu": False})

    monkeypatch.setattr(timing, "benchmark", spy)
    shell.run_line_magic("load_ext", "pyc_lab")
    with capture_output():
        shell.run_line_magic("pyc_timeit", "--flush-l2 --no-spin -n 4 -w 0 -- -1")
        shell.run_line_magic("pyc_timeit", "--repeats 2 --warmup=1 --cpu 1 + 1")
    assert seen[0] == {"repeats": 4, "warmup": 0, "flush_l2": True, "spin": False,
                       "gpu": None, "name": "-1"}
    assert seen[1] == {"repeats": 2, "warmup": 1, "flush_l2": False, "spin": True,
                       "gpu": False, "name": "1 + 1"}


def test_pyc_timeit_documents_its_options(shell):
    shell.run_line_magic("load_ext", "pyc_lab")
    assert "pyc_timeit" in shell.magics_manager.magics["cell"]
    doc = shell.magics_manager.magics["line"]["pyc_timeit"].__doc__
    for option in ("-n REPEATS", "-w WARMUP", "--flush-l2", "--no-spin", "--cpu"):
        assert option in doc


@pytest.mark.parametrize("cell, message", [
    ("%pyc_timeit", "%pyc_timeit: nothing to time"),
    ("%pyc_timeit -n 0 1 + 1", "%pyc_timeit: repeats must be an integer >= 1"),
    ("%pyc_timeit -w -1 1 + 1", "%pyc_timeit: warmup must be an integer >= 0"),
    ("%pyc_timeit 1 / 0", "%pyc_timeit: the statement raised ZeroDivisionError: division by "
                          "zero"),
    ("%pyc_timeit f(", "%pyc_timeit: the statement is not valid Python"),
    ("%pyc_timeit -n x 1 + 1", "argument -n/--repeats: invalid int value: 'x'"),
    ("%pyc_timeit --bogus 1 + 1", "unrecognized arguments: --bogus"),
    ("%%pyc_timeit -n 2 x = 1\ny = 2\n", "%%pyc_timeit: only options go on the magic's line"),
    ("%%pyc_timeit\nraise KeyError('k')\n", "%%pyc_timeit: the statement raised KeyError"),
])
def test_pyc_timeit_bad_input_is_a_one_line_usage_error(shell, cell, message):
    shell.run_line_magic("load_ext", "pyc_lab")
    with capture_output() as cap:
        result = shell.run_cell(cell)
    assert not result.success
    text = cap.stderr + cap.stdout
    assert message in text
    assert "Traceback" not in text


# -- usage errors say what to type ------------------------------------------------------------

@pytest.mark.parametrize(("cell", "message"), [
    ("%pyc_tune", "%pyc_tune: the following arguments are required: gemm, M, N, K. Type: "
                  "%pyc_tune gemm M N K [--dtype DTYPE]"),
    ("%pyc_tune gemm -5 64 64 --replay", "%pyc_tune: argument M: -5 is not a positive "
                                         "dimension"),
    ("%pyc_tune gemm 64 64 64 --replay /nope.json",
     "%pyc_tune: --replay /nope.json: no such file; give a tuning-database export"),
    ("%pyc_hw --bogus", "%pyc_hw: unrecognized arguments: --bogus. Type: %pyc_hw "
                        "[--snapshot PATH] [--bandwidth]"),
    ("%pyc_timeline --chrome /missing/dir/t.json",
     "%pyc_timeline: --chrome /missing/dir/t.json: folder /missing/dir does not exist"),
    ("%%pyc_trace --chrome /missing/dir/t.json\nx = 1\n",
     "%%pyc_trace: --chrome /missing/dir/t.json: folder /missing/dir does not exist"),
    ("%%pyc_compile --example nope\ndef f(x):\n    return x\n",
     "%%pyc_compile: --example 'nope' raised NameError"),
    ("%%pyc_compile --bogus\ndef f(x):\n    return x\n",
     "Type: %%pyc_compile [--show"),
])
def test_usage_errors_are_one_line_and_say_what_to_type(shell, cell, message):
    shell.run_line_magic("load_ext", "pyc_lab")
    with capture_output() as cap:
        result = shell.run_cell(cell)
    assert not result.success
    text = cap.stderr + cap.stdout
    assert message in text
    assert "Traceback" not in text and "source=None" not in text


def test_pyc_tune_help_shows_what_to_type_and_the_options_defaults(shell):
    from pyc_lab.kernels.tuning.options import GemmTuneOptions

    shell.run_line_magic("load_ext", "pyc_lab")
    defaults = GemmTuneOptions()
    doc = " ".join(shell.magics_manager.magics["line"]["pyc_tune"].__doc__.split())
    assert "%pyc_tune gemm M N K [--dtype DTYPE]" in doc
    assert f"default {defaults.dtype}" in doc
    assert f"default {defaults.layout}" in doc
    assert f"default {defaults.strategy}" in doc
    assert f"default {defaults.budget_s:g}" in doc
    assert f"default {defaults.max_candidates}" in doc


# -- %pyc_serve ------------------------------------------------------------------------------
def test_pyc_serve_lists_monitors_and_stops_servers(shell):
    pytest.importorskip("onnx")
    import numpy as np
    from IPython.core.error import UsageError

    from pyc_lab.inference.model import load
    from pyc_lab.inference.server import running_servers, serve

    shell.run_line_magic("load_ext", "pyc_lab")
    model = load(lambda x: x + np.float32(1), inputs={"x": ("float32", (None, 3))})
    server = serve(model, name="magic-test")
    try:
        with capture_output() as cap:
            shell.run_line_magic("pyc_serve", "")
        assert "magic-test" in str(cap.outputs[0].data["text/plain"])
        with capture_output() as cap:
            shell.run_line_magic("pyc_serve", "--monitor magic-test")
        assert "latency monitor of magic-test" in str(cap.outputs[0].data["text/plain"])
        with pytest.raises(UsageError, match="no running server 'nope'"):
            shell.run_line_magic("pyc_serve", "--stop nope")
        with capture_output():
            shell.run_line_magic("pyc_serve", "--stop magic-test")
        assert server.closed and server not in running_servers()
    finally:
        server.close()
