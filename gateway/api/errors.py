"""The one place that turns exceptions into OpenAI error responses; tracebacks never reach clients."""

from __future__ import annotations

import logging

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import InvalidRequest, KvgateError, error_body

logger = logging.getLogger(__name__)

_HTTP_CODES = {404: ("not_found_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed")}


class InternalError(KvgateError):
    """An unexpected failure inside the gateway (a bug); the client sees a generic 500."""

    default_code = "internal_error"


def error_response(exc: KvgateError) -> Response:
    """A Starlette response carrying ``exc`` in OpenAI's shape."""
    return Response(
        exc.body(), status_code=exc.status, media_type="application/json", headers=_extra_headers(exc)
    )


def _extra_headers(exc: KvgateError) -> dict[str, str] | None:
    if not exc.headers:
        return None
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in exc.headers}


def unexpected(exc: BaseException) -> KvgateError:
    """Log an unexpected exception with its traceback and return the generic error the client gets."""
    logger.error("unexpected error while handling a request", exc_info=exc)
    return InternalError("the gateway failed unexpectedly; the error was logged")


async def kvgate_error_handler(_request: Request, exc: Exception) -> Response:
    if isinstance(exc, KvgateError):
        return error_response(exc)
    return error_response(unexpected(exc))


async def http_error_handler(_request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    error_type, code = _HTTP_CODES.get(status, ("invalid_request_error", "http_error"))
    detail = exc.detail if isinstance(exc, HTTPException) else "error"
    return Response(
        error_body(str(detail), error_type, code), status_code=status, media_type="application/json"
    )


def invalid_request(exc: RequestValidationError) -> InvalidRequest:
    """FastAPI's validation failure as OpenAI's 400, naming the first offending field in ``param``."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        return InvalidRequest("the request body is not valid JSON")
    field = ".".join(str(part) for part in first.get("loc", ())[1:])  # drop "body" / "query" / "path"
    if not field:
        return InvalidRequest("the request body must be a JSON object")
    return InvalidRequest(f"invalid '{field}': {first.get('msg', 'invalid value')}", param=field)


async def validation_error_handler(_request: Request, exc: Exception) -> Response:
    """Never FastAPI's 422 body: request validation errors get the same 400 as the gateway's own checks."""
    if isinstance(exc, RequestValidationError):
        return error_response(invalid_request(exc))
    return error_response(unexpected(exc))
