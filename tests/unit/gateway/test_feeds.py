"""Which KV-event feed the gateway starts for a worker, by its detected engine (``gateway.feeds``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson
import pytest

from gateway.engines.profiles import EngineKind
from gateway.feeds import EventFollower, FeedHooks
from gateway.fleet.registry import Fleet, WorkerRecord
from gateway.kvindex.feeds.discovery import EventSource
from gateway.kvindex.hybrid import IndexMode
from gateway.settings import BreakerSettings, parse_worker


@dataclass
class FakeKV:
    is_approximate: bool = False
    workers: dict[str, object] = field(default_factory=dict)
    calls: list[tuple[object, ...]] = field(default_factory=list)
    modes: dict[str, IndexMode] = field(default_factory=dict)
    capacities: dict[str, int] = field(default_factory=dict)
    quiet_mode: IndexMode = "approximate"

    def set_mode(self, worker_id: str, mode: IndexMode) -> bool:
        changed = self.modes.get(worker_id) != mode
        self.modes[worker_id] = mode
        return changed

    def worker_mode(self, worker_id: str) -> IndexMode:
        return self.modes.get(worker_id, "approximate")

    def set_capacity(self, worker_id: str, tokens: int) -> None:
        self.capacities[worker_id] = tokens

    def add_worker(self, worker_id: str, url: str) -> None:
        self.calls.append(("sse", worker_id, url))

    def add_engine_worker(self, worker_id: str, endpoint: str, *, model: str, engine: str = "vllm") -> None:
        self.calls.append(("zmq", worker_id, endpoint, model, engine))

    def add_event_sources(
        self, worker_id: str, sources: Sequence[EventSource], *, model: str, engine: str = "vllm"
    ) -> None:
        self.calls.append(("sources", worker_id, tuple(sources), model, engine))

    def add_trtllm_worker(
        self, worker_id: str, url: str, model: str, *, block_size: int | None = None
    ) -> None:
        self.calls.append(("drain", worker_id, url, model, block_size))


VLLM_SOURCES = {"0": {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
                      "replay_endpoint": "tcp://*:5558", "topic": ""}}  # fmt: skip


def _setup(
    url: str, kind: EngineKind, answers: dict[str, object] | None = None
) -> tuple[FakeKV, EventFollower, WorkerRecord]:
    fleet = Fleet(breaker=BreakerSettings(), clock=lambda: 0.0)
    spec = parse_worker(url)
    record = fleet.add(spec)
    record.facts.kind, record.facts.served_model, record.facts.block_size = kind, "smol", 32
    kv = FakeKV()

    async def get(base_url: str, path: str) -> tuple[int, bytes]:
        if answers is not None and path in answers:
            return 200, orjson.dumps(answers[path])
        return 404, b""

    return kv, EventFollower(kv, fleet, get, {spec.id: spec}), record


async def test_a_kvgate_worker_gets_its_own_sse_feed() -> None:
    kv, follower, record = _setup("http://10.0.0.5:8000#id=w", EngineKind.KVGATE)
    await follower.follow(record)
    assert kv.calls == [("sse", "w", "http://10.0.0.5:8000")]
    assert kv.modes == {"w": "precise"} and record.facts.index_mode == "precise"


async def test_vllm_publishers_are_discovered_with_the_workers_host() -> None:
    kv, follower, record = _setup(
        "http://10.0.0.5:8000#id=w", EngineKind.VLLM, {"/kv_event_sources": VLLM_SOURCES}
    )
    await follower.follow(record)
    (call,) = kv.calls
    assert call[0] == "sources" and call[3:] == ("smol", "vllm")
    sources = call[2]
    assert isinstance(sources, tuple) and len(sources) == 1
    source = sources[0]
    assert isinstance(source, EventSource)
    assert (source.endpoint, source.replay_endpoint) == ("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558")
    assert record.facts.event_endpoints == ("tcp://10.0.0.5:5557",)


async def test_vllm_without_events_gets_no_feed_and_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    kv, follower, record = _setup("http://10.0.0.5:8000#id=w", EngineKind.VLLM, {"/kv_event_sources": {}})
    await follower.follow(record)
    assert kv.calls == []
    assert "tcp://*:5557" in caplog.text


async def test_sglang_names_its_publisher_in_server_info() -> None:
    config = orjson.dumps({"publisher": "zmq", "endpoint": "tcp://*:5557", "topic": ""}).decode()
    kv, follower, record = _setup(
        "http://10.0.0.7:30000#id=s", EngineKind.SGLANG, {"/server_info": {"kv_events_config": config}}
    )
    await follower.follow(record)
    assert [c[0] for c in kv.calls] == ["sources"]
    assert kv.calls[0][2][0].endpoint == "tcp://10.0.0.7:5557"  # type: ignore[index]
    assert kv.calls[0][4] == "sglang"


async def test_sglang_with_the_null_publisher_has_no_feed() -> None:
    kv, follower, record = _setup(
        "http://10.0.0.7:30000#id=s", EngineKind.SGLANG, {"/server_info": {"kv_events_config": None}}
    )
    await follower.follow(record)
    assert kv.calls == []


async def test_an_explicit_publisher_and_model_win_over_discovery() -> None:
    kv, follower, record = _setup(
        "http://10.0.0.7:30000#id=s&events=tcp://10.0.0.7:6000&model=llama", EngineKind.SGLANG
    )
    await follower.follow(record)
    assert kv.calls == [("zmq", "s", "tcp://10.0.0.7:6000", "llama", "sglang")]


async def test_tensorrt_llm_is_polled_through_its_http_drain_with_its_block_size() -> None:
    kv, follower, record = _setup("http://10.0.0.8:8000#id=t", EngineKind.TRTLLM)
    await follower.follow(record)
    assert kv.calls == [("drain", "t", "http://10.0.0.8:8000", "smol", 32)]


@pytest.mark.parametrize("kind", [EngineKind.TGI, EngineKind.LMDEPLOY, EngineKind.MII, EngineKind.OPENAI])
async def test_engines_without_events_get_no_feed(kind: EngineKind) -> None:
    kv, follower, record = _setup("http://10.0.0.9:8000#id=x", kind)
    record.facts.kv_capacity_tokens = 32_000
    follower.on_detected(record)
    await follower.aclose()
    assert kv.calls == []
    assert kv.capacities == {"x": 32_000}  # the engine's KV capacity in its own tokens
    assert kv.modes == {} and record.facts.index_mode == "approximate"


async def test_on_detected_skips_followed_workers_and_the_approximate_index() -> None:
    kv, follower, record = _setup("http://10.0.0.5:8000#id=w", EngineKind.KVGATE)
    kv.workers["w"] = object()
    follower.on_detected(record)
    kv.workers.clear()
    kv.is_approximate = True
    follower.on_detected(record)
    await asyncio.sleep(0)
    assert kv.calls == []
    kv.is_approximate = False
    follower.on_detected(record)
    await asyncio.sleep(0.01)
    assert kv.calls == [("sse", "w", "http://10.0.0.5:8000")]


def test_feed_hooks_mark_the_record_and_count_its_requests() -> None:
    fleet = Fleet(breaker=BreakerSettings(), clock=lambda: 0.0)
    record = fleet.add(parse_worker("http://h:1#id=w"))
    hooks = FeedHooks(fleet)
    kv = FakeKV()
    hooks.attach(kv)
    record.routed_total = 7
    assert hooks.activity("w") == 7 and hooks.activity("gone") == 0
    trusted = []
    hooks.on_quiet("w")
    trusted.append(record.facts.events_trusted)
    assert kv.modes == {"w": "approximate"}  # quiet: placement learned from routing meanwhile
    hooks.on_flowing("w")
    trusted.append(record.facts.events_trusted)
    assert trusted == [False, True]
    assert kv.modes == {"w": "precise"}  # quiet: approximate, then flowing: precise again
    hooks.on_quiet("gone")  # a removed worker is ignored


def test_each_workers_index_mode_is_a_metric() -> None:
    from gateway.observability.metrics import Metrics
    from gateway.state.memory import MemoryLoadBoard

    fleet = Fleet(breaker=BreakerSettings(), clock=lambda: 0.0)
    fleet.add(parse_worker("http://h:1#id=a")).facts.index_mode = "precise"
    fleet.add(parse_worker("http://h:2#id=b")).facts.index_mode = "approximate"
    metrics = Metrics()
    metrics.attach_fleet(fleet, MemoryLoadBoard())
    text = metrics.render().decode()
    assert 'kvgate_worker_index_mode{mode="precise",worker="a"} 1.0' in text
    assert 'kvgate_worker_index_mode{mode="approximate",worker="b"} 1.0' in text
