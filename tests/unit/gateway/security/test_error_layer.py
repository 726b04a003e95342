"""The one error path: layers raise ``KvgateError``s, ``ErrorLayer`` renders them with ``send_error``."""

from __future__ import annotations

import httpx
import orjson
import pytest

from gateway.errors import KvgateError, Overloaded, RateLimited, Unauthorized
from gateway.security.errors import ErrorLayer
from kvgate_core.asgi import Message, Receive, Scope, Send


def _raising(exc: KvgateError, *, after_start: bool = False):
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if after_start:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        raise exc

    return app


def _client(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc", "status", "error_type", "code", "header"),
    [
        (
            Unauthorized("no key"),
            401,
            "invalid_request_error",
            "invalid_api_key",
            ("www-authenticate", "Bearer"),
        ),
        (
            RateLimited("slow down", retry_after_s=7),
            429,
            "rate_limit_error",
            "rate_limit_exceeded",
            ("retry-after", "7"),
        ),
        (Overloaded("full"), 503, "server_error", "overloaded", ("retry-after", "1")),
    ],
)
async def test_raised_errors_are_rendered_in_openai_shape_with_their_headers(
    exc: KvgateError, status: int, error_type: str, code: str, header: tuple[str, str]
) -> None:
    async with _client(ErrorLayer(_raising(exc))) as client:
        resp = await client.post("/v1/chat/completions", content=b"{}")
    assert resp.status_code == status
    assert resp.headers["content-type"] == "application/json"
    assert resp.headers[header[0]] == header[1]
    assert resp.json() == {"error": {"message": exc.message, "type": error_type, "param": None, "code": code}}
    assert int(resp.headers["content-length"]) == len(orjson.dumps(resp.json()))


async def test_an_error_after_the_response_started_is_not_answered_twice() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    app = ErrorLayer(_raising(Overloaded("late"), after_start=True))
    with pytest.raises(Overloaded):
        await app({"type": "http", "path": "/v1/completions", "headers": []}, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start"]


async def test_other_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        return None

    await ErrorLayer(app)({"type": "lifespan"}, receive, send)
    assert seen == ["lifespan"]
