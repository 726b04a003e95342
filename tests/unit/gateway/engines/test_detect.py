"""Engine detection from recorded answers: each of the eight kinds, the fallbacks, and real vLLM 0.32.0."""

from __future__ import annotations

import orjson
import pytest

from gateway.engines.detect import detect_engine
from gateway.engines.profiles import EngineFacts, EngineKind
from tests.unit.gateway.engines.answers import (
    VLLM_FIXTURES,
    Answer,
    FakeServers,
    TrtllmMetrics,
    engine_answers,
    js,
    models,
)

URL = "http://w:8000"


async def _detect(
    answers: dict[str, Answer], configured: EngineKind = EngineKind.AUTO
) -> tuple[EngineFacts, FakeServers]:
    get = FakeServers({URL: answers})
    return await detect_engine(get, URL, configured=configured), get


def _vllm_load_body() -> bytes:
    return str(orjson.loads((VLLM_FIXTURES / "load.json").read_bytes())["body"]).encode()


@pytest.mark.parametrize(
    ("kind", "detected_by", "version", "served", "block", "capacity"),
    [
        ("kvgate", "owned_by=kvgate", None, "tiny", None, None),
        ("vllm", "owned_by=vllm", "0.32.0", "Qwen/Qwen3-8B", 16, 32000),
        ("sglang", "owned_by=sglang", "0.5.23", "Qwen/Qwen3-8B", 16, 500000),
        ("trtllm", "owned_by=tensorrt_llm", "1.2.1", "llama-3.1-8b", None, None),
        (
            "tgi",
            "/info router=text-generation-router",
            "3.3.7",
            "meta-llama/Llama-3.1-8B-Instruct",
            None,
            None,
        ),
        ("lmdeploy", "owned_by=lmdeploy", None, "internlm2", None, None),
        ("mii", "owned_by=deepspeed-mii", None, "mistralai/Mistral-7B-v0.1", None, None),
        ("openai", "no engine signature (owned_by=system)", None, "gpt-oss-20b", None, None),
    ],
)
async def test_each_engine_is_told_by_what_it_answers(
    kind: str, detected_by: str, version: str | None, served: str, block: int | None, capacity: int | None
) -> None:
    facts, _ = await _detect(engine_answers(kind))
    assert facts.kind is EngineKind(kind)
    assert facts.detected_by == detected_by
    assert facts.version == version
    assert facts.served_model == served
    assert (facts.block_size, facts.kv_capacity_tokens) == (block, capacity)


async def test_trtllm_detection_never_reads_its_draining_metrics() -> None:
    answers = engine_answers("trtllm")
    facts, get = await _detect(answers)
    assert facts.kind is EngineKind.TRTLLM
    assert get.count(URL, "/metrics") == 0
    metrics = answers["/metrics"]
    assert isinstance(metrics, TrtllmMetrics) and metrics.reads == 0


async def test_the_affinity_rule_is_applied_on_detection() -> None:
    mii, _ = await _detect(engine_answers("mii"))
    lmdeploy, _ = await _detect(engine_answers("lmdeploy"))
    vllm, _ = await _detect(engine_answers("vllm"))
    assert mii.no_affinity_reason == "no prefix cache in DeepSpeed-MII"
    assert (
        lmdeploy.no_affinity_reason is not None and "--enable-prefix-caching" in lmdeploy.no_affinity_reason
    )
    assert vllm.no_affinity_reason is None and vllm.prefix_reuse is True


@pytest.mark.parametrize(
    ("answers", "kind", "detected_by"),
    [
        # no owned_by at all: the engines' own info routes tell
        (
            {"/v1/models": models("m", None), "/server_info": js({"page_size": 32, "internal_states": []})},
            EngineKind.SGLANG,
            "/server_info (SGLang server args)",
        ),
        (
            {"/v1/models": models("m", None), "/server_info": js({"disaggregated_params": None})},
            EngineKind.TRTLLM,
            "/server_info (disaggregated_params)",
        ),
        (
            {"/v1/models": models("m", None), "/load": js({"server_load": 3})},
            EngineKind.VLLM,
            "/load server_load",
        ),
        (
            {"/v1/models": models("m", "w0"), "/load": js({"running": 1, "waiting": 2})},
            EngineKind.KVGATE,
            "/load (kvgate's worker shape)",
        ),
        ({"/v1/models": models("m", "openai")}, EngineKind.OPENAI, "no engine signature (owned_by=openai)"),
    ],
)
async def test_fallback_signatures(answers: dict[str, Answer], kind: EngineKind, detected_by: str) -> None:
    facts, _ = await _detect(answers)
    assert (facts.kind, facts.detected_by) == (kind, detected_by)


