"""The KServe v2 / Open Inference Protocol's tensors: datatypes, JSON and binary payloads.

Pure functions, no HTTP: :mod:`.http` serves them. An inference request is JSON, or —
the *binary tensor data* extension Triton and KServe clients use — a JSON header of
``Inference-Header-Content-Length`` bytes followed by the raw tensors, each input's
size given by its ``binary_data_size`` parameter. Responses are built the same way:
an output is written in binary when the request asked for it (``binary_data`` on the
output, or ``binary_data_output`` on the request).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .errors import BadRequestError

__all__ = ["DATATYPES", "HEADER_LENGTH", "datatype_of", "decode_request", "dtype_of",
           "encode_response"]

#: The header that carries the JSON part's length in a binary payload.
HEADER_LENGTH = "Inference-Header-Content-Length"

#: v2 datatype -> NumPy dtype (BYTES, strings, is not served by numeric models).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(bool), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}
_NAMES = {v: k for k, v in DATATYPES.items()}


def datatype_of(dtype: Any) -> str:
    """The v2 datatype name of a NumPy dtype (``float32`` -> ``"FP32"``)."""
    dt = np.dtype(dtype)
    if dt not in _NAMES:
        raise BadRequestError(f"dtype {dt.name} has no KServe v2 datatype")
    return _NAMES[dt]


def dtype_of(datatype: str) -> np.dtype:
    """The NumPy dtype of a v2 datatype name (``"FP32"`` -> ``float32``)."""
    if datatype not in DATATYPES:
        raise BadRequestError(f"datatype {datatype!r} is not served; use one of "
                              f"{', '.join(DATATYPES)}")
    return DATATYPES[datatype]


def decode_request(body: bytes, header_length: int | None) -> tuple[dict[str, Any],
                                                                      dict[str, np.ndarray]]:
    """Parse an infer request into its JSON header and its input arrays.

    Parameters
    ----------
    body
        The request body.
    header_length
        The ``Inference-Header-Content-Length`` header's value (``None``: all JSON).

    Returns
    -------
    header, inputs
        The JSON object, and input name -> array (in the order given).

    Raises
    ------
    BadRequestError
        If the body is not valid JSON, a tensor's size, shape or datatype do not agree,
        or binary data is missing.
    """
    if header_length is None:
        head, rest = body, b""
    else:
        if header_length < 0 or header_length > len(body):
            raise BadRequestError(f"{HEADER_LENGTH}={header_length} does not fit a body of "
                                  f"{len(body)} bytes")
        head, rest = body[:header_length], body[header_length:]
    try:
        header = json.loads(head or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"the request is not valid JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise BadRequestError("an infer request is a JSON object with an 'inputs' list")
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for entry in header["inputs"]:
        try:
            name, shape, datatype = entry["name"], entry["shape"], entry["datatype"]
            shape = tuple(int(s) for s in shape)
        except (KeyError, TypeError, ValueError):
            raise BadRequestError("each input needs 'name', 'shape' (a list of integers) "
                                  "and 'datatype'") from None
        dt = dtype_of(datatype)
        size = int(np.prod(shape, dtype=np.int64))
        params = entry.get("parameters") or {}
        if "binary_data_size" in params:
            n = int(params["binary_data_size"])
            if offset + n > len(rest):
                raise BadRequestError(f"input {name!r}: binary_data_size {n} runs past the "
                                      f"body's {len(rest) - offset} remaining bytes")
            if n != size * dt.itemsize:
                raise BadRequestError(f"input {name!r}: {n} bytes do not hold shape {shape} "
                                      f"of {datatype} ({size * dt.itemsize} bytes)")
            arr = np.frombuffer(rest[offset:offset + n], dtype=dt).reshape(shape)
            offset += n
        else:
            if "data" not in entry:
                raise BadRequestError(f"input {name!r} has neither 'data' nor binary data")
            try:
                arr = np.asarray(entry["data"], dtype=dt).reshape(shape)
            except (ValueError, TypeError) as exc:
                raise BadRequestError(f"input {name!r}: its data does not fit shape {shape} "
                                      f"of {datatype} ({exc})") from None
        arrays[name] = arr
    return header, arrays


def encode_response(model_name: str, outputs: dict[str, np.ndarray], request: dict[str, Any],
                    *, model_version: str = "1") -> tuple[bytes, int | None]:
    """The body of an infer response, and the JSON header's length when binary.

    Outputs the request names in ``outputs`` are returned (all when it names none), each
    in binary when asked (the output's ``binary_data`` parameter, else the request's
    ``binary_data_output``), else as JSON data.
    """
    wanted = request.get("outputs") or [{"name": n} for n in outputs]
    default_binary = bool((request.get("parameters") or {}).get("binary_data_output", False))
    entries, blobs = [], []
    for want in wanted:
        name = want.get("name")
        if name not in outputs:
            raise BadRequestError(f"the model has no output {name!r}; it has "
                                  f"{', '.join(outputs)}")
        arr = np.ascontiguousarray(outputs[name])
        binary = bool((want.get("parameters") or {}).get("binary_data", default_binary))
        entry: dict[str, Any] = {"name": name, "datatype": datatype_of(arr.dtype),
                                 "shape": list(arr.shape)}
        if binary:
            data = arr.tobytes()
            entry["parameters"] = {"binary_data_size": len(data)}
            blobs.append(data)
        else:
            entry["data"] = arr.reshape(-1).tolist()
        entries.append(entry)
    out: dict[str, Any] = {"model_name": model_name, "model_version": model_version,
                           "outputs": entries}
    if "id" in request:
        out["id"] = request["id"]
    head = json.dumps(out, separators=(",", ":")).encode()
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)
