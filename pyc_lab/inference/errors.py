"""Errors of the inference layer: each says what was wrong and what to do."""

from __future__ import annotations

from ..errors import PycLabError

__all__ = [
    "BadRequestError",
    "InferenceError",
    "ModelImportError",
    "QueueFullError",
    "RequestTimeoutError",
    "ServerClosedError",
    "UnsupportedOpError",
]


class InferenceError(PycLabError):
    """Base of the inference layer's errors (and what a failed model run raises)."""


class ModelImportError(InferenceError):
    """An ONNX model could not be read or imported (not the op support: see below)."""


class UnsupportedOpError(ModelImportError):
    """An ONNX node uses an op (or an attribute of one) the importer has no mapping for."""


class BadRequestError(InferenceError):
    """A request's inputs do not fit the model (names, shape, dtype, NaN policy)."""


class QueueFullError(InferenceError):
    """The server's queue holds ``max_queue`` requests already."""


class RequestTimeoutError(InferenceError):
    """A request waited longer than its timeout before it could run."""


class ServerClosedError(InferenceError):
    """The server was closed (or is closing) and takes no new request."""
