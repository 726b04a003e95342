"""The FastAPI control plane answers like the Starlette routes it replaced: OpenAI's error shape, never 422."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from fastapi.exceptions import RequestValidationError

from gateway.api.errors import invalid_request
from tests.unit.gateway.fake_worker import FakeWorker, running
from tests.unit.gateway.gateway_harness import serving, settings_for

JSON = {"content-type": "application/json"}

BAD_BODIES = [
    ("not_json", b"{x", 400, None),
    ("empty", b"", 400, None),
    ("not_an_object", b"[1]", 400, None),
    ("missing_url", b'{"role":"both"}', 400, "url"),
    ("url_not_a_string", b'{"url":5}', 400, "url"),
    ("role_not_a_string", b'{"url":"http://127.0.0.1:9","role":3}', 400, "role"),
    ("role_null", b'{"url":"http://127.0.0.1:9","role":null}', 400, "role"),
    ("id_not_a_string", b'{"url":"http://127.0.0.1:9","id":3}', 400, "id"),
    ("id_not_header_safe", b'{"url":"http://127.0.0.1:9","id":"a\\u0001"}', 400, "id"),
    ("unknown_role", b'{"url":"http://127.0.0.1:9","role":"chef"}', 400, "url"),
    ("not_a_worker_url", b'{"url":"not a url"}', 400, "url"),
    ("too_large", b'{"url":"' + b"x" * 5000 + b'"}', 413, None),
]


@pytest.fixture
async def gateway() -> AsyncIterator[str]:
    async with (
        running(FakeWorker("a")) as (worker,),
        serving(settings_for(worker.url, max_body_bytes=4096)) as base,
    ):
        yield base


@pytest.mark.parametrize(
    ("body", "status", "param"), [c[1:] for c in BAD_BODIES], ids=[c[0] for c in BAD_BODIES]
)
async def test_a_bad_admin_body_gets_openai_error_shape(
    gateway: str, body: bytes, status: int, param: str | None
) -> None:
    async with httpx.AsyncClient() as client:
        resp = await client.post(f"{gateway}/admin/workers", content=body, headers=JSON)
        workers = (await client.get(f"{gateway}/admin/workers")).json()["workers"]
    assert resp.status_code == status
    assert resp.headers["content-type"] == "application/json"
    error = resp.json()["error"]
    assert set(resp.json()) == {"error"}
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert isinstance(error["message"], str) and error["message"]
    assert len(workers) == 1


async def test_any_content_type_carries_a_json_admin_body(gateway: str) -> None:
    """``curl -d`` sends form-encoded; the admin API always read the body as JSON regardless."""
    worker = FakeWorker("b")
    body = orjson.dumps({"url": worker.url, "id": "b"})
    async with running(worker), httpx.AsyncClient() as client:
        form = await client.post(
            f"{gateway}/admin/workers", content=body, headers={"content-type": "text/plain"}
        )
    assert form.status_code == 201
    assert form.json()["id"] == "b" and form.json()["healthy"] is True


async def test_head_answers_like_get(gateway: str) -> None:
    async with httpx.AsyncClient() as client:
        head = await client.head(f"{gateway}/health")
        get = await client.get(f"{gateway}/health")
    assert head.status_code == get.status_code == 200
    assert head.headers["content-length"] == get.headers["content-length"]


@pytest.mark.parametrize(
    ("error", "message", "param"),
    [
        ({"type": "json_invalid", "loc": ("body", 3), "msg": "JSON decode error"}, "not valid JSON", None),
        ({"type": "model_attributes_type", "loc": ("body",), "msg": "x"}, "must be a JSON object", None),
        (
            {"type": "missing", "loc": ("body", "url"), "msg": "Field required"},
            "'url': Field required",
            "url",
        ),
        ({"type": "int_type", "loc": ("query", "n", 0), "msg": "bad"}, "'n.0': bad", "n.0"),
    ],
)
def test_validation_errors_map_to_invalid_request(
    error: dict[str, Any], message: str, param: str | None
) -> None:
    exc = invalid_request(RequestValidationError([error]))
    assert exc.status == 400 and exc.code == "invalid_request"
    assert message in exc.message
    assert exc.param == param
