"""Finding an engine's KV event publishers: vLLM's ``GET /kv_event_sources`` (both shapes), wildcards, DP ranks."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.kvindex.feeds.discovery import (
    EventSource,
    discover_event_sources,
    discover_sglang_sources,
    reachable_endpoint,
)


def getter(body: Any, seen: list[tuple[str, str]] | None = None, status: int = 200) -> Any:
    async def get(base_url: str, path: str) -> tuple[int, bytes]:
        if seen is not None:
            seen.append((base_url, path))
        return status, orjson.dumps(body)

    return get


def vllm_032(endpoint: str, replay: str | None = None, **kw: Any) -> dict[str, Any]:
    """One rank's ``KVEventsConfig`` as vLLM 0.32.0 serialises it."""
    return {
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "replay_endpoint": replay,
        "buffer_steps": 10000, "hwm": 100000, "max_queue_size": 100000, "topic": "", **kw,
    }  # fmt: skip


async def test_vllm_032_ranks_become_sources_with_the_worker_host() -> None:
    seen: list[tuple[str, str]] = []
    body = {
        "1": vllm_032("tcp://*:5558", "tcp://*:5568", topic="kv"),
        "0": vllm_032("tcp://*:5557", "tcp://*:5567"),
    }
    sources = await discover_event_sources(getter(body, seen), "http://10.1.2.3:8000/")
    assert seen == [("http://10.1.2.3:8000/", "/kv_event_sources")]
    assert sources == [
        EventSource("tcp://10.1.2.3:5557", "tcp://10.1.2.3:5567", "", 0),
        EventSource("tcp://10.1.2.3:5558", "tcp://10.1.2.3:5568", "kv", 1),
    ]


@pytest.mark.parametrize(
    "body",
    [
        [{"data_parallel_rank": 0, "endpoint": "tcp://0.0.0.0:41001", "replay_endpoint": None, "topic": "t"}],
        {"sources": [{"data_parallel_rank": 0, "endpoint": "tcp://0.0.0.0:41001", "topic": "t"}]},
    ],
    ids=["bare-list", "sources-envelope"],
)
async def test_later_vllm_list_shapes(body: Any) -> None:
    assert await discover_event_sources(getter(body), "http://gpu-7:8000") == [
        EventSource("tcp://gpu-7:41001", None, "t", 0)
    ]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"0": vllm_032("tcp://*:5557", enable_kv_cache_events=False)},
        {"0": vllm_032("tcp://*:5557", publisher="null")},
        {"0": vllm_032("inproc://cache")},
        "not json we know",
    ],
    ids=["render-only", "disabled", "null-publisher", "inproc", "junk"],
)
async def test_no_sources(body: Any) -> None:
    assert await discover_event_sources(getter(body), "http://10.0.0.1:8000") == []


async def test_an_engine_without_the_route_has_no_sources() -> None:
    body = {"0": vllm_032("tcp://*:5557")}
    assert await discover_event_sources(getter(body, status=404), "http://10.0.0.1:8000") == []


@pytest.mark.parametrize(
    ("endpoint", "host", "expected"),
    [
        ("tcp://*:5557", "10.0.0.5", "tcp://10.0.0.5:5557"),
        ("tcp://0.0.0.0:5557", "10.0.0.5", "tcp://10.0.0.5:5557"),
        ("tcp://[::]:5557", "10.0.0.5", "tcp://10.0.0.5:5557"),
        ("tcp://:::5557", "10.0.0.5", "tcp://10.0.0.5:5557"),
        ("tcp://localhost:5557", "10.0.0.5", "tcp://10.0.0.5:5557"),
        ("tcp://127.0.0.1:5557", "10.0.0.5", "tcp://10.0.0.5:5557"),
        ("tcp://*:5557", "fd00::7", "tcp://[fd00::7]:5557"),
        ("tcp://10.9.9.9:5557", "10.0.0.5", "tcp://10.9.9.9:5557"),
        ("ipc:///tmp/kv", "127.0.0.1", "ipc:///tmp/kv"),
        ("ipc:///tmp/kv", "10.0.0.5", None),
        ("tcp://*", "10.0.0.5", None),
    ],
)
def test_wildcard_and_loopback_hosts_become_the_worker_host(
    endpoint: str, host: str, expected: str | None
) -> None:
    assert reachable_endpoint(endpoint, host) == expected


async def test_sglang_describes_one_publisher_per_dp_rank() -> None:
    """``/server_info``'s ``kv_events`` object: rank r publishes on the port base + r, replays on its base + r."""
    body = {
        "dp_size": 2,
        "kv_events": {
            "publisher": "zmq", "endpoint_host": "0.0.0.0", "endpoint_port_base": 5557, "topic": "kv",
            "block_size": 64, "dp_size": 2, "replay_endpoint_host": "0.0.0.0",
            "replay_endpoint_port_base": 6000, "replay_buffer_steps": 16,
        },
    }  # fmt: skip
    sources = await discover_sglang_sources(getter(body), "http://10.0.0.7:30000")
    assert sources == [
        EventSource("tcp://10.0.0.7:5557", "tcp://10.0.0.7:6000", "kv", 0),
        EventSource("tcp://10.0.0.7:5558", "tcp://10.0.0.7:6001", "kv", 1),
    ]


async def test_an_older_sglang_offsets_its_configured_port_by_each_rank() -> None:
    config = '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'
    body = {"dp_size": 3, "kv_events_config": config}
    sources = await discover_sglang_sources(getter(body), "http://10.0.0.7:30000")
    assert [(s.endpoint, s.dp_rank) for s in sources] == [
        ("tcp://10.0.0.7:5557", 0), ("tcp://10.0.0.7:5558", 1), ("tcp://10.0.0.7:5559", 2),
    ]  # fmt: skip
    assert await discover_sglang_sources(getter({"kv_events_config": config}), "http://h:1") == [
        EventSource("tcp://h:5557", None, "", 0)
    ]


@pytest.mark.parametrize(
    "kv_events",
    [{"publisher": "null"}, {"publisher": "zmq"}, {"publisher": "zmq", "endpoint_port_base": "5557"}],
    ids=["null-publisher", "no-port", "port-not-int"],
)
async def test_an_sglang_descriptor_without_a_zmq_port_has_no_sources(kv_events: dict[str, Any]) -> None:
    assert await discover_sglang_sources(getter({"kv_events": kv_events}), "http://h:1") == []
