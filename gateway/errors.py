"""The gateway's one exception hierarchy; ``gateway.api.errors`` turns each into OpenAI's error body.

::

    KvgateError
    ├── ClientError            4xx: the request is wrong
    │   ├── InvalidRequest         400 invalid_request_error
    │   ├── Unauthorized           401 invalid_api_key (+ www-authenticate)
    │   ├── Forbidden              403 (the control plane refused: admin mode, worker allow-list)
    │   ├── ModelNotFound          404 model_not_found
    │   ├── ResponseNotFound       404 response_not_found (a Responses API id no worker holds)
    │   ├── NotFound               404 (admin resources)
    │   ├── Conflict               409 (admin resources)
    │   ├── BodyTooLarge           413
    │   ├── UnsupportedMediaType   415
    │   ├── ClientGone             499 client_closed_request: the client left before its body was whole
    │   ├── RateLimited            429 rate_limit_exceeded (+ retry-after)
    │   └── ContextTooLong         400 context_length_exceeded
    ├── CapacityError          503: nobody can take it now
    │   ├── NoHealthyWorker        503 no_healthy_worker
    │   └── Overloaded             503 overloaded, the concurrency cap's queue is full (+ retry-after)
    │       └── UpstreamSaturated  503 upstream_saturated, the workers' connection caps and queues are full
    ├── UpstreamError          502/504: the worker failed
    │   ├── WorkerUnavailable      502 worker_unavailable
    │   └── WorkerTimeout          504 worker_timeout
    └── ConfigError            startup only (never reaches a client)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import orjson

from kvgate_core.asgi import Send

Headers = Sequence[tuple[bytes, bytes]]


def error_body(message: str, error_type: str, code: str | None, param: str | None = None) -> bytes:
    """OpenAI's error JSON: ``{"error": {"message", "type", "param", "code"}}``."""
    return orjson.dumps({"error": {"message": message, "type": error_type, "param": param, "code": code}})


class KvgateError(Exception):
    """Base of every gateway error; carries what OpenAI's error body needs."""

    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, headers: Headers = ()
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers = tuple(headers)

    def body(self) -> bytes:
        """The OpenAI-shaped JSON error body."""
        return error_body(self.message, self.error_type, self.code, self.param)

    def response_headers(self, body: bytes) -> list[tuple[bytes, bytes]]:
        """Every header of the error response: content type and length, then the error's own."""
        return [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *self.headers,
        ]


async def send_error(send: Send, exc: KvgateError) -> None:
    """Send ``exc`` as a complete OpenAI error response on a raw ASGI channel (the one renderer)."""
    body = exc.body()
    await send({"type": "http.response.start", "status": exc.status, "headers": exc.response_headers(body)})
    await send({"type": "http.response.body", "body": body})


class ClientError(KvgateError):
    status = 400
    error_type = "invalid_request_error"


class InvalidRequest(ClientError):  # noqa: N818 - OpenAI-style error names
    default_code = "invalid_request"


class ContextTooLong(ClientError):  # noqa: N818 - OpenAI-style error names
    default_code = "context_length_exceeded"


class Unauthorized(ClientError):  # noqa: N818 - OpenAI-style error names
    """No valid API key; the client is told how to present one."""

    status = 401
    default_code = "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers=[(b"www-authenticate", b"Bearer")])


class Forbidden(ClientError):  # noqa: N818 - OpenAI-style error names
    """The caller may not do this here, whatever key it presents (``code`` says why)."""

    status = 403
    default_code = "forbidden"


class RateLimited(ClientError):  # noqa: N818 - OpenAI-style error names
    """The caller's request or token rate is spent; ``retry_after_s`` says when to come back."""

    status = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, headers=[(b"retry-after", str(retry_after_s).encode())])


class ModelNotFound(ClientError):  # noqa: N818 - OpenAI-style error names
    status = 404
    default_code = "model_not_found"


class ResponseNotFound(ClientError):  # noqa: N818 - OpenAI-style error names
    status = 404
    default_code = "response_not_found"


class NotFound(ClientError):  # noqa: N818 - OpenAI-style error names
    status = 404
    error_type = "not_found_error"
    default_code = "not_found"


class Conflict(ClientError):  # noqa: N818 - OpenAI-style error names
    status = 409
    default_code = "conflict"


class BodyTooLarge(ClientError):  # noqa: N818 - OpenAI-style error names
    status = 413
    default_code = "request_too_large"


class UnsupportedMediaType(ClientError):  # noqa: N818 - OpenAI-style error names
    status = 415
    default_code = "unsupported_media_type"


class ClientGone(ClientError):  # noqa: N818 - OpenAI-style names, as its siblings
    """The client disconnected before the framing said its body was complete: the body is void (never taken
    as whole, never forwarded). Nobody reads the answer; 499 is nginx's "client closed request"."""

    status = 499
    default_code = "client_closed_request"


class CapacityError(KvgateError):
    status = 503
    error_type = "service_unavailable_error"


class NoHealthyWorker(CapacityError):  # noqa: N818 - OpenAI-style error names
    default_code = "no_healthy_worker"


class Overloaded(CapacityError):  # noqa: N818 - OpenAI-style error names
    """The gateway's concurrency cap and its queue are full (OpenAI answers overload as ``server_error``)."""

    error_type = "server_error"
    default_code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, headers=[(b"retry-after", str(retry_after_s).encode())])


class UpstreamSaturated(Overloaded):
    """Every worker tried is at its upstream connection cap with a full wait queue, or the wait for a
    connection ran out; nothing was forwarded (503 + ``Retry-After``)."""

    default_code = "upstream_saturated"


class UpstreamError(KvgateError):
    status = 502
    error_type = "upstream_error"


class WorkerUnavailable(UpstreamError):  # noqa: N818 - OpenAI-style error names
    default_code = "worker_unavailable"


class WorkerTimeout(UpstreamError):  # noqa: N818 - OpenAI-style error names
    status = 504
    default_code = "worker_timeout"


class ConfigError(KvgateError):
    """A startup misconfiguration; the message says what to change."""

    default_code = "config_error"
