"""kvgate workers' feed: a worker's ``GET /kv/blocks`` snapshot and its ``GET /kv/events`` SSE stream.

``run_worker_feed`` keeps one worker's feed alive (reconnects with capped exponential backoff). On every
(re)connect it opens the SSE stream first, then fetches the snapshot and hands it over (the consumer clears
the worker's entries and stores the snapshot), then passes on the buffered and live events: every event
after the snapshot point is applied after the snapshot, so the result is exact. Where the events go (the
local index, or the Redis stream) is the caller's sink; the Redis stream side lives in
``backplane/stream.py``.

Worker ids: a worker names itself in its events and snapshot (its self-reported id); the gateway registry
has its own id for it. ``AliasMap`` maps the first to the second and is learned from each snapshot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from kvgate_core.h1 import H1Connection, H1Pool, Target, UpstreamConnectionError
from kvgate_core.kvcontract.events import (
    EventDecodeError,
    EventType,
    KVEvent,
    Tier,
    are_block_hashes,
    event_from_dict,
    new_event,
)

logger = logging.getLogger(__name__)

EventsSink = Callable[[Sequence[KVEvent]], Awaitable[None]]
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class BlocksSnapshot:
    """A worker's ``GET /kv/blocks``: its self-reported id, block size and the hashes per tier."""

    worker: str
    block_size: int
    tiers: dict[Tier, tuple[int, ...]]

    def as_events(self, worker: str) -> list[KVEvent]:
        """``cleared`` for the worker's GPU entries, then ``stored`` per tier, all under ``worker``."""
        events = [KVEvent(worker=worker, type=EventType.CLEARED, tier=Tier.GPU)]
        events.extend(
            KVEvent(worker=worker, type=EventType.STORED, tier=tier, hashes=hashes)
            for tier, hashes in self.tiers.items()
            if hashes
        )
        return events


def parse_snapshot(obj: Any) -> BlocksSnapshot:
    """Validate a ``/kv/blocks`` body: ``{"worker": id, "block_size": n, "tiers": {"gpu": [...], ...}}``.

    Raises:
        EventDecodeError: the body does not have that shape.
    """
    if not isinstance(obj, dict):
        raise EventDecodeError("/kv/blocks must be a JSON object")
    worker, block_size, tiers = obj.get("worker"), obj.get("block_size"), obj.get("tiers")
    if not isinstance(worker, str) or not isinstance(block_size, int) or not isinstance(tiers, dict):
        raise EventDecodeError("/kv/blocks needs worker (str), block_size (int) and tiers (object)")
    parsed: dict[Tier, tuple[int, ...]] = {}
    for name, hashes in tiers.items():
        try:
            tier = Tier(name)
        except ValueError as exc:
            raise EventDecodeError(f"/kv/blocks: unknown tier {name!r}") from exc
        if not isinstance(hashes, list) or not are_block_hashes(hashes):
            raise EventDecodeError(f"/kv/blocks: tier {name!r} must list unsigned 64-bit hashes")
        parsed[tier] = tuple(hashes)
    return BlocksSnapshot(worker=worker, block_size=block_size, tiers=parsed)


