"""Detection and the load scrape against the protocol-faithful engine fakes (``tests/support/engines``, built
from each engine's source): the detected kind, and a load signal that parses."""

from __future__ import annotations

import httpx
import pytest

from gateway.engines.detect import detect_engine
from gateway.engines.figures import EngineLoad
from gateway.engines.load import parse_load
from gateway.engines.probe import OnceGet
from gateway.engines.profiles import EngineKind
from tests.unit.engines_fakes.harness import fake

pytestmark = pytest.mark.timeout(30)


def _get(client: httpx.AsyncClient) -> OnceGet:
    async def get(_base_url: str, path: str) -> tuple[int, bytes]:
        reply = await client.get(path)
        return reply.status_code, reply.content

    return OnceGet(get)


@pytest.mark.parametrize("name", ["sglang", "trtllm", "tgi", "lmdeploy", "mii"])
async def test_each_fake_is_detected_and_its_load_parses(name: str) -> None:
    async with fake(name) as client:
        get = _get(client)
        facts = await detect_engine(get, "http://fake")
        assert facts.kind is EngineKind(name), facts.detected_by
        profile = facts.profile
        if profile.load_path is None:
            assert name == "mii"
            return
        status, body = await get("http://fake", profile.load_path)
        assert status == 200
        load = parse_load(facts.kind, profile.load_format, body)
        if name == "trtllm" and not isinstance(load, EngineLoad):  # nothing ran yet: an empty drain
            assert load.keep_previous
            return
        assert isinstance(load, EngineLoad), load
        assert load.running >= 0 and load.waiting >= 0
