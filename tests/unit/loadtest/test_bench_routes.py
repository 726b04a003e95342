"""``loadtest.bench_routes`` compares like with like: both bodies render the same prompt, both mocks answer."""

from __future__ import annotations

from gateway.analyze.prefix_cache import PrefixTokenCache
from gateway.analyze.prompt import TokenizingAnalyzer
from gateway.openai.responses_sse import StreamWatch
from gateway.openai.schema import Framing
from kvgate_core.tokenize.bundle import byte_bundle
from kvgate_core.tokenize.request_prompt import Endpoint
from loadtest.bench_routes import BODIES, _answer, _request


def test_the_chat_and_responses_bodies_render_the_same_prompt() -> None:
    analyzer = TokenizingAnalyzer(byte_bundle(), block_size=64, cache=PrefixTokenCache(0))
    chat = analyzer.analyze(BODIES["chat"], Endpoint.CHAT, "mock")
    responses = analyzer.analyze(BODIES["responses"], Endpoint.RESPONSES, "mock")
    assert chat == responses and chat.num_tokens > 1000


def test_the_mock_answers_each_route_in_its_own_format() -> None:
    assert b'"object":"chat.completion"' in _answer(b"/v1/chat/completions", b"{}")
    assert b"data: [DONE]" in _answer(b"/v1/chat/completions", b'{"stream":true}')
    stream = _answer(b"/v1/responses", b'{"stream":true}')
    watch = StreamWatch(Framing.RESPONSES)
    watch.feed(stream.split(b"\r\n\r\n", 1)[1])
    assert watch.response_id == "resp_bench" and watch.ended
    assert _request("responses", True).startswith(b"POST /v1/responses HTTP/1.1\r\n")
