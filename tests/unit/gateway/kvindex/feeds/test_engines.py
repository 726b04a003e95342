"""Engine feeds per worker: supervision (a broken source retries with a resync) and quiet/flowing callbacks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.kvindex.feeds.discovery import EventSource
from gateway.kvindex.feeds.engines import EngineFeedConfig, EngineFeeds
from kvgate_core.kvcontract.events import EventType, KVEvent
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash

PROMPT = list(range(1, 33))


def trt_stored(event_id: int) -> list[dict[str, Any]]:
    tokens = [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in PROMPT]
    block = {"type": "stored_block", "block_hash": 5, "tokens": tokens, "cache_level": 0, "priority": 35}
    return [
        {
            "event_id": event_id,
            "window_size": 64,
            "data": {"type": "stored", "parent_hash": None, "blocks": [block]},
        }
    ]


def test_unsupported_engines_and_empty_sources_are_refused() -> None:
    feeds = EngineFeeds(EngineFeedConfig(), clock=lambda: 0.0)
    with pytest.raises(ValueError, match="not supported"):
        feeds.zmq("w", [EventSource("tcp://h:1")], model="m", engine="tgi", sink=print).close()
    with pytest.raises(ValueError, match="no KV event source"):
        feeds.zmq("w", [], model="m", engine="vllm", sink=print).close()
    assert feeds.status("w") is None


async def test_a_broken_source_is_resynced_and_retried_without_failing() -> None:
    sunk: list[KVEvent] = []
    feeds = EngineFeeds(EngineFeedConfig(backoff_initial_s=0.01, backoff_max_s=0.02), clock=lambda: 0.0)
    task = asyncio.create_task(
        feeds.zmq("w", [EventSource("tcp://not an endpoint")], model="m", engine="sglang", sink=sunk.extend)
    )
    await asyncio.sleep(0.1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    status = feeds.status("w")
    assert status is not None
    assert status["sources"][0]["num_resyncs"] >= 2
    assert {e.type for e in sunk} == {EventType.CLEARED}
    assert (status["state"], feeds.trusted("w")) == ("stopped", False)
    feeds.remove("w")
    assert feeds.trusted("w")


async def test_a_drain_that_goes_quiet_is_reported_and_trusted_again_when_it_flows() -> None:
    now = [0.0]
    calls: list[tuple[str, str]] = []
    answers: list[Any] = [trt_stored(0), [], [], [], trt_stored(1)]
    sunk: list[KVEvent] = []

    async def post(_url: str) -> Any:
        now[0] += 30.0
        if not answers:
            await asyncio.Event().wait()
        return answers.pop(0)

    feeds = EngineFeeds(
        EngineFeedConfig(drain_interval_s=0.0, quiet_after_s=60.0),
        clock=lambda: now[0],
        on_quiet=lambda w: calls.append(("quiet", w)),
        on_flowing=lambda w: calls.append(("flowing", w)),
    )
    task = asyncio.create_task(feeds.trtllm("trt-0", "http://w:8000", model="m", post=post, sink=sunk.extend))
    for _ in range(100):
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert calls == [("flowing", "trt-0"), ("quiet", "trt-0"), ("flowing", "trt-0")]
    ours = chain_hashes(PROMPT, root_hash("m"), 16)
    assert [list(e.hashes) for e in sunk] == [ours, ours]
