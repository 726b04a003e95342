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


def publisher_of(config: str | None) -> ZmqKVPublisher | None:
    doc = json.loads(config) if config else {}
    if doc.get("publisher", "null") != "zmq":
        return None
    return ZmqKVPublisher(
        doc.get("endpoint", "tcp://*:5557"), doc.get("replay_endpoint"), encode_events,
        topic=doc.get("topic", ""), buffer_steps=int(doc.get("buffer_steps", 10_000)),
    )  # fmt: skip
