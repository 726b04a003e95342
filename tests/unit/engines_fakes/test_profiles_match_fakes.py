"""Each engine profile of the gateway (``gateway.engines.profiles``) against its engine's fake: the profile
must exist, and what it says about the engine (load route and shape, parity route, block size, usage,
events, model strictness) must be what the fake (built from the engine's source) actually serves. Removing
or breaking a profile fails here, fast, before any process starts."""

from __future__ import annotations

import pytest

from gateway.engines.profiles import PROFILES, EngineKind, EngineProfile
from tests.support.engines.runner import ENGINES, parse_args
from tests.unit.engines_fakes.harness import HELLO, chat, events, fake

pytestmark = pytest.mark.timeout(30)

FAKES = ["sglang", "trtllm", "tgi", "lmdeploy", "mii"]
#: the default block size of each fake, as its command line resolves it
BLOCK_FLAG = {"sglang": "page_size", "trtllm": "tokens_per_block", "lmdeploy": "cache_block_seq_len"}
FIXED_BLOCK = {"tgi": 1, "mii": 128}
PARITY_PATHS = {"v1_tokenize": "/v1/tokenize", "chat_tokenize": "/chat_tokenize", "tokenize": "/tokenize"}


def _profile(name: str) -> EngineProfile:
    kind = EngineKind(name)
    assert kind in PROFILES, f"no engine profile for {name}"
    return PROFILES[kind]


def _model(name: str) -> str:
    return str(ENGINES[name].DEFAULT_MODEL)


@pytest.mark.parametrize("name", FAKES)
def test_profile_exists_and_block_size_matches(name: str) -> None:
    profile = _profile(name)
    args = parse_args([name, "--port", "0"])
    block = FIXED_BLOCK.get(name) or getattr(args, BLOCK_FLAG[name])
    assert profile.default_block_size == block


@pytest.mark.parametrize("name", FAKES)
async def test_load_route_is_served_in_the_profiles_format(name: str) -> None:
    profile = _profile(name)
    async with fake(name) as c:
        if profile.load_path is None:
            assert profile.load_format == "none"
            assert (await c.get("/metrics")).status_code == 404
            return
        reply = await c.get(profile.load_path)
        load_format = profile.load_format
        if reply.status_code == 404 and profile.fallback_load is not None:  # off by default (TensorRT-LLM)
            path, load_format = profile.fallback_load
            reply = await c.get(path)
        assert reply.status_code == 200
        if load_format == "prometheus":
            assert reply.headers["content-type"].startswith("text/plain") and "# TYPE" in reply.text
        elif load_format == "sglang_loads":
            assert "loads" in reply.json()
        elif load_format == "trtllm_json":
            assert isinstance(reply.json(), list)
        else:
            pytest.fail(f"unexpected load format {load_format}")


@pytest.mark.parametrize("name", FAKES)
async def test_parity_route_is_served_and_other_probes_are_not(name: str) -> None:
    profile = _profile(name)
    body = {"model": _model(name), "messages": HELLO}
    async with fake(name) as c:
        for route, path in PARITY_PATHS.items():
            status = (await c.post(path, json=body)).status_code
            if route == profile.parity_route:
                assert status == 200, path
            elif name not in ("sglang", "tgi"):  # SGLang aliases /tokenize; TGI's /tokenize takes text only
                assert status in (404, 405), path


@pytest.mark.parametrize("name", FAKES)
async def test_usage_model_and_events_facts(name: str) -> None:
    profile = _profile(name)
    model = _model(name)
    async with fake(name) as c:
        for _ in range(2):
            reply = await c.post("/v1/chat/completions", json=chat(model))
        details = reply.json()["usage"].get("prompt_tokens_details")
        expected = {"always": True, "flag": False, "never": False}[profile.cached_tokens]
        assert (details is not None) is expected
        streamed = events(
            (await c.post("/v1/chat/completions", json=chat(model, stream=True, usage=True))).content
        )
        assert any(e != "[DONE]" and e.get("usage") for e in streamed) is profile.stream_usage
        wrong_model = await c.post("/v1/chat/completions", json=chat(model + "-other"))
        assert (wrong_model.status_code == 400) is profile.rewrite_model
        drain = await c.post("/kv_cache_events")
        assert (drain.status_code == 200) is (profile.events == "trtllm_http")
        info = await c.get("/server_info")
        has_events_config = info.status_code == 200 and "kv_events_config" in info.json()
        assert has_events_config is (profile.events == "zmq")


def test_prefix_reuse_and_health_trust() -> None:
    assert [_profile(n).prefix_reuse for n in FAKES] == ["yes", "yes", "yes", "flag", "no"]
    assert [_profile(n).health_trusted for n in FAKES] == [True, True, True, True, False]
    assert [_profile(n).inject_include_usage for n in FAKES] == [True, True, True, True, False]