def parse_event_payload(data: bytes | str) -> list[KVEvent]:
    """One SSE ``data`` payload or stream field: a JSON event object or an array of them.

    Raises:
        EventDecodeError: not JSON, or not events.
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise EventDecodeError(f"event payload is not JSON: {exc}") from exc
    if isinstance(obj, list):
        return [event_from_dict(o) for o in obj]
    return [event_from_dict(obj)]


class AliasMap:
    """Self-reported worker id -> gateway registry id; unknown ids pass through unchanged."""

    __slots__ = ("_to_registry",)

    def __init__(self) -> None:
        self._to_registry: dict[str, str] = {}

    def learn(self, reported: str, registry_id: str) -> None:
        self._to_registry[reported] = registry_id

    def forget(self, registry_id: str) -> None:
        for reported in [r for r, g in self._to_registry.items() if g == registry_id]:
            del self._to_registry[reported]

    def resolve(self, reported: str) -> str:
        return self._to_registry.get(reported, reported)

    def translate(self, events: Sequence[KVEvent]) -> list[KVEvent]:
        """Events with the worker field mapped to registry ids."""
        get = self._to_registry.get
        # a constructor, not ``dataclasses.replace``: several times cheaper per event on the feed's path
        new = new_event
        return [e if (w := get(e.worker)) is None else new(w, e.type, e.tier, e.hashes, e.ts) for e in events]


@dataclass(frozen=True, slots=True)
class FeedConfig:
    """Reconnect and validation settings of a worker feed."""

    block_size: int
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0


async def fetch_snapshot(client: httpx.AsyncClient, url: str) -> BlocksSnapshot:
    """GET ``{url}/kv/blocks`` and validate it."""
    resp = await client.get(f"{url.rstrip('/')}/kv/blocks")
    resp.raise_for_status()
    return parse_snapshot(orjson.loads(resp.content))


async def sse_data(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``data`` payloads of an SSE byte stream, split as they arrive (multi-line data joined by newlines;
    comments and other fields skipped; LF or CRLF line ends). Bytes, not text lines: the feed's payloads go
    straight to orjson, and httpx's text line decoder costs more than the parsing."""
    pending = b""
    buf: list[bytes] = []
    async for chunk in chunks:
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if buf:
                    yield b"\n".join(buf)
                    buf = []
            elif line.startswith(b"data:"):
                buf.append(line[5:].removeprefix(b" "))
    if pending.startswith(b"data:"):
        buf.append(pending[5:].rstrip(b"\r").removeprefix(b" "))
    if buf:
        yield b"\n".join(buf)


async def run_worker_feed(
    *,
    url: str,
    client: httpx.AsyncClient,
    config: FeedConfig,
    on_snapshot: Callable[[BlocksSnapshot], Awaitable[None]],
    on_events: EventsSink,
) -> None:
    """Follow one worker forever: snapshot + SSE events, reconnecting with backoff. Cancel to stop."""
    delay = config.backoff_initial_s
    while True:
        try:
            await _follow_once(url, client, config, on_snapshot, on_events)
            delay = config.backoff_initial_s
        except (httpx.HTTPError, ValueError, OSError) as exc:
            logger.info("kv feed from %s interrupted (%s); retrying in %.1fs", url, exc, delay)
        except Exception:  # task boundary: a bug must not kill the gateway's task group
            logger.exception("kv feed from %s failed; retrying in %.1fs", url, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, config.backoff_max_s)


async def _follow_once(
    url: str,
    client: httpx.AsyncClient,
    config: FeedConfig,
    on_snapshot: Callable[[BlocksSnapshot], Awaitable[None]],
    on_events: EventsSink,
) -> None:
    # The event stream runs on the gateway's own HTTP/1.1 client (kvgate_core.h1), not httpx: its chunks
    # arrive with every request a worker serves, and httpx's layers cost more than parsing them.
    target = Target.parse(url)
    conn = await H1Pool(connect_timeout_s=CONNECT_TIMEOUT_S).post(target, target.get_request(b"/kv/events"))
    try:
        if conn.status != 200:
            raise UpstreamConnectionError(f"GET {url.rstrip('/')}/kv/events answered HTTP {conn.status}")
        snapshot = await fetch_snapshot(client, url)
        if snapshot.block_size != config.block_size:
            raise EventDecodeError(
                f"worker {url} uses block size {snapshot.block_size}, the gateway {config.block_size}: "
                "start both with the same --block-size (its blocks cannot match otherwise)"
            )
        await on_snapshot(snapshot)
        async for data in sse_data(_body(conn)):
            await on_events(parse_event_payload(data))
    finally:
        conn.abort()


async def _body(conn: H1Connection) -> AsyncIterator[bytes]:
    while chunk := await conn.read_chunk():
        yield chunk
