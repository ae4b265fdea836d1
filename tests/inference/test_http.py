"""The KServe v2 endpoint on loopback, with Triton's own HTTP client."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("starlette", reason="the HTTP endpoint needs starlette (pyc-lab[serve])")
pytest.importorskip("uvicorn", reason="the HTTP endpoint needs uvicorn (pyc-lab[serve])")
httpclient = pytest.importorskip(
    "tritonclient.http", reason="the endpoint is tested with tritonclient[http] as the client")

from pyc_lab.inference import zoo  # noqa: E402
from pyc_lab.inference.model import load  # noqa: E402
from pyc_lab.inference.protocol import decode_request, encode_response  # noqa: E402


@pytest.fixture(scope="module")
def vae():
    return load(zoo.build("materials_vae"))


@pytest.fixture
def endpoint(start, vae, affine):
    server = start({"materials_vae": vae, "affine": affine}, max_batch=16, max_delay_ms=1)
    ep = server.http(port=0)
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{ep.port}")
    yield server, ep, client
    client.close()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_health_and_metadata(endpoint):
    server, ep, client = endpoint
    assert ep.url.startswith("http://127.0.0.1:")
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("materials_vae")
    assert not client.is_model_ready("missing")
    meta = client.get_model_metadata("materials_vae")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 6]}]
    assert [o["name"] for o in meta["outputs"]] == ["recon", "mu", "logvar"]
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    assert server.url == ep.url


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_matches_the_model(endpoint, vae, binary):
    _, _, client = endpoint
    x = zoo.example_inputs("materials_vae", 5, seed=3)["x"]
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    outs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("recon", "mu")]
    res = client.infer("materials_vae", [inp], outputs=outs, request_id="r1")
    recon, mu, _ = vae(x)
    np.testing.assert_allclose(res.as_numpy("recon"), recon, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.as_numpy("mu"), mu, rtol=1e-5, atol=1e-6)
    assert res.as_numpy("logvar") is None
    assert res.get_response()["id"] == "r1"


def test_concurrent_clients_get_their_own_rows(endpoint):
    from concurrent.futures import ThreadPoolExecutor

    _, ep, _ = endpoint

    def one(k: int) -> None:
        c = httpclient.InferenceServerClient(url=f"127.0.0.1:{ep.port}")
        x = np.full((1 + k % 3, 4), k, np.float32)
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(c.infer("affine", [inp]).as_numpy("y"), x * 2 + 1)
        c.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(32)))


def test_errors(endpoint):
    _, ep, client = endpoint
    bad = httpclient.InferInput("x", [2, 5], "FP32")
    bad.set_data_from_numpy(np.ones((2, 5), np.float32))
    with pytest.raises(Exception, match=r"\[400\].*axis 1 is 5, expected 6"):
        client.infer("materials_vae", [bad])
    nan = httpclient.InferInput("x", [2, 6], "FP32")  # refused in its batch: 400 too
    nan.set_data_from_numpy(np.array([[1, 2, 3, 4, 5, 6], [1, 2, np.inf, 4, 5, 6]],
                                     np.float32))
    with pytest.raises(Exception, match=r"\[400\].*'x' holds NaN or infinity"):
        client.infer("materials_vae", [nan])
    with pytest.raises(Exception, match=r"\[404\]|no model"):
        client.infer("nope", [bad])
    status, body = _get(ep.url + "/v2/models/nope")
    assert status == 404 and "no model" in json.loads(body)["error"]
    req = urllib.request.Request(ep.url + "/v2/models/affine/infer", data=b"{not json",
                                 method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400


def test_metrics_are_prometheus_text_with_histograms(endpoint):
    from prometheus_client.parser import text_string_to_metric_families

    server, ep, _ = endpoint
    server.predict(np.ones((3, 4), np.float32), model="affine")
    status, body = _get(ep.url + "/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    hist = families["pyc_lab_inference_request_duration_seconds"]
    assert hist.type == "histogram"
    count = [s for s in hist.samples if s.name.endswith("_count")
             and s.labels["model"] == "affine"]
    assert count and count[0].value == 1
    assert "pyc_lab_inference_batch_size" in families


def test_http_closes_with_the_server(start, affine):
    server = start(affine)
    port = server.http().port
    server.close()
    with socket.socket() as s:
        s.settimeout(2)
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_protocol_round_trip_binary():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    head = json.dumps({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 24}}],
                       "parameters": {"binary_data_output": True}}).encode()
    header, arrays = decode_request(head + x.tobytes(), len(head))
    np.testing.assert_array_equal(arrays["x"], x)
    body, n = encode_response("m", {"y": x * 2}, header)
    meta = json.loads(body[:n])
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == 24
    np.testing.assert_array_equal(np.frombuffer(body[n:], np.float32).reshape(2, 3), x * 2)


def test_a_separate_process_calls_it(endpoint, vae):
    import subprocess
    import sys

    _, ep, _ = endpoint
    code = (
        "import sys, json, numpy as np, tritonclient.http as h\n"
        "c = h.InferenceServerClient(url=sys.argv[1])\n"
        "x = np.arange(12, dtype=np.float32).reshape(2, 6) / 7\n"
        "i = h.InferInput('x', [2, 6], 'FP32'); i.set_data_from_numpy(x)\n"
        "print(json.dumps(c.infer('materials_vae', [i]).as_numpy('recon').tolist()))\n")
    run = subprocess.run([sys.executable, "-c", code, f"127.0.0.1:{ep.port}"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    x = np.arange(12, dtype=np.float32).reshape(2, 6) / 7
    np.testing.assert_allclose(np.array(json.loads(run.stdout)), vae(x)[0], rtol=1e-5,
                               atol=1e-6)
