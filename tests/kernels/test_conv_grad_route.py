"""The gradient route's decisions without a GPU: what falls to cuDNN before any race (a
grouped convolution, no tuned kernel, a lookup that fails), that each signature is
decided once, and that the memory of decisions stays bounded. The race itself and the
kernels it keeps are the GPU tests' (tests/kernels/cutlass/test_cutlass_conv_grad_gpu.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pyc_lab.kernels import conv_cutlass, conv_grad_route


@dataclass
class _Device:
    index: int = 0


class _Tensor:
    """What the route reads of a tensor before a race: device, dtype, shape, strides."""

    def __init__(self, shape: tuple[int, ...], dtype: str = "torch.bfloat16") -> None:
        self.shape, self.dtype, self.device = shape, dtype, _Device()

    def stride(self) -> tuple[int, ...]:
        out, step = [], 1
        for n in reversed(self.shape):
            out.append(step)
            step *= n
        return tuple(reversed(out))


GEO = {"stride": (1, 1), "pads": (1, 1), "dilation": (1, 1), "groups": 1}


@pytest.fixture
def fresh_route(monkeypatch):
    monkeypatch.setattr(conv_grad_route, "_CHOICES", {})
    calls = []

    def no_kernel(direction, x, w, stride, pads, dilation):
        calls.append((direction, tuple(x.shape)))
        return None, f"no tuned conv2d_{direction} kernel"

    monkeypatch.setattr(conv_cutlass, "tuned_grad_runner", no_kernel)
    return calls


def _operands(n: int = 2):
    return _Tensor((n, 8, 9, 9)), _Tensor((16, 8, 3, 3)), _Tensor((n, 16, 9, 9))


def test_without_a_tuned_kernel_cudnn_is_chosen_once_per_signature(fresh_route):
    x, w, dy = _operands()
    for _ in range(3):
        for direction in ("dgrad", "wgrad"):
            assert conv_grad_route._chosen(direction, x, w, dy, GEO) is None
    assert fresh_route == [("dgrad", (2, 8, 9, 9)), ("wgrad", (2, 8, 9, 9))]  # once each
    made = conv_grad_route.choices()
    assert sorted(k[0] for k in made) == ["dgrad", "wgrad"]
    assert all(c == {"impl": "cudnn", "why": f"no tuned conv2d_{k[0]} kernel"}
               for k, c in made.items())
    x2, w2, dy2 = _operands(4)  # another batch: another signature, asked again
    conv_grad_route._chosen("dgrad", x2, w2, dy2, GEO)
    assert fresh_route[-1] == ("dgrad", (4, 8, 9, 9))


def test_a_grouped_convolution_is_cudnns_without_a_lookup(fresh_route):
    x, w, dy = _operands()
    assert conv_grad_route._chosen("wgrad", x, w, dy, {**GEO, "groups": 2}) is None
    assert fresh_route == []
    (choice,) = conv_grad_route.choices().values()
    assert choice == {"impl": "cudnn", "why": "grouped"}


def test_a_failing_lookup_never_breaks_the_backward(fresh_route, monkeypatch, caplog):
    def broken(*args):
        raise OSError("tuning database unreadable")

    monkeypatch.setattr(conv_cutlass, "tuned_grad_runner", broken)
    x, w, dy = _operands()
    with caplog.at_level("WARNING", logger="pyc_lab.kernels.conv_grad_route"):
        assert conv_grad_route._chosen("dgrad", x, w, dy, GEO) is None
    (choice,) = conv_grad_route.choices().values()
    assert choice["impl"] == "cudnn" and "tuning database unreadable" in choice["why"]
    assert "tuned dgrad lookup failed" in caplog.text


def test_the_decisions_kept_are_bounded(fresh_route, monkeypatch):
    monkeypatch.setattr(conv_grad_route, "MAX_CHOICES", 3)
    for n in range(1, 7):
        conv_grad_route._chosen("dgrad", *_operands(n), GEO)
    kept = conv_grad_route.choices()
    assert len(kept) == 3
    assert sorted(k[3][0] for k in kept) == [4, 5, 6]  # the newest, the oldest dropped


def test_a_race_keeps_a_candidate_only_when_cheaper_by_the_margin_and_not_slower_on_the_gpu():
    from pyc_lab.kernels.conv_gemm import GPU_SLACK, MARGIN, keeps

    library = (1.0, 1.0, 0.05)  # (cost, gpu, host) milliseconds
    assert keeps((0.90, 0.90, 0.05), library)
    assert not keeps((1.0 - MARGIN / 2, 0.90, 0.05), library)  # inside the margin
    assert keeps((1.0 - MARGIN, 1.0 - MARGIN, 0.05), library)  # exactly the margin
    host_bound = (1.0, 0.5, 1.0)  # a library call the host limits
    assert not keeps((0.90, 0.5 * (1 + GPU_SLACK) + 0.1, 0.1), host_bound)  # GPU slower
    assert keeps((0.90, 0.5 * (1 + GPU_SLACK), 0.9), host_bound)
