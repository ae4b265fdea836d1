"""Graph breaks run on the real inputs, and a data-dependent shape is never frozen."""

from __future__ import annotations

import numpy as np
import pytest

import pyc_lab as pl
from pyc_lab.compiler import DynamicShapeError, trace
from pyc_lab.compiler.ops import run_graph


@pytest.fixture
def rng():
    return np.random.default_rng()


def test_graph_breaks_are_probed_with_the_real_inputs(rng):
    a = rng.standard_normal((4, 4)) + 4 * np.eye(4)
    f = pl.compile(lambda a: np.linalg.inv(a) @ a)  # zeros would be singular
    np.testing.assert_allclose(f(a), np.eye(4), atol=1e-12)
    b = rng.standard_normal((4, 4)) + 4 * np.eye(4)
    np.testing.assert_allclose(f(b), np.linalg.inv(b) @ b, rtol=1e-12)


def test_a_size_read_from_a_data_dependent_result_is_not_frozen():
    f = pl.compile(lambda a: a * np.unique(a).size)
    a1, a2 = np.array([1.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(f(a1), a1 * 2)
    np.testing.assert_array_equal(f(a2), a2 * 3)  # the trace saw 2 unique values
    np.testing.assert_array_equal(f(a1), a1 * 2)
    ex = f.explain(a1)
    assert ex.graph_breaks[0]["op"] == "np.unique"
    assert "depends on the input values" in ex.graph_breaks[0]["dynamic"]
    assert ex.dynamic and "np.unique" in ex.dynamic
    assert "not compiled:" in ex.summary()


def test_boolean_masks_and_unknown_functions_are_checked_at_every_call(rng):
    f = pl.compile(lambda a: a[a > 0].sum() + a.shape[0])
    g = pl.compile(lambda a: np.delete(a, np.flatnonzero(a > 0.5)).mean())
    for _ in range(3):
        a = rng.standard_normal(16)
        np.testing.assert_allclose(f(a), a[a > 0].sum() + 16, rtol=1e-12)
        np.testing.assert_allclose(g(a), np.delete(a, np.flatnonzero(a > 0.5)).mean(),
                                   rtol=1e-12)


def test_run_graph_refuses_a_changed_break_shape():
    graph, breaks = trace(lambda a: np.unique(a) * 2, (np.array([1.0, 1.0, 2.0]),))
    assert breaks[0]["dynamic"]
    with pytest.raises(DynamicShapeError, match=r"np\.unique.*f64\[3\].*f64\[2\]"):
        run_graph(graph, [np.array([1.0, 2.0, 3.0])], np)


def test_breaks_kept_by_the_passes_even_when_unread(rng):
    f = pl.compile(lambda a: a + len(np.unique(a)))
    a = rng.integers(0, 3, 10).astype(np.float64)
    f(a)
    assert "eager" in f.explain(a).ir_after


def test_a_break_failing_on_the_inputs_raises_numpys_error():
    singular = np.zeros((3, 3))
    with pytest.raises(np.linalg.LinAlgError) as info:
        pl.compile(lambda a: np.linalg.inv(a) * 2)(singular)
    assert any("graph break" in note for note in getattr(info.value, "__notes__", []))


def test_breaks_returning_several_arrays(rng):
    a = rng.standard_normal(5) * 10
    f = pl.compile(lambda a: np.modf(a)[0] + np.frexp(a)[1])
    np.testing.assert_array_equal(f(a), np.modf(a)[0] + np.frexp(a)[1])
