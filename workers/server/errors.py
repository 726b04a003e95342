"""OpenAI-shaped error responses for the worker server; the only place that formats them."""

from __future__ import annotations

import orjson
from starlette.responses import Response

from workers.engine_api import ContextTooLongError, EngineError, EngineOverloadedError, InvalidRequestError


class ApiError(Exception):
    """An error to answer with OpenAI's ``{"error": {message, type, param, code}}`` shape."""

    def __init__(
        self, status: int, message: str, *, type_: str = "invalid_request_error", param: str | None = None,
        code: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def response(self) -> Response:
        return error_response(self.status, self.message, type_=self.type, param=self.param, code=self.code)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def error_body(message: str, *, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def error_response(
    status: int, message: str, *, type_: str = "invalid_request_error", param: str | None = None,
    code: str | None = None,
) -> Response:  # fmt: skip
    return Response(
        error_body(message, type_=type_, param=param, code=code), status, media_type="application/json"
    )


def from_engine_error(exc: EngineError) -> ApiError:
    """Map an engine's error to the HTTP error a client sees."""
    if isinstance(exc, ContextTooLongError):
        return ApiError(400, str(exc), param=exc.param, code="context_length_exceeded")
    if isinstance(exc, InvalidRequestError):
        return ApiError(400, str(exc), param=exc.param)
    if isinstance(exc, EngineOverloadedError):
        return ApiError(503, str(exc), type_="overloaded_error", code="overloaded")
    return ApiError(500, "the engine failed on this request", type_="internal_error")
