"""Every bad input gets OpenAI's error shape and the right status; nothing reaches a worker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.unit.gateway.fake_worker import FakeWorker, running
from tests.unit.gateway.gateway_harness import serving, settings_for

MSG = [{"role": "user", "content": "hi"}]
JSON = {"content-type": "application/json"}

CASES = [
    ("malformed_json", "/v1/chat/completions", b"{not json", JSON, 400, None),
    ("not_an_object", "/v1/chat/completions", b"[1,2]", JSON, 400, None),
    (
        "missing_model",
        "/v1/chat/completions",
        b'{"messages":[{"role":"user","content":"x"}]}',
        JSON,
        400,
        "model",
    ),
    ("model_wrong_type", "/v1/chat/completions", b'{"model":5,"messages":[]}', JSON, 400, "model"),
    ("missing_messages", "/v1/chat/completions", b'{"model":"fake-model"}', JSON, 400, "messages"),
    (
        "empty_messages",
        "/v1/chat/completions",
        b'{"model":"fake-model","messages":[]}',
        JSON,
        400,
        "messages",
    ),
    (
        "message_not_object",
        "/v1/chat/completions",
        b'{"model":"fake-model","messages":["x"]}',
        JSON,
        400,
        "messages[0]",
    ),
    ("missing_prompt", "/v1/completions", b'{"model":"fake-model"}', JSON, 400, "prompt"),
    ("prompt_wrong_type", "/v1/completions", b'{"model":"fake-model","prompt":{"a":1}}', JSON, 400, "prompt"),
    (
        "negative_max_tokens",
        "/v1/chat/completions",
        b'{"model":"fake-model","messages":[{"role":"user","content":"x"}],"max_tokens":-1}',
        JSON,
        400,
        "max_tokens",
    ),
    (
        "absurd_max_tokens",
        "/v1/chat/completions",
        b'{"model":"fake-model","messages":[{"role":"user","content":"x"}],"max_tokens":100000000000}',
        JSON,
        400,
        "max_tokens",
    ),
    (
        "max_tokens_string",
        "/v1/chat/completions",
        b'{"model":"fake-model","messages":[{"role":"user","content":"x"}],"max_tokens":"5"}',
        JSON,
        400,
        "max_tokens",
    ),
    (
        "stream_not_bool",
        "/v1/chat/completions",
        b'{"model":"fake-model","messages":[{"role":"user","content":"x"}],"stream":"yes"}',
        JSON,
        400,
        "stream",
    ),
    (
        "temperature_string",
        "/v1/chat/completions",
        b'{"model":"fake-model","messages":[{"role":"user","content":"x"}],"temperature":"hot"}',
        JSON,
        400,
        "temperature",
    ),
    (
        "too_large",
        "/v1/chat/completions",
        b'{"model":"fake-model","pad":"' + b"x" * 5000 + b'"}',
        JSON,
        413,
        None,
    ),
    ("wrong_content_type", "/v1/chat/completions", b"model=x", {"content-type": "text/plain"}, 415, None),
    (
        "unknown_model",
        "/v1/chat/completions",
        b'{"model":"nope","messages":[{"role":"user","content":"x"}]}',
        JSON,
        404,
        "model",
    ),
]


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[str, FakeWorker]]:
    async with (
        running(FakeWorker("a")) as (worker,),
        serving(settings_for(worker.url, max_body_bytes=4096)) as base,
    ):
        yield base, worker


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_bad_input_gets_openai_error(
    gateway: tuple[str, FakeWorker],
    path: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    param: str | None,
) -> None:
    base, worker = gateway
    async with httpx.AsyncClient() as client:
        resp = await client.post(base + path, content=body, headers=headers)
    assert resp.status_code == status
    assert resp.headers["content-type"] == "application/json"
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert isinstance(error["message"], str) and error["message"]
    assert worker.bodies == []


async def test_chunked_body_over_limit_is_413(gateway: tuple[str, FakeWorker]) -> None:
    base, _ = gateway

    async def parts() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 1000

    async with httpx.AsyncClient() as client:
        resp = await client.post(f"{base}/v1/chat/completions", content=parts(), headers=JSON)
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "request_too_large"


async def test_unknown_path_and_method_use_openai_shape(gateway: tuple[str, FakeWorker]) -> None:
    base, _ = gateway
    async with httpx.AsyncClient() as client:
        missing = await client.get(f"{base}/v1/nothing")
        wrong_method = await client.get(f"{base}/v1/chat/completions")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    "prompt", ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]], ids=["str", "strs", "ids", "idss"]
)
async def test_completion_prompt_forms_are_accepted(gateway: tuple[str, FakeWorker], prompt: object) -> None:
    base, worker = gateway
    async with httpx.AsyncClient() as client:
        resp = await client.post(f"{base}/v1/completions", json={"model": "fake-model", "prompt": prompt})
    assert resp.status_code == 200
    assert worker.bodies[-1]["prompt"] == prompt
