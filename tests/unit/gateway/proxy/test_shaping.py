"""Per-engine request shaping (``gateway.proxy.shaping.shape``): a pure function of body, bytes and facts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from gateway.engines.profiles import PROFILES, EngineFacts, EngineKind
from gateway.openai.schema import ParsedRequest, parse_request
from gateway.proxy.shaping import Shaped, shape
from kvgate_core.tokenize.request_prompt import Endpoint

CHAT: dict[str, Any] = {"model": "client-name", "messages": [{"role": "user", "content": "hi"}]}
INJECTING = [EngineKind.VLLM, EngineKind.SGLANG, EngineKind.TRTLLM, EngineKind.TGI, EngineKind.LMDEPLOY]


def _shape(
    body: dict[str, Any], kind: EngineKind, *, served: str | None = None, want_usage: bool = True
) -> tuple[bytes, ParsedRequest, Shaped]:
    raw = orjson.dumps(body)
    parsed = parse_request(raw, Endpoint.CHAT, max_tokens_limit=4096)
    shaped = shape(parsed, raw, EngineFacts(kind=kind, served_model=served), want_usage=want_usage)
    return raw, parsed, Shaped(raw) if shaped is None else shaped


@pytest.mark.parametrize("kind", INJECTING)
def test_a_stream_gets_include_usage_and_keeps_the_other_stream_options(kind: EngineKind) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": False, "x_other": 3}, "seed": 7}
    _, parsed, shaped = _shape(body, kind)
    sent = orjson.loads(shaped.body)
    assert sent == {**body, "stream_options": {"include_usage": True, "x_other": 3}}
    assert list(sent) == list(body)  # key order kept
    assert shaped.strip_usage_chunk
    assert parsed.body["stream_options"] == {
        "include_usage": False,
        "x_other": 3,
    }  # the parsed body is untouched


def test_a_stream_without_stream_options_gets_them() -> None:
    _, _, shaped = _shape({**CHAT, "stream": True}, EngineKind.VLLM)
    assert orjson.loads(shaped.body)["stream_options"] == {"include_usage": True}
    assert shaped.strip_usage_chunk


def test_continuous_usage_stats_is_dropped_with_the_injection() -> None:
    """It only acts with include_usage, which the client did not ask for: usage would land on every chunk."""
    body = {**CHAT, "stream": True, "stream_options": {"continuous_usage_stats": True}}
    _, _, shaped = _shape(body, EngineKind.VLLM)
    assert orjson.loads(shaped.body)["stream_options"] == {"include_usage": True}


def test_no_injection_when_the_client_asked_for_usage() -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    raw, _, shaped = _shape(body, EngineKind.VLLM)
    assert shaped.body is raw
    assert not shaped.strip_usage_chunk


@pytest.mark.parametrize("kind", [EngineKind.KVGATE, EngineKind.AUTO])
@pytest.mark.parametrize("body", [CHAT, {**CHAT, "stream": True}])
def test_kvgate_and_undetected_workers_get_the_clients_bytes_untouched(
    kind: EngineKind, body: dict[str, Any]
) -> None:
    raw = orjson.dumps(body)
    parsed = parse_request(raw, Endpoint.CHAT, max_tokens_limit=4096)
    assert shape(parsed, raw, EngineFacts(kind=kind, served_model="other"), want_usage=True) is None


def test_no_injection_for_mii() -> None:
    raw, _, shaped = _shape({**CHAT, "stream": True}, EngineKind.MII)
    assert shaped.body is raw
    assert not shaped.strip_usage_chunk


def test_no_injection_when_nobody_reads_usage_or_without_a_stream() -> None:
    raw, _, shaped = _shape({**CHAT, "stream": True}, EngineKind.VLLM, want_usage=False)
    assert (shaped.body, shaped.strip_usage_chunk) == (raw, False)
    raw, _, shaped = _shape(CHAT, EngineKind.VLLM)
    assert (shaped.body, shaped.strip_usage_chunk) == (raw, False)


@pytest.mark.parametrize("stream", [False, True])
def test_mii_gets_its_served_model_name(stream: bool) -> None:
    _, _, shaped = _shape({**CHAT, "stream": stream}, EngineKind.MII, served="/models/llama")
    assert orjson.loads(shaped.body) == {**CHAT, "stream": stream, "model": "/models/llama"}
    assert not shaped.strip_usage_chunk


def test_mii_body_is_unchanged_when_the_name_matches_or_is_unknown() -> None:
    raw, _, shaped = _shape(CHAT, EngineKind.MII, served="client-name")
    assert shaped.body is raw
    raw, _, shaped = _shape(CHAT, EngineKind.MII, served=None)
    assert shaped.body is raw


@pytest.mark.parametrize("kind", [*INJECTING, EngineKind.KVGATE, EngineKind.OPENAI])
def test_model_is_rewritten_only_where_the_profile_says(kind: EngineKind) -> None:
    _, _, shaped = _shape(CHAT, kind, served="served-name")
    assert orjson.loads(shaped.body)["model"] == "client-name"


def test_injection_and_rewrite_together_on_a_profile_with_both(monkeypatch: pytest.MonkeyPatch) -> None:
    """No built-in profile has both today; a reshaped body carries both changes."""
    both = replace(PROFILES[EngineKind.VLLM], rewrite_model=True)
    monkeypatch.setitem(PROFILES, EngineKind.VLLM, both)
    _, _, shaped = _shape({**CHAT, "stream": True}, EngineKind.VLLM, served="served-name")
    sent = orjson.loads(shaped.body)
    assert (sent["model"], sent["stream_options"]) == ("served-name", {"include_usage": True})
