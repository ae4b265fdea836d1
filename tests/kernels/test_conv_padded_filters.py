"""The zero-padded filters a channel-padding CUTLASS 2 convolution keeps between calls
(kernels/conv_cutlass.py): one pad per live, unchanged filter tensor; an in-place write,
another tensor or a freed one never gets a stale copy (torch on the CPU)."""

from __future__ import annotations

import gc

import pytest

from pyc_lab.kernels.conv_cutlass import _PaddedFilters

torch = pytest.importorskip("torch")


def _last(w):
    return w.permute(0, 2, 3, 1)


def test_a_filter_is_padded_once_while_it_is_unchanged():
    kept = _PaddedFilters()
    w = torch.randn(8, 3, 5, 5)
    first = kept.get(w, _last(w), 1)
    assert first.shape == (8, 5, 5, 4)
    assert torch.equal(first[..., :3], _last(w)) and not first[..., 3].any()
    assert kept.get(w, _last(w), 1) is first


def test_an_in_place_write_or_another_tensor_is_padded_afresh():
    kept = _PaddedFilters()
    w = torch.randn(8, 3, 5, 5)
    first = kept.get(w, _last(w), 1)
    with torch.no_grad():
        w.mul_(2)  # an optimiser step writes in place
    again = kept.get(w, _last(w), 1)
    assert again is not first and torch.equal(again[..., :3], _last(w))
    other = w.clone()  # equal values, another tensor
    assert kept.get(other, _last(other), 1) is not again


def test_a_freed_filter_never_matches_and_the_memory_stays_bounded():
    kept = _PaddedFilters(limit=2)
    for _ in range(5):
        w = torch.randn(4, 3, 3, 3)
        got = kept.get(w, _last(w), 1)
        assert torch.equal(got[..., :3], _last(w))  # never an earlier filter's copy
        del w
        gc.collect()
    assert len(kept._kept) <= 2


def test_a_kept_copy_holds_no_autograd_graph():
    kept = _PaddedFilters()
    w = torch.randn(8, 3, 5, 5, requires_grad=True)
    got = kept.get(w, _last(w), 1)
    assert not got.requires_grad and got.grad_fn is None
