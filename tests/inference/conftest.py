"""Fixtures of the inference tests: every server they start is closed, whatever happens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx", reason="the inference tests import ONNX models (pip install onnx)")


@pytest.fixture
def start() -> Iterator[Any]:
    """``start(model, **options)``: ``pl.serve`` whose servers are closed after the test.

    Servers run on the host (``device="cpu"``) unless the test asks otherwise: the batching
    tests wrap the model's own call, which a GPU bucket executor would bypass.
    """
    from pyc_lab.inference.server import serve

    servers = []

    def make(model: Any, **options: Any) -> Any:
        options.setdefault("device", "cpu")
        options.setdefault("timeout_s", 60.0)  # a stuck batcher fails the test, never hangs it
        server = serve(model, **options)
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.close(drain=False, timeout_s=5)
        for b in s._batchers.values():
            assert not b.alive, f"{s.name}: a batcher thread outlived close()"


@pytest.fixture
def affine() -> Any:
    """A tiny compiled model ``y = 2 x + 1`` on ``float32[N, 4]`` (rows independent)."""
    from pyc_lab.inference.model import load

    def affine(x):
        return x * np.float32(2) + np.float32(1)

    return load(affine, inputs={"x": ("float32", (None, 4))}, outputs=["y"])
