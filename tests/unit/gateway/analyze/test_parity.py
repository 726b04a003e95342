from __future__ import annotations

import httpx
import orjson

from gateway.analyze.parity import DEFAULT_PROBES, ParityProbe, check_parity
from gateway.analyze.prompt import TokenizingAnalyzer
from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle
from kvgate_core.tokenize.request_prompt import Endpoint, parse_prompt


def _worker(bundle: TokenizerBundle, *, status: int = 200) -> httpx.MockTransport:
    """A fake worker ``POST /tokenize`` that tokenizes with ``bundle``."""

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "POST"
        assert request.url.path == "/tokenize"
        body = orjson.loads(request.content)
        endpoint = Endpoint.CHAT if "messages" in body else Endpoint.COMPLETIONS
        tokens = bundle.encode(parse_prompt(body, endpoint))
        return httpx.Response(status, json={"tokens": tokens, "count": len(tokens)})

    return httpx.MockTransport(handler)


async def test_same_tokenizer_passes(tiny: TokenizerBundle) -> None:
    async with httpx.AsyncClient(transport=_worker(tiny)) as client:
        report = await check_parity(TokenizingAnalyzer(tiny), "http://w:1#role=both", client)
    assert report.ok
    assert len(report.results) == len(DEFAULT_PROBES)
    assert report.summary() == f"http://w:1#role=both: tokenizer parity ok ({len(DEFAULT_PROBES)} probes)"


async def test_different_tokenizer_is_reported_with_the_first_difference(tiny: TokenizerBundle) -> None:
    async with httpx.AsyncClient(transport=_worker(byte_bundle())) as client:
        report = await check_parity(tiny, "http://w", client)
    assert not report.ok
    assert len(report.mismatches) == len(DEFAULT_PROBES)
    assert not report.errors
    assert all(r.first_difference is not None for r in report.mismatches)
    assert "FAILED" in report.summary()
    assert "differs at token" in report.summary()


async def test_different_template_is_a_mismatch() -> None:
    from kvgate_core.tokenize.chat_template import ChatTemplate

    local = byte_bundle()
    remote = TokenizerBundle(
        "m", local.tokenizer, ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    )
    async with httpx.AsyncClient(transport=_worker(remote)) as client:
        report = await check_parity(local, "http://w", client)
    assert {r.probe for r in report.mismatches} == {"chat", "multi_turn", "tools"}  # text prompts still agree


async def test_worker_errors_are_errors_not_mismatches() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if b"prompt" in request.content:
            return httpx.Response(200, json={"count": 3})
        raise httpx.ConnectError("refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        report = await check_parity(byte_bundle(), "http://w", client)
    assert not report.ok
    assert not report.mismatches
    assert {r.error.split(" ")[1] for r in report.errors if r.error} >= {"/tokenize"}
    assert any("without a 'tokens' array" in (r.error or "") for r in report.errors)


async def test_http_status_and_custom_probes() -> None:
    probe = ParityProbe("p", Endpoint.COMPLETIONS, {"prompt": "abc"})
    async with httpx.AsyncClient(transport=_worker(byte_bundle(), status=404)) as client:
        report = await check_parity(byte_bundle(), "http://w", client, probes=[probe])
    assert [r.error for r in report.results] == ["POST /tokenize answered 404"]


async def test_length_mismatch_reports_the_shorter_length() -> None:
    from gateway.analyze.parity import ProbeResult

    assert ProbeResult("p", (1, 2, 3), (1, 2)).first_difference == 2
    assert ProbeResult("p", (1, 2), (1, 2)).first_difference is None
