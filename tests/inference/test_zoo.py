"""The zoo: deterministic ONNX models, imported exactly (vs onnxruntime and onnx.reference)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx.reference import ReferenceEvaluator

from pyc_lab.inference import zoo
from pyc_lab.inference.errors import InferenceError
from pyc_lab.inference.model import load


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_model_matches_onnxruntime_and_reference(name):
    ort = pytest.importorskip("onnxruntime")
    m = zoo.build(name)
    model = load(m)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = ReferenceEvaluator(m)
    for batch in (1, 7):
        feeds = zoo.example_inputs(name, batch, seed=batch)
        got = model(feeds)
        for out, want, want_ref in zip(model.output_names, sess.run(None, feeds),
                                       ref.run(None, feeds), strict=True):
            scale = float(np.abs(want).max())
            assert got[out].shape == want.shape
            np.testing.assert_allclose(got[out], want, rtol=0, atol=2e-5 * scale)
            np.testing.assert_allclose(got[out], want_ref, rtol=0, atol=2e-5 * scale)


def test_zoo_is_deterministic_and_seeded():
    a = zoo.build("astro_mlp", seed=3).SerializeToString()
    assert a == zoo.build("astro_mlp", seed=3).SerializeToString()
    assert a != zoo.build("astro_mlp", seed=4).SerializeToString()


def test_zoo_batch_norms_fold():
    assert load(zoo.build("astro_mlp")).imported.op_counts == {"Gemm": 3, "Identity": 1,
                                                               "Relu": 2}
    notes = load(zoo.build("biology_vae")).imported.notes
    assert sum("folded" in n for n in notes) == 1


def test_zoo_save_and_unknown(tmp_path):
    path = zoo.save("particle_cnn", tmp_path / "cnn.onnx")
    assert load(path).inputs[0].shape == (None, 4, zoo.CNN_LENGTH)
    with pytest.raises(InferenceError, match="no zoo model"):
        zoo.build("resnet")


def test_run_takes_a_list_and_says_so_for_one_bare_array():
    from pyc_lab.inference.errors import BadRequestError

    model = load(zoo.build("astro_mlp"))
    (x,) = model.example(3, seed=1)
    (want,) = model.run([x])
    np.testing.assert_array_equal(model(x), want)
    for call in (model.run, model.io_binding):
        with pytest.raises(BadRequestError, match=r"takes a list of arrays.*pass \[x\]"):
            call(x)
