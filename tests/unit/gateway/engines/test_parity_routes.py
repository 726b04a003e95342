"""The parity probe per engine: ``/tokenize`` (kvgate, vLLM), ``/v1/tokenize`` (SGLang), ``/chat_tokenize``
(TGI, chat probes only), none (TensorRT-LLM, LMDeploy, MII, generic servers)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from gateway.analyze.parity import DEFAULT_PROBES, ParityProbe, ParityTarget, check_parity
from gateway.analyze.prompt import TokenizingAnalyzer
from gateway.engines.profiles import EngineKind
from gateway.fleet.registry import Fleet
from gateway.routing.parity_gate import parity_reports, parity_targets, refuse_precise, reports_json
from gateway.settings import BreakerSettings, parse_worker
from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle
from kvgate_core.tokenize.request_prompt import Endpoint, parse_prompt
from tests.unit.gateway.engines.answers import VLLM_FIXTURES

CHAT_PROBES = {p.name for p in DEFAULT_PROBES if p.endpoint is Endpoint.CHAT}
TEXT_PROBES = {p.name for p in DEFAULT_PROBES if p.endpoint is Endpoint.COMPLETIONS}


@pytest.mark.parametrize(
    ("kind", "route"),
    [
        (EngineKind.AUTO, "tokenize"),
        (EngineKind.KVGATE, "tokenize"),
        (EngineKind.VLLM, "tokenize"),
        (EngineKind.SGLANG, "v1_tokenize"),
        (EngineKind.TGI, "chat_tokenize"),
        (EngineKind.TRTLLM, "none"),
        (EngineKind.LMDEPLOY, "none"),
        (EngineKind.MII, "none"),
        (EngineKind.OPENAI, "none"),
    ],
)
def test_each_engine_gets_its_probe_route(kind: EngineKind, route: str) -> None:
    assert ParityTarget.of("http://w", kind) == ParityTarget("http://w", route, str(kind))  # type: ignore[arg-type]


def _engine(bundle: TokenizerBundle, seen: list[tuple[str, dict[str, Any]]]) -> httpx.MockTransport:
    """SGLang's /v1/tokenize and TGI's /chat_tokenize, tokenizing with ``bundle``."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = orjson.loads(request.content)
        seen.append((request.url.path, body))
        endpoint = Endpoint.CHAT if "messages" in body else Endpoint.COMPLETIONS
        ids = bundle.encode(parse_prompt(body, endpoint))
        if request.url.path == "/v1/tokenize":
            return httpx.Response(200, json={"tokens": ids, "count": len(ids), "max_model_len": 4096})
        if request.url.path == "/chat_tokenize":
            tokens = [{"id": t, "text": "", "start": 0, "stop": 0} for t in ids]
            return httpx.Response(200, json={"tokenize_response": tokens, "templated_text": "…"})
        return httpx.Response(404, json={"detail": "Not Found"})

    return httpx.MockTransport(handler)


async def test_sglang_is_probed_on_v1_tokenize(tiny: TokenizerBundle) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    async with httpx.AsyncClient(transport=_engine(tiny, seen)) as client:
        report = await check_parity(tiny, "http://w", client, route="v1_tokenize", engine="sglang")
    assert report.ok and len(report.results) == len(DEFAULT_PROBES)
    assert {path for path, _ in seen} == {"/v1/tokenize"}


async def test_tgi_is_probed_with_a_chat_request_and_skips_text_probes(tiny: TokenizerBundle) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    async with httpx.AsyncClient(transport=_engine(tiny, seen)) as client:
        report = await check_parity(tiny, "http://w", client, route="chat_tokenize", engine="tgi")
    assert report.ok
    assert {path for path, _ in seen} == {"/chat_tokenize"}
    assert all(body["model"] == "tgi" and "messages" in body for _, body in seen)
    assert {r.probe for r in report.results if r.skipped} == TEXT_PROBES
    assert {r.probe for r in report.results if r.skipped is None} == CHAT_PROBES
    assert (
        report.summary()
        == f"http://w: tokenizer parity ok ({len(CHAT_PROBES)} probes, {len(TEXT_PROBES)} skipped)"
    )


