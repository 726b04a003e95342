"""vLLM KV events (ZMQ PUB, msgpack) decoded and re-hashed into kvgate's block-hash scheme.

Wire format (``vllm/distributed/kv_events.py``): each ZMQ message is ``[topic, seq (8 bytes BE), payload]``;
the payload is a msgpack ``KVEventBatch``. vLLM encodes it with msgspec either positionally (``array_like``:
batch ``[ts, events, data_parallel_rank?]``, event ``[tag, field, ...]`` with trailing defaults omitted) or
as maps (batch ``{"ts", "events", ...}``, event ``{"type": tag, field: value, ...}``); both are accepted.
Events: ``BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
...)``, ``BlockRemoved(block_hashes, medium, ...)``, ``AllBlocksCleared()``. Engine block hashes are ints
or bytes.

vLLM's own hashes cannot be matched against ours, but ``BlockStored`` carries the token ids, so
``EngineEventTranslator`` re-hashes them with ``chain_hashes`` (with the engine's block size, which must be
the gateway's ``--block-size``) and remembers engine hash -> our hash, which translates a later
``BlockRemoved`` and chains a later ``BlockStored`` from its parent. Only GPU blocks are indexed (vLLM's
``CPU``/``DISK`` offload media are per-engine, not kvgate's shared tiers). SGLang's variant is in
``sglang.py``; the ZMQ subscriber is in ``zmq_feed.py``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from kvgate_core.kvcontract.events import EventDecodeError, EventType, KVEvent, Tier
from kvgate_core.kvcontract.extra_keys import extra_keys
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash

logger = logging.getLogger(__name__)

EngineHash = int | bytes

# Positional field order per event tag (msgspec array_like: the tag comes first, then these).
VLLM_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "BlockStored": (
        "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
        "extra_keys", "group_idx",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}  # fmt: skip
_GPU_MEDIA: Final = frozenset({None, "GPU", "gpu"})


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """One decoded foreign event: ``tag`` plus its fields by name (absent fields are left out)."""

    tag: str
    fields: Mapping[str, Any]


def decode_batch(payload: bytes, layout: Mapping[str, tuple[str, ...]] = VLLM_FIELDS) -> list[EngineEvent]:
    """Decode one msgpack ``KVEventBatch`` in either encoding.

    Raises:
        EventDecodeError: not msgpack, or not a batch of known events.
    """
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise EventDecodeError(f"KV event batch is not msgpack: {exc}") from exc
    if isinstance(batch, Mapping):
        events = batch.get("events")
    elif isinstance(batch, list) and len(batch) >= 2:
        events = batch[1]
    else:
        raise EventDecodeError("KV event batch must be [ts, events, ...] or {ts, events, ...}")
    if not isinstance(events, list):
        raise EventDecodeError("KV event batch: events must be a list")
    return [_decode_event(e, layout) for e in events]


def _decode_event(raw: Any, layout: Mapping[str, tuple[str, ...]]) -> EngineEvent:
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag, values = raw[0], raw[1:]
        names = layout.get(tag)
        if names is None:
            raise EventDecodeError(f"unknown KV event tag {tag!r}")
        return EngineEvent(tag, dict(zip(names, values, strict=False)))
    if isinstance(raw, Mapping) and isinstance(raw.get("type"), str):
        tag = raw["type"]
        if tag not in layout:
            raise EventDecodeError(f"unknown KV event tag {tag!r}")
        return EngineEvent(tag, {k: v for k, v in raw.items() if k != "type"})
    raise EventDecodeError("KV event must be [tag, ...] or {type: tag, ...}")


@dataclass(frozen=True, slots=True)
class TranslatorConfig:
    """How to name a foreign engine's blocks in kvgate's scheme.

    Attributes:
        worker: the gateway registry id of the engine.
        model: the model id the gateway hashes prompts with (the chain's root).
        block_size: the gateway's block size; events with another block size are skipped (counted).
        max_mapped: engine hash -> our hash entries kept (LRU); older blocks can then not be translated.
    """

    worker: str
    model: str
    block_size: int = 16
    max_mapped: int = 1_000_000


class EngineEventTranslator:
    """Turns decoded engine events into kvgate ``KVEvent``s for one engine (stateful: keeps the hash map)."""

    def __init__(self, config: TranslatorConfig) -> None:
        self.config = config
        self._ours: OrderedDict[EngineHash, int] = OrderedDict()
        self.num_skipped = 0

    def translate(self, events: Sequence[EngineEvent], ts: float = 0.0) -> list[KVEvent]:
        """kvgate events for a decoded batch; undecodable parts are skipped and counted."""
        out: list[KVEvent] = []
        for event in events:
            translated = self._translate_one(event, ts)
            if translated is None:
                self.num_skipped += 1
            else:
                out.append(translated)
        return out

    def _translate_one(self, event: EngineEvent, ts: float) -> KVEvent | None:
        worker = self.config.worker
        if event.tag == "AllBlocksCleared":
            self._ours.clear()
            return KVEvent(worker=worker, type=EventType.CLEARED, tier=Tier.GPU, ts=ts)
        if event.fields.get("medium") not in _GPU_MEDIA:
            return None
        hashes = event.fields.get("block_hashes")
        if not isinstance(hashes, list):
            return None
        if event.tag == "BlockRemoved":
            ours = [h for h in map(self._forget, hashes) if h is not None]
            return KVEvent(worker=worker, type=EventType.REMOVED, hashes=tuple(ours), ts=ts) if ours else None
        ours = self._rehash(event.fields, hashes)
        if not ours:
            return None
        return KVEvent(worker=worker, type=EventType.STORED, hashes=tuple(ours), ts=ts)

    def _rehash(self, fields: Mapping[str, Any], engine_hashes: list[EngineHash]) -> list[int]:
        block_size, tokens = fields.get("block_size"), fields.get("token_ids")
        if block_size != self.config.block_size or not isinstance(tokens, list):
            return []
        if len(tokens) != block_size * len(engine_hashes):
            return []
        parent = fields.get("parent_block_hash")
        if parent is None:
            lora = fields.get("lora_name")
            seed = root_hash(self.config.model, extra_keys(lora=lora if isinstance(lora, str) else None))
        else:
            found = self._ours.get(parent)
            if found is None:  # the parent was stored before we subscribed: this chain cannot be named
                return []
            seed = found
        ours = chain_hashes(tokens, seed, block_size)
        for engine_hash, our_hash in zip(engine_hashes, ours, strict=True):
            self._ours[engine_hash] = our_hash
            self._ours.move_to_end(engine_hash)
        while len(self._ours) > self.config.max_mapped:
            self._ours.popitem(last=False)
        return ours

    def _forget(self, engine_hash: EngineHash) -> int | None:
        return self._ours.pop(engine_hash, None)
