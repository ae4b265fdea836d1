"""``arrays.torch_raw_stream``: torch's current stream handle, read the cheap way.

torch is replaced by a stand-in module (this machine has no torch and no GPU): the
handle comes from ``torch._C._cuda_getCurrentRawStream`` for the device asked for (an
index, a ``torch.device``, its text, or torch's current device), and from
``torch.cuda.current_stream`` only where that getter does not exist. That the handle is
the stream torch's kernels run on is checked on the GPU by the torch plan tests in
``test_matmul_gpu.py``.
"""

from __future__ import annotations

import sys
import types

import pytest

from pyc_lab.kernels import arrays


class _Device:
    def __init__(self, spec, index=None):
        if isinstance(spec, str) and ":" in spec:
            spec, index = spec.split(":")
            index = int(index)
        self.type = spec
        self.index = index


def _fake_torch(fast: bool) -> tuple[types.ModuleType, list]:
    calls: list = []
    torch = types.ModuleType("torch")
    torch.device = _Device
    torch.cuda = types.SimpleNamespace(
        current_device=lambda: 3,
        current_stream=lambda index: (calls.append(("slow", index)),
                                      types.SimpleNamespace(cuda_stream=1000 + index))[1])
    torch._C = types.SimpleNamespace()
    if fast:
        def raw(index):
            calls.append(("fast", index))
            return 5000 + index
        torch._C._cuda_getCurrentRawStream = raw
    return torch, calls


@pytest.fixture
def fake(monkeypatch):
    def install(fast: bool):
        torch, calls = _fake_torch(fast)
        monkeypatch.setitem(sys.modules, "torch", torch)
        arrays._raw_stream_getter.cache_clear()
        return calls
    yield install
    arrays._raw_stream_getter.cache_clear()


def test_the_raw_getter_gives_the_handle_of_the_device_asked_for(fake):
    calls = fake(True)
    assert arrays.torch_raw_stream(1) == 5001
    assert arrays.torch_raw_stream(_Device("cuda", 2)) == 5002
    assert arrays.torch_raw_stream("cuda:4") == 5004
    assert arrays.torch_raw_stream() == 5003  # torch's current device
    assert arrays.torch_raw_stream(_Device("cuda")) == 5003
    assert calls == [("fast", 1), ("fast", 2), ("fast", 4), ("fast", 3), ("fast", 3)]


def test_a_torch_without_the_raw_getter_is_asked_for_its_stream_object(fake):
    calls = fake(False)
    assert arrays.torch_raw_stream(2) == 1002
    assert arrays.torch_raw_stream(None) == 1003
    assert calls == [("slow", 2), ("slow", 3)]
