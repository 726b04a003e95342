"""One decoder for the KV events of vLLM, SGLang and TensorRT-LLM's ZMQ publisher.

All three publish ZMQ multipart messages ``[topic, seq (8 bytes BE), payload]`` whose payload is a msgpack
batch ``[ts, events, dp_rank?]`` (positional; a ``{"ts", "events", ...}`` map is accepted too). An event is
either a tagged map ``{"type": "BlockStored", field: value, ...}`` (vLLM since May 2026, SGLang 0.5.23,
TensorRT-LLM) or a tagged array ``["BlockStored", value, ...]`` (older vLLM and SGLang) whose fields come in
``POSITIONAL`` order; trailing defaults may be omitted. SGLang's old positional layout is a prefix of vLLM's,
so one order serves both. Field sources:

- vLLM (``vllm/distributed/kv_events.py``): ``BlockStored(block_hashes, parent_block_hash, token_ids,
  block_size, lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
  kv_cache_spec_sliding_window, locality, ownership, session_id)``, ``BlockRemoved(block_hashes, medium,
  group_idx, locality, ownership)``, ``AllBlocksCleared()``.
- SGLang (``srt/disaggregation/kv_events.py``): ``BlockStored`` adds ``cache_salt``, ``session_id`` and
  ``lora_name`` (maps only).
- TensorRT-LLM (``_torch/pyexecutor/kv_cache_events.py``): ``token_ids`` may hold strings, ``mm_keys`` is a
  per-block list of ``{"type": "mm_key", "hash", "start_offset", "uuid"?}``.

Engine block hashes are ``int`` (vLLM, TensorRT-LLM; SGLang's are signed), ``bytes`` (vLLM with a bytes
hash) or ``str``; they are kept as they come and used only to link parents and removals. Unknown event tags
decode to ``UnknownEvent`` (skipped downstream), so a newer engine does not break a batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from kvgate_core.kvcontract.events import EventDecodeError

EngineHash = int | bytes | str

POSITIONAL: Final[Mapping[str, tuple[str, ...]]] = {
    "BlockStored": (
        "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
        "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality",
        "ownership", "session_id",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx", "locality", "ownership"),
    "AllBlocksCleared": (),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks an engine cached: ``token_ids`` holds ``block_size`` tokens per hash, in order.

    ``extra_keys`` (vLLM) and ``mm_keys`` (TensorRT-LLM) have one entry per block when present.
    """

    block_hashes: Sequence[EngineHash]
    parent: EngineHash | None
    token_ids: Sequence[int | str]
    block_size: int
    medium: str | None = None
    lora_id: int | str | None = None
    lora_name: str | None = None
    cache_salt: str | None = None
    extra_keys: Sequence[Any] | None = None
    mm_keys: Sequence[Any] | None = None
    group_idx: int | None = None
    spec_kind: str | None = None
    locality: str | None = None
    session_id: int | str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks an engine evicted (from ``medium``)."""

    block_hashes: Sequence[EngineHash]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole cache (e.g. ``/reset_prefix_cache``)."""


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    """An event tag this decoder does not know (a newer engine); skipped and counted."""

    tag: str


EngineEvent = BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One decoded batch: the engine's wall-clock ``ts``, its events and its data-parallel rank."""

    ts: float
    events: list[EngineEvent]
    dp_rank: int | None = None


def decode_event_batch(payload: bytes) -> EventBatch:
    """Decode one msgpack event batch of any of the three engines, in either encoding.

    Raises:
        EventDecodeError: not msgpack, not a batch, or a known event with fields of the wrong type.
    """
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise EventDecodeError(f"KV event batch is not msgpack: {exc}") from exc
    if isinstance(batch, Mapping):
        ts, events, rank = batch.get("ts"), batch.get("events"), batch.get("data_parallel_rank")
    elif isinstance(batch, list) and len(batch) >= 2:
        ts, events, rank = batch[0], batch[1], batch[2] if len(batch) > 2 else None
    else:
        raise EventDecodeError("KV event batch must be [ts, events, ...] or {ts, events, ...}")
    if not isinstance(events, list):
        raise EventDecodeError("KV event batch: events must be a list")
    return EventBatch(
        ts=float(ts) if isinstance(ts, int | float) else 0.0,
        events=[decode_event(e) for e in events],
        dp_rank=rank if isinstance(rank, int) else None,
    )


def decode_batch(payload: bytes) -> list[EngineEvent]:
    """The events of one batch (``decode_event_batch`` without the envelope)."""
    return decode_event_batch(payload).events


def decode_event(raw: Any) -> EngineEvent:
    """One event from its tagged-map or tagged-array form.

    Raises:
        EventDecodeError: neither form, or a known event with fields of the wrong type.
    """
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag = raw[0]
        fields: Mapping[str, Any] = dict(zip(POSITIONAL.get(tag, ()), raw[1:], strict=False))
    elif isinstance(raw, Mapping) and isinstance(raw.get("type"), str):
        tag, fields = raw["type"], raw
    else:
        raise EventDecodeError("KV event must be [tag, ...] or {type: tag, ...}")
    if tag == "BlockStored":
        return _stored(fields)
    if tag == "BlockRemoved":
        return BlockRemoved(
            _hashes(fields.get("block_hashes")), _opt(fields, "medium", str), _opt(fields, "group_idx", int),
            _opt(fields, "locality", str),
        )  # fmt: skip
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return UnknownEvent(tag)


def _stored(f: Mapping[str, Any]) -> BlockStored:
    tokens, block_size = f.get("token_ids"), f.get("block_size")
    if not isinstance(tokens, list):
        raise EventDecodeError("BlockStored: token_ids must be a list")
    if not isinstance(block_size, int) or block_size <= 0:
        raise EventDecodeError("BlockStored: block_size must be a positive integer")
    parent = f.get("parent_block_hash")
    return BlockStored(
        block_hashes=_hashes(f.get("block_hashes")),
        parent=None if parent is None else _hash(parent),
        token_ids=tokens,
        block_size=block_size,
        medium=_opt(f, "medium", str),
        lora_id=_opt(f, "lora_id", (int, str)),
        lora_name=_opt(f, "lora_name", str),
        cache_salt=_opt(f, "cache_salt", str),
        extra_keys=_opt(f, "extra_keys", list),
        mm_keys=_opt(f, "mm_keys", list),
        group_idx=_opt(f, "group_idx", int),
        spec_kind=_opt(f, "kv_cache_spec_kind", str),
        locality=_opt(f, "locality", str),
        session_id=_opt(f, "session_id", (int, str)),
    )


def _hashes(value: Any) -> list[EngineHash]:
    if not isinstance(value, list):
        raise EventDecodeError("KV event: block_hashes must be a list")
    return [_hash(h) for h in value]


def _hash(value: Any) -> EngineHash:
    if isinstance(value, int | bytes | str) and not isinstance(value, bool):
        return value
    raise EventDecodeError(f"KV event: a block hash must be int, bytes or str, not {type(value).__name__}")


def _opt(fields: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = fields.get(name)
    if value is None or isinstance(value, kind):
        return value
    raise EventDecodeError(f"KV event: {name} has an unexpected type {type(value).__name__}")