async def test_the_probes_stop_at_the_first_signature() -> None:
    _, get = await _detect(engine_answers("vllm"))
    assert [p for _, p in get.calls] == ["/v1/models", "/version", "/metrics"]
    _, get = await _detect(engine_answers("tgi"))
    assert [p for _, p in get.calls] == ["/v1/models", "/info"]  # one GET per path, facts read from it too
    _, get = await _detect({**engine_answers("sglang"), "/v1/models": models("m", None)})
    assert [p for _, p in get.calls] == ["/v1/models", "/info", "/server_info"]


async def test_a_server_that_answers_nothing_stays_auto() -> None:
    get = FakeServers({URL: {}})
    get.down.add(URL)
    facts = await detect_engine(get, URL)
    assert facts.kind is EngineKind.AUTO
    assert facts.detected_by == "no answer"


async def test_a_server_without_models_stays_auto() -> None:
    facts, _ = await _detect({})  # every route 404
    assert facts.kind is EngineKind.AUTO
    assert facts.detected_by == "no /v1/models"


async def test_a_configured_engine_is_kept_and_its_facts_read() -> None:
    answers = {**engine_answers("vllm"), "/v1/models": models("Qwen/Qwen3-8B", "someone-else")}
    facts, _ = await _detect(answers, EngineKind.VLLM)
    assert facts.kind is EngineKind.VLLM
    assert facts.detected_by == "configured"
    assert facts.version == "0.32.0" and facts.block_size == 16


async def test_vllm_prefix_caching_off_is_read_from_its_cache_info() -> None:
    metrics = b'vllm:num_requests_running 0\nvllm:cache_config_info{block_size="16",enable_prefix_caching="False"} 1\n'
    answers = {**engine_answers("vllm"), "/metrics": (200, metrics)}
    facts, _ = await _detect(answers)
    assert facts.prefix_reuse is False
    assert (
        facts.no_affinity_reason == "prefix caching is off on this vllm server (--no-enable-prefix-caching)"
    )


async def test_sglang_with_the_radix_cache_disabled_has_no_affinity() -> None:
    answers = {**engine_answers("sglang"), "/server_info": js({"page_size": 1, "disable_radix_cache": True})}
    facts, _ = await _detect(answers)
    assert facts.block_size == 1
    assert facts.no_affinity_reason is not None and "--disable-radix-cache" in facts.no_affinity_reason


async def test_real_vllm_0_32_answers() -> None:
    answers: dict[str, Answer] = {
        "/v1/models": (200, (VLLM_FIXTURES / "v1_models.json").read_bytes()),
        "/version": (200, (VLLM_FIXTURES / "version.json").read_bytes()),
        "/metrics": (200, (VLLM_FIXTURES / "metrics_idle.txt").read_bytes()),
        "/load": (200, _vllm_load_body()),
    }
    facts, _ = await _detect(answers)
    assert facts.kind is EngineKind.VLLM and facts.detected_by == "owned_by=vllm"
    assert facts.version == "0.32.0"
    assert facts.served_model == "SmolLM2-135M-Instruct"
    assert facts.model_root == "/work/main/.vllm/model"
    assert facts.block_size == 32
    assert facts.kv_capacity_tokens == 728 * 32
    assert facts.prefix_reuse is True


async def test_real_vllm_is_told_by_its_load_route_without_owned_by() -> None:
    answers: dict[str, Answer] = {
        "/v1/models": models("SmolLM2-135M-Instruct", None),
        "/load": (200, _vllm_load_body()),
    }
    facts, _ = await _detect(answers)
    assert facts.kind is EngineKind.VLLM
