"""KV events: what a worker tells the gateway about the blocks it stores or drops.

Wire form (JSON, one object per event)::

    {"worker": id, "type": "stored"|"removed"|"cleared", "tier": "gpu"|"dram"|"ssd",
     "hashes": [u64, ...], "ts": float}

Published on a worker's ``GET /kv/events`` (SSE) and on the Redis stream ``kvgate:events``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import orjson

from kvgate_core.frozen import fast_constructor

EVENTS_STREAM: Final = "kvgate:events"


class EventType(StrEnum):
    STORED = "stored"
    REMOVED = "removed"
    CLEARED = "cleared"


class Tier(StrEnum):
    GPU = "gpu"
    DRAM = "dram"
    SSD = "ssd"


class EventDecodeError(ValueError):
    """An event payload does not match the schema."""


@dataclass(frozen=True, slots=True)
class KVEvent:
    """One change to the set of blocks a worker (or a shared tier) holds.

    ``hashes`` are block hashes of the kvcontract scheme, unsigned 64-bit. A ``cleared`` event carries no
    hashes and means the worker dropped everything on ``tier``.
    """

    worker: str
    type: EventType
    tier: Tier = Tier.GPU
    hashes: tuple[int, ...] = field(default=())
    ts: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "type": self.type.value,
            "tier": self.tier.value,
            "hashes": list(self.hashes),
            "ts": self.ts,
        }


_EVENT_TYPES: Final = {t.value: t for t in EventType}
_TIERS: Final = {t.value: t for t in Tier}
_INT_ONLY: Final = {int}
_U64_END: Final = 1 << 64
new_event = fast_constructor(KVEvent)
"""``KVEvent(...)`` for the feeds' path: the same frozen value, built without ``object.__setattr__``."""


def encode_event(event: KVEvent) -> bytes:
    """Serialise one event as JSON bytes."""
    return orjson.dumps(event.to_dict())


def event_from_dict(obj: Any) -> KVEvent:
    """Validate a decoded JSON object into a ``KVEvent``.

    Every check is a C-level pass (a worker publishes an event per batch of blocks it stores or drops, tens
    of hashes each, and the gateway reads every one): the enums by dict lookup, the hashes' type by the set of
    their types (``bool`` is refused: JSON ``true`` is no block hash) and their range by ``min`` and ``max``.

    Raises:
        EventDecodeError: a field is missing or of the wrong type.
    """
    if not isinstance(obj, dict):
        raise EventDecodeError("event must be a JSON object")
    try:
        worker = obj["worker"]
        etype = _EVENT_TYPES.get(obj["type"])
        tier = _TIERS.get(obj.get("tier", "gpu"))
        hashes = obj.get("hashes", [])
        ts = float(obj.get("ts", 0.0))
    except (KeyError, ValueError, TypeError) as exc:  # TypeError: an unhashable type or tier
        raise EventDecodeError(f"bad event: {exc!r}") from exc
    if etype is None or tier is None:
        raise EventDecodeError(f"bad event: unknown type {obj['type']!r} or tier {obj.get('tier')!r}")
    if not isinstance(worker, str) or not isinstance(hashes, list):
        raise EventDecodeError("bad event: worker must be a string and hashes a list")
    if not are_block_hashes(hashes):
        raise EventDecodeError("bad event: hashes must be unsigned 64-bit integers")
    return new_event(worker, etype, tier, tuple(hashes), ts)


def are_block_hashes(values: list[Any]) -> bool:
    """Whether every value is an unsigned 64-bit int (``bool`` refused: JSON ``true`` is no block hash), in
    C-level passes: the set of the values' types, then ``min`` and ``max``."""
    return not values or (set(map(type, values)) == _INT_ONLY and min(values) >= 0 and max(values) < _U64_END)


def decode_event(data: bytes | str) -> KVEvent:
    """Parse one JSON event.

    Raises:
        EventDecodeError: the payload is not valid JSON or not a valid event.
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise EventDecodeError(f"event is not JSON: {exc}") from exc
    return event_from_dict(obj)


def encode_events(events: Sequence[KVEvent]) -> bytes:
    """Serialise a batch of events as a JSON array."""
    return orjson.dumps([e.to_dict() for e in events])
