"""TensorRT-LLM's HTTP KV-event drain: ``POST /kv_cache_events`` polled and mapped onto the ZMQ event types.

``trtllm-serve`` (with ``kv_cache_config.event_buffer_max_size > 0``) answers each POST with the events
queued since the last one and forgets them (``tensorrt_llm/_utils.py: KVCacheEventSerializer``)::

    [{"event_id": int, "window_size": int, "attention_dp_rank"?: int,
      "data": {"type": "created", ...}
            | {"type": "stored", "parent_hash": int|null,
               "blocks": [{"block_hash", "tokens": [{"token_id", "token_extra_id"}], "cache_level", ...}]}
            | {"type": "removed", "block_hashes": [int]}
            | {"type": "updated", ...} | {"type": "all_cleared"}}, ...]

Mapping (as TensorRT-LLM's own router and Dynamo read it): ``created`` and ``updated`` are ignored; only
events of the largest ``window_size`` seen are kept (a larger one appearing later clears what was indexed
from a smaller one); the block size is the configured one or the largest tokens-per-block seen, and a block
with fewer tokens (a partial block) is dropped with whatever follows it; a block with a non-zero
``token_extra_id`` (multimodal) or a secondary ``cache_level`` ends what is indexed of its event. A gap in
``event_id`` (per attention-DP rank) or a larger block size than assumed is a resync (``AllBlocksCleared``).
LoRA ids are not serialized by TensorRT-LLM, so its blocks are named in the base model's namespace.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gateway.kvindex.feeds.decode import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineEvent,
    UnknownEvent,
)
from gateway.kvindex.feeds.feed_status import FeedStatus
from gateway.kvindex.feeds.rechunk import EngineEventTranslator
from kvgate_core.kvcontract.events import EventDecodeError, KVEvent

logger = logging.getLogger(__name__)

DRAIN_PATH = "/kv_cache_events"
PostJson = Callable[[str], Awaitable[Any]]


class DrainError(Exception):
    """The drain could not be read (connection, HTTP status or body); the poller retries."""


class TrtllmDrainMapper:
    """Maps drained JSON events to ``EngineEvent``s for one worker (stateful: window, ids, block size).

    Args:
        status: where gaps and resyncs are counted.
        skipped: where dropped blocks are counted by reason (the translator's counter).
        block_size: the engine's ``tokens_per_block`` when known; else learned from the events.
    """

    def __init__(self, status: FeedStatus, skipped: Counter[str], block_size: int | None = None) -> None:
        self._status, self._skipped = status, skipped
        self._fixed_block = block_size
        self._block: int | None = block_size
        self._window: int | None = None
        self._stored_in_window = False  # a larger window then clears what the smaller one stored
        self._last_ids: dict[int, int] = {}

    def map(self, raw: Any) -> list[EngineEvent]:
        """The engine events of one drained list, with ``AllBlocksCleared`` where a resync is due.

        Raises:
            EventDecodeError: the body is not a list of event objects.
        """
        if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
            raise EventDecodeError("TensorRT-LLM /kv_cache_events must answer a list of event objects")
        out: list[EngineEvent] = []
        for item in raw:
            self._check_id(item, out)
            data = item.get("data")
            if not isinstance(data, dict) or not self._keep_window(item, out):
                continue
            kind = data.get("type")
            if kind in ("created", "updated"):
                continue
            if kind == "stored":
                out.extend(self._stored(data, out))
            elif kind == "removed":
                out.append(BlockRemoved(_int_list(data.get("block_hashes")), medium="GPU"))
            elif kind == "all_cleared":
                out.append(AllBlocksCleared())
            else:
                out.append(UnknownEvent(str(kind)))
        return out

    def _check_id(self, item: dict[str, Any], out: list[EngineEvent]) -> None:
        event_id, rank = item.get("event_id"), item.get("attention_dp_rank") or 0
        if not isinstance(event_id, int):
            return
        last = self._last_ids.get(rank)
        if last is not None and event_id != last + 1:
            self._status.num_gaps += 1
            self._resync(f"event_id gap {last} -> {event_id}", out)
        self._last_ids[rank] = event_id

    def _keep_window(self, item: dict[str, Any], out: list[EngineEvent]) -> bool:
        window = item.get("window_size")
        if not isinstance(window, int):
            return True
        if self._window is not None and window < self._window:
            return False
        if self._window is not None and window > self._window:
            if self._stored_in_window:
                self._resync(f"a larger attention window ({window} > {self._window})", out)
            self._stored_in_window = False
        self._window = window
        return True

    def _stored(self, data: dict[str, Any], out: list[EngineEvent]) -> list[EngineEvent]:
        blocks = [b for b in data.get("blocks") or () if isinstance(b, dict)]
        tokens = [
            [t.get("token_id", -1) for t in b.get("tokens") or () if isinstance(t, dict)] for b in blocks
        ]
        if not blocks:
            return []
        longest = max(len(t) for t in tokens)
        if self._fixed_block is None and (self._block is None or longest > self._block):
            if self._block is not None:
                self._resync(f"a larger block size ({longest} > {self._block})", out)
            self._block = longest
        size = self._block
        assert size is not None, "set above"
        keep = 0
        for block, toks in zip(blocks, tokens, strict=True):
            reason = _block_reason(block, len(toks), size)
            if reason is not None:
                self._skipped[reason] += 1
                break
            keep += 1
        if keep == 0:
            return []
        self._stored_in_window = True
        return [
            BlockStored(
                block_hashes=[b["block_hash"] for b in blocks[:keep]],
                parent=data.get("parent_hash"),
                token_ids=[t for toks in tokens[:keep] for t in toks],
                block_size=size,
                medium="GPU",
                mm_keys=[["token_extra_id"] if _has_extra_ids(b) else [] for b in blocks[:keep]],
            )
        ]

    def _resync(self, why: str, out: list[EngineEvent]) -> None:
        self._status.num_resyncs += 1
        logger.warning("TensorRT-LLM KV events from %s: resync after %s", self._status.source, why)
        out.append(AllBlocksCleared())


def _block_reason(block: dict[str, Any], num_tokens: int, size: int) -> str | None:
    if num_tokens < size:
        return "partial block"
    if num_tokens > size:
        return "block larger than the configured block size"
    if not isinstance(block.get("block_hash"), int):
        return "block without an integer block_hash"
    if block.get("cache_level") not in (None, 0):
        return "block in a secondary cache level"
    return None


def _has_extra_ids(block: dict[str, Any]) -> bool:
    return any(isinstance(t, dict) and t.get("token_extra_id") for t in block.get("tokens") or ())


def _int_list(value: Any) -> list[int | bytes | str]:
    if not isinstance(value, list) or not all(isinstance(h, int) for h in value):
        raise EventDecodeError("TensorRT-LLM removed event: block_hashes must be a list of integers")
    return list(value)


async def run_trtllm_drain(
    url: str,
    *,
    post: PostJson,
    translator: EngineEventTranslator,
    sink: Callable[[Sequence[KVEvent]], None],
    status: FeedStatus,
    interval_s: float = 0.5,
    block_size: int | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Poll ``url + /kv_cache_events`` every ``interval_s``, events to ``sink``, until cancelled.

    Args:
        url: the worker's base URL.
        post: POSTs to a URL and returns the decoded JSON body; raises ``DrainError`` when it cannot.
        translator: the worker's translator (gateway block size, model).
        sink: receives each poll's kvgate events.
        status: the drain's status (a non-empty answer is a batch).
        interval_s: seconds between polls.
        block_size: the engine's tokens per block when known.
        sleep: ``asyncio.sleep`` (tests pass a fake).
    """
    mapper = TrtllmDrainMapper(status, translator.skipped, block_size)
    endpoint = url.rstrip("/") + DRAIN_PATH
    failing = False
    while True:
        try:
            raw = await post(endpoint)
            failing = False
        except DrainError as exc:
            if not failing:
                logger.warning("TensorRT-LLM KV event drain %s failed: %s (retrying)", endpoint, exc)
            failing, raw = True, []
        if raw:
            status.note_batch()
            _apply(raw, mapper, translator, sink, status)
        status.tick()
        await sleep(interval_s)


def _apply(
    raw: Any,
    mapper: TrtllmDrainMapper,
    translator: EngineEventTranslator,
    sink: Callable[[Sequence[KVEvent]], None],
    status: FeedStatus,
) -> None:
    try:
        events = mapper.map(raw)
    except EventDecodeError as exc:
        status.num_bad_batches += 1
        status.num_resyncs += 1
        logger.warning("TensorRT-LLM KV event drain %s: unreadable answer (%s): resync", status.source, exc)
        events = [AllBlocksCleared()]
    translated = translator.translate(events)
    if translated:
        sink(translated)
