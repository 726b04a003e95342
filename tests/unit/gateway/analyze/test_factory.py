from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.analyze.factory import build_analyzer, resolve_tokenizer
from gateway.analyze.prompt import TokenizingAnalyzer
from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle
from kvgate_core.tokenize.request_prompt import Endpoint, parse_chat
from tests.support.tokenizer import train_tiny_tokenizer

BODY = {"messages": [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}]}


async def _no_sleep(_: float) -> None:
    return None


def _client(handler: httpx.MockTransport) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=handler)


async def test_none_and_bytes() -> None:
    async with httpx.AsyncClient() as client:
        assert await build_analyzer("none", block_size=16, worker_urls=[], client=client) is None
        analyzer = await build_analyzer("bytes", block_size=4, worker_urls=[], client=client)
    assert isinstance(analyzer, TokenizingAnalyzer)
    assert analyzer.block_size == 4
    assert analyzer.analyze({"prompt": "abcdefgh"}, Endpoint.COMPLETIONS, "m").num_tokens == 8


async def test_path(tiny_tokenizer_path: Path, tiny: TokenizerBundle) -> None:
    async with httpx.AsyncClient() as client:
        analyzer = await build_analyzer(
            str(tiny_tokenizer_path), block_size=16, worker_urls=[], client=client
        )
    assert isinstance(analyzer, TokenizingAnalyzer)
    assert analyzer.tokenize(BODY, Endpoint.CHAT) == tiny.encode(parse_chat(BODY))


async def test_bad_path_fails_with_a_message(tmp_path: Path) -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(ValueError, match="no such file"):
            await build_analyzer(str(tmp_path / "x.json"), block_size=16, worker_urls=[], client=client)


async def test_auto_uses_the_first_worker_that_serves_a_tokenizer(tiny: TokenizerBundle) -> None:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        if request.url.host == "down":
            raise httpx.ConnectError("refused", request=request)
        if request.url.host == "broken":
            return httpx.Response(500)
        return httpx.Response(200, content=tiny.to_json())

    async with _client(httpx.MockTransport(handler)) as client:
        analyzer = await build_analyzer(
            "auto",
            block_size=16,
            worker_urls=["http://down:1", "http://broken:2", "http://up:3/#role=prefill"],
            client=client,
            sleep=_no_sleep,
        )
    assert asked == ["http://down:1/tokenizer", "http://broken:2/tokenizer", "http://up:3/tokenizer"]
    assert isinstance(analyzer, TokenizingAnalyzer)
    assert analyzer.tokenize(BODY, Endpoint.CHAT) == tiny.encode(parse_chat(BODY))


async def test_auto_retries_until_a_worker_answers() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise httpx.ConnectError("starting", request=request)
        return httpx.Response(200, content=byte_bundle("sim").to_json())

    async with _client(httpx.MockTransport(handler)) as client:
        analyzer = await build_analyzer(
            "auto", block_size=16, worker_urls=["http://w"], client=client, sleep=_no_sleep
        )
    assert calls == 3
    assert isinstance(analyzer, TokenizingAnalyzer)
    assert analyzer.bundle.model == "sim"


async def test_auto_gives_up_after_the_wait(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="gateway.analyze.factory")
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with _client(httpx.MockTransport(handler)) as client:
        analyzer = await build_analyzer(
            "auto", block_size=16, worker_urls=["http://w"], client=client, auto_wait_s=2.0, sleep=sleep
        )
    assert analyzer is None
    assert sum(slept) == pytest.approx(2.0)
    assert "no worker of ['http://w'] served GET /tokenizer" in caplog.text


@pytest.mark.parametrize(
    "response",
    [httpx.Response(404), httpx.Response(200, content=b'{"format": "something else"}')],
    ids=["not-served", "malformed"],
)
async def test_auto_stops_at_once_when_every_worker_answered_without_a_tokenizer(
    response: httpx.Response,
) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async with _client(httpx.MockTransport(lambda request: response)) as client:
        analyzer = await build_analyzer(
            "auto", block_size=16, worker_urls=["http://w"], client=client, sleep=sleep
        )
    assert analyzer is None
    assert slept == []


async def test_auto_without_workers_returns_none() -> None:
    async with httpx.AsyncClient() as client:
        assert await build_analyzer("auto", block_size=16, worker_urls=[], client=client) is None


async def test_auto_loads_the_model_directory_an_engine_names_in_v1_models(tmp_path: Path) -> None:
    model_dir = tmp_path / "SmolLM2"
    model_dir.mkdir()
    train_tiny_tokenizer(model_dir)
    cards = {"data": [{"id": "smol", "root": str(model_dir), "owned_by": "vllm"}]}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=cards) if request.url.path == "/v1/models" else httpx.Response(404)

    async with _client(httpx.MockTransport(handler)) as client:
        choice = await resolve_tokenizer("auto", worker_urls=["http://w"], client=client)
    assert choice.exact and choice.bundle is not None
    assert choice.bundle.model == "smol"  # named after the served id: what clients send as ``model``
    assert str(model_dir) in choice.source


@pytest.mark.parametrize("root", ["/nonexistent/model", "HuggingFaceTB/SmolLM2-135M-Instruct", None])
async def test_auto_reports_no_exact_tokenizer_when_the_named_model_is_not_readable(root: str | None) -> None:
    card: dict[str, object] = {"id": "smol", "owned_by": "vllm"}
    if root is not None:
        card["root"] = root

    def handler(request: httpx.Request) -> httpx.Response:
        return (
            httpx.Response(200, json={"data": [card]})
            if request.url.path == "/v1/models"
            else httpx.Response(404)
        )

    async with _client(httpx.MockTransport(handler)) as client:
        choice = await resolve_tokenizer("auto", worker_urls=["http://w"], client=client)
    assert choice.bundle is None and not choice.exact
