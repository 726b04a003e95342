"""SGLang 0.5.23's KV events as the fake publishes them (``srt/disaggregation/kv_events.py``; docs/engines.md): the event encoding and the
``--kv-events-config`` handling (``tests.support.engines.zmq_events`` does the framing and replay)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from tests.support.engines.cache import Block
from tests.support.engines.zmq_events import ZmqKVPublisher


def signed64(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def encode_events(stored: Sequence[Block], removed: Sequence[Block], cleared: bool) -> list[Any]:
    """SGLang 0.5.23 events: tagged maps, one ``BlockStored`` per page, optional fields only when set."""
    events: list[Any] = []
    if cleared:
        events.append({"type": "AllBlocksCleared"})
    elif removed:
        events.append(
            {"type": "BlockRemoved", "block_hashes": [signed64(b.hash) for b in removed], "medium": "GPU"}
        )
    for b in stored:
        event: dict[str, Any] = {
            "type": "BlockStored", "block_hashes": [signed64(b.hash)],
            "parent_block_hash": None if b.parent is None else signed64(b.parent),
            "token_ids": list(b.tokens), "block_size": len(b.tokens), "lora_id": None, "medium": "GPU",
        }  # fmt: skip
        if b.salt is not None:
            event["cache_salt"] = b.salt
        if b.lora is not None:
            event["lora_name"] = b.lora
        events.append(event)
    return events


def events_config(args: argparse.Namespace) -> str | None:
    if args.kv_events_config is not None:
        return str(args.kv_events_config)
    if args.events_port is None:
        return None
    config: dict[str, Any] = {"publisher": "zmq", "endpoint": f"tcp://*:{args.events_port}"}
    if args.events_replay_port is not None:
        config["replay_endpoint"] = f"tcp://*:{args.events_replay_port}"
    return json.dumps(config)


def publishers_of(config: str | None, dp_size: int = 1) -> list[ZmqKVPublisher]:
    """One publisher per DP rank (SGLang runs one per independent KV cache): rank ``r`` on the configured
    port + ``r``, its replay ROUTER on the replay port + ``r``, ``r`` in every batch."""
    doc = json.loads(config) if config else {}
    if doc.get("publisher", "null") != "zmq":
        return []
    endpoint, replay = doc.get("endpoint", "tcp://*:5557"), doc.get("replay_endpoint")
    topic, steps = doc.get("topic", ""), int(doc.get("buffer_steps", 10_000))
    out = []
    for rank in range(dp_size):
        out.append(ZmqKVPublisher(
            port_plus(endpoint, rank), port_plus(replay, rank) if replay else None, encode_events,
            topic=topic, buffer_steps=steps, dp_rank=rank,
        ))  # fmt: skip
    return out


def descriptor(config: str | None, dp_size: int, page_size: int) -> dict[str, Any] | None:
    """``/server_info``'s ``kv_events`` object (``describe_kv_events_publisher`` in SGLang's
    ``srt/entrypoints/runtime_context.py``): None unless a ZMQ publisher is configured."""
    doc = json.loads(config) if config else {}
    if doc.get("publisher", "null") != "zmq":
        return None
    host, _, port = doc.get("endpoint", "tcp://*:5557").removeprefix("tcp://").rpartition(":")
    out: dict[str, Any] = {
        "publisher": "zmq", "endpoint_host": host, "endpoint_port_base": int(port),
        "topic": doc.get("topic", ""), "block_size": page_size, "dp_size": dp_size,
    }  # fmt: skip
    if replay := doc.get("replay_endpoint"):
        replay_host, _, replay_port = replay.removeprefix("tcp://").rpartition(":")
        out.update(replay_endpoint_host=replay_host, replay_endpoint_port_base=int(replay_port),
                   replay_buffer_steps=int(doc.get("buffer_steps", 10_000)))  # fmt: skip
    return out


def port_plus(endpoint: str, offset: int) -> str:
    """``tcp://host:P`` as ``tcp://host:P+offset``."""
    head, _, port = endpoint.rpartition(":")
    return f"{head}:{int(port) + offset}"
