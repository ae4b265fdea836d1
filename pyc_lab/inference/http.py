"""The KServe v2 / Open Inference Protocol over HTTP, for other processes.

Built on Starlette (the ASGI application) and uvicorn (the HTTP server, run in a
background thread with its own event loop), so Triton's and KServe's clients work
unchanged (``tritonclient.http`` is what the tests use). Endpoints:

==========================================  ============================================
``GET  /v2/health/live``, ``/v2/health/ready``  200 while the server runs
``GET  /v2``                                 server metadata (name, version, extensions)
``GET  /v2/models/{m}[/versions/{v}]``       model metadata (inputs, outputs: v2 types)
``GET  /v2/models/{m}[/versions/{v}]/ready`` 200 when the model is served
``POST /v2/models/{m}[/versions/{v}]/infer`` inference, JSON or binary tensors
``GET  /metrics``                            Prometheus text (counters, histograms)
==========================================  ============================================

Errors answer ``{"error": "..."}``: 400 for a bad request, 404 for an unknown model,
503 when the queue is full or the server is closing, 504 on a timeout, 500 when the model
failed.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
import zlib
from typing import Any

from .._version import __version__
from .errors import (
    BadRequestError,
    InferenceError,
    QueueFullError,
    RequestTimeoutError,
    ServerClosedError,
)
from .protocol import HEADER_LENGTH, decode_request, encode_response
from .stats import LATENCY_BUCKETS_S

__all__ = ["HttpEndpoint", "build_app", "metrics_text"]

log = logging.getLogger(__name__)

#: KServe v2 extensions this endpoint speaks.
EXTENSIONS = ["binary_tensor_data", "statistics"]


def _require() -> tuple[Any, Any]:
    try:
        import starlette
        import uvicorn
    except ImportError:
        raise InferenceError("the HTTP endpoint needs starlette and uvicorn: pip install "
                             "'pyc-lab[serve]'") from None
    return starlette, uvicorn


def metrics_text(server: Any) -> bytes:
    """The server's metrics in Prometheus' text format (through prometheus_client)."""
    try:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )
    except ImportError:
        raise InferenceError("metrics need prometheus_client: pip install "
                             "'pyc-lab[serve]'") from None

    class Collector:
        def collect(self) -> Any:
            ok = CounterMetricFamily("pyc_lab_inference_request_success",
                                     "Requests that returned outputs", labels=["model"])
            bad = CounterMetricFamily("pyc_lab_inference_request_failure",
                                      "Requests that did not", labels=["model", "reason"])
            batches = CounterMetricFamily("pyc_lab_inference_batches",
                                          "Batches the model ran", labels=["model"])
            rows = CounterMetricFamily("pyc_lab_inference_rows", "Rows the model ran "
                                       "(before padding)", labels=["model"])
            queued = GaugeMetricFamily("pyc_lab_inference_queue_size", "Requests waiting",
                                       labels=["model"])
            lat = HistogramMetricFamily("pyc_lab_inference_request_duration_seconds",
                                        "Submit to result, per request", labels=["model"])
            bsize = HistogramMetricFamily("pyc_lab_inference_batch_size",
                                          "Rows per batch", labels=["model"])
            for name in server.models:
                st = server.stats(name)
                snap = st.snapshot()
                ok.add_metric([name], snap["requests"] - snap["failed"])
                for reason in ("failed", "rejected", "timed_out"):
                    bad.add_metric([name, reason], snap[reason])
                batches.add_metric([name], snap["batches"])
                rows.add_metric([name], snap["rows"])
                queued.add_metric([name], server._batcher(name).queued)
                counts = st.latency_buckets.cumsum()
                lat.add_metric([name], [
                    ("+Inf" if b == float("inf") else repr(b), int(c))
                    for b, c in zip(LATENCY_BUCKETS_S, counts, strict=True)],
                    sum_value=st.latency_sum)
                sizes = st.batch_sizes
                cum = sizes.cumsum()
                edges = list(server.options.bucket_sizes) or [server.options.max_batch]
                buckets = [(str(e), int(cum[min(e, len(cum) - 1)])) for e in edges]
                buckets.append(("+Inf", int(cum[-1])))
                bsize.add_metric([name], buckets,
                                 sum_value=float((sizes * range(len(sizes))).sum()))
            yield from (ok, bad, batches, rows, queued, lat, bsize)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return generate_latest(registry)


def build_app(server: Any) -> Any:
    """The Starlette application serving ``server`` over the v2 protocol."""
    _require()
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def error(status: int, text: str) -> JSONResponse:
        return JSONResponse({"error": text}, status_code=status)

    def model_of(request: Request) -> Any:
        name = request.path_params["model"]
        return server.models.get(name), name

    async def live(request: Request) -> Response:
        return Response(status_code=200 if not server.closed else 503)

    async def meta(request: Request) -> Response:
        return JSONResponse({"name": "pyc_lab", "version": __version__,
                             "extensions": EXTENSIONS})

    async def model_meta(request: Request) -> Response:
        model, name = model_of(request)
        if model is None:
            return error(404, f"no model {name!r}; served: {', '.join(server.models)}")
        return JSONResponse({"name": name, "versions": ["1"], "platform": f"pyc_lab_"
                             f"{model.source}", "inputs": [s.to_v2() for s in model.inputs],
                             "outputs": [s.to_v2() for s in model.outputs]})

    async def model_ready(request: Request) -> Response:
        model, _name = model_of(request)
        ok = model is not None and not server.closed
        return Response(status_code=200 if ok else (404 if model is None else 503))

    async def model_stats(request: Request) -> Response:
        out = []
        for name in server.models:
            snap = server.stats(name).snapshot()
            out.append({"name": name, "version": "1", **snap})
        return JSONResponse({"model_stats": out})

    async def infer(request: Request) -> Response:
        model, name = model_of(request)
        if model is None:
            return error(404, f"no model {name!r}; served: {', '.join(server.models)}")
        body = await request.body()
        encoding = request.headers.get("content-encoding", "").lower()
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            length = request.headers.get(HEADER_LENGTH)
            header, arrays = decode_request(body, int(length) if length else None)
            outputs = await server.predict_async(arrays, model=name)
            payload, head_len = encode_response(name, outputs, header)
        except BadRequestError as exc:
            return error(400, str(exc))
        except (QueueFullError, ServerClosedError) as exc:
            return error(503, str(exc))
        except RequestTimeoutError as exc:
            return error(504, str(exc))
        except InferenceError as exc:
            return error(500, str(exc))
        except (ValueError, OSError, zlib.error) as exc:
            return error(400, f"cannot read the request: {exc}")
        if head_len is None:
            return Response(payload, media_type="application/json")
        return Response(payload, media_type="application/octet-stream",
                        headers={HEADER_LENGTH: str(head_len)})

    async def metrics(request: Request) -> Response:
        return Response(metrics_text(server),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    routes = [
        Route("/v2/health/live", live),
        Route("/v2/health/ready", live),
        Route("/v2", meta),
        Route("/v2/models/stats", model_stats),
        Route("/v2/models/{model}", model_meta),
        Route("/v2/models/{model}/versions/{version}", model_meta),
        Route("/v2/models/{model}/ready", model_ready),
        Route("/v2/models/{model}/versions/{version}/ready", model_ready),
        Route("/v2/models/{model}/infer", infer, methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/infer", infer, methods=["POST"]),
        Route("/metrics", metrics),
    ]
    return Starlette(routes=routes)


class HttpEndpoint:
    """uvicorn serving :func:`build_app` in a background thread; made by ``server.http()``.

    Attributes
    ----------
    host, port
        Where it listens (``port`` is the real one when 0 was asked for).
    url
        ``http://host:port``.
    """

    def __init__(self, server: Any, *, host: str = "127.0.0.1", port: int = 0,
                 start_timeout_s: float = 10.0) -> None:
        _, uvicorn = _require()
        config = uvicorn.Config(build_app(server), host=host, port=int(port),
                                log_level="warning", log_config=None, access_log=False,
                                lifespan="off")
        self._uv = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uv.run, name=f"pyc-lab-http-{server.name}",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._uv.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._uv.should_exit = True
                raise InferenceError(f"the HTTP endpoint did not start on {host}:{port} (is "
                                     "the port taken? pass port=0 for a free one)")
            time.sleep(0.01)
        self.host = host
        self.port = int(self._uv.servers[0].sockets[0].getsockname()[1])
        self.url = f"http://{host}:{self.port}"
        log.debug("KServe v2 endpoint of %s at %s", server.name, self.url)

    @property
    def running(self) -> bool:
        """Whether the HTTP thread runs."""
        return self._thread.is_alive()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving HTTP (the models keep running until the server closes)."""
        self._uv.should_exit = True
        self._thread.join(timeout_s)

    def __repr__(self) -> str:
        return f"HttpEndpoint({self.url}, KServe v2)"
