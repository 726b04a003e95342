"""Detection and the load scrape against the protocol-faithful engine fakes (``tests/support/engines``, built
from each engine's source): the detected kind, and a load signal that parses."""

from __future__ import annotations

import httpx
import pytest

from gateway.engines.detect import detect_engine
from gateway.engines.probe import OnceGet
from gateway.engines.profiles import EngineKind
from gateway.fleet.registry import Fleet
from gateway.fleet.signals import adopt_detection, scrape_load
from gateway.settings import BreakerSettings, parse_worker
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
        record = Fleet(breaker=BreakerSettings(), clock=lambda: 0.0).add(parse_worker("http://fake"))
        adopt_detection(record, facts)
        await scrape_load(record, get, clock=lambda: 1.0)
        if facts.profile.load_path is None:
            assert name == "mii" and record.facts.load_signal == "in-flight"
            return
        if name == "trtllm":  # no /prometheus/metrics by default: the JSON /metrics, empty while nothing ran
            assert record.facts.load_signal == "in-flight" and "/metrics" in record.facts.load_note
            return
        assert record.facts.load_signal == "engine", record.facts.load_note
        assert record.facts.load_read_at == 1.0
        assert record.running >= 0 and record.queue_depth >= 0