async def test_a_tgi_template_mismatch_is_caught(tiny: TokenizerBundle) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    async with httpx.AsyncClient(transport=_engine(byte_bundle(), seen)) as client:
        report = await check_parity(tiny, "http://w", client, route="chat_tokenize", engine="tgi")
    assert {r.probe for r in report.mismatches} == CHAT_PROBES


async def test_an_engine_without_a_probe_is_reported_not_a_mismatch() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"no request expected, got {request.url}")

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        report = await check_parity(byte_bundle(), "http://w", client, route="none", engine="mii")
    assert report.skipped == "no probe for mii"
    assert not report.ok and not report.mismatches
    assert report.summary() == "http://w: tokenizer parity not checked (no probe for mii)"
    assert not refuse_precise([report])
    assert reports_json([report]) == [
        {
            "worker": "http://w",
            "ok": False,
            "mismatches": [],
            "errors": [{"probe": "*", "error": "no probe for mii"}],
            "skipped": "no probe for mii",
            "skipped_probes": [],
        }
    ]


async def test_the_gate_takes_each_workers_route_from_its_facts(tiny: TokenizerBundle) -> None:
    fleet = Fleet(breaker=BreakerSettings(), clock=lambda: 0.0)
    for raw in ("http://s:1#id=s&engine=sglang", "http://t:1#id=t&engine=tgi", "http://m:1#id=m&engine=mii"):
        fleet.add(parse_worker(raw))
    targets = parity_targets(fleet)
    assert [(t.url, t.route, t.engine) for t in targets] == [
        ("http://s:1", "v1_tokenize", "sglang"),
        ("http://t:1", "chat_tokenize", "tgi"),
        ("http://m:1", "none", "mii"),
    ]
    seen: list[tuple[str, dict[str, Any]]] = []
    async with httpx.AsyncClient(transport=_engine(tiny, seen)) as client:
        reports = await parity_reports(TokenizingAnalyzer(tiny), targets, client)
    assert [r.ok for r in reports] == [True, True, False]
    assert reports[2].skipped == "no probe for mii"


async def test_bare_urls_still_probe_tokenize(tiny: TokenizerBundle) -> None:
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        body = orjson.loads(request.content)
        ids = tiny.encode(parse_prompt(body, Endpoint.CHAT if "messages" in body else Endpoint.COMPLETIONS))
        return httpx.Response(200, json={"tokens": ids})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        reports = await parity_reports(TokenizingAnalyzer(tiny), ["http://w:1"], client)
    assert reports[0].ok and set(paths) == {"/tokenize"}


async def test_real_vllm_0_32_tokenize_answers_match_smollm2(smollm2: TokenizerBundle) -> None:
    recorded = {
        "messages": orjson.loads((VLLM_FIXTURES / "tokenize_chat_response.json").read_bytes()),
        "prompt": orjson.loads((VLLM_FIXTURES / "tokenize_prompt_response.json").read_bytes()),
    }

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/tokenize"
        body = orjson.loads(request.content)
        return httpx.Response(200, json=recorded["messages" if "messages" in body else "prompt"])

    chat = orjson.loads((VLLM_FIXTURES / "tokenize_chat_request.json").read_bytes())
    text = orjson.loads((VLLM_FIXTURES / "tokenize_prompt_request.json").read_bytes())
    probes = [
        ParityProbe("chat", Endpoint.CHAT, {"messages": chat["messages"]}),
        ParityProbe("text", Endpoint.COMPLETIONS, {"prompt": text["prompt"]}),
    ]
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        report = await check_parity(
            smollm2, "http://vllm:8000", client, probes, route="tokenize", engine="vllm"
        )
    assert report.ok, report.summary()
