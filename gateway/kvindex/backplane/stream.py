"""The Redis stream ``kvgate:events`` shared by gateway replicas: publishing, consuming, relay leadership.

Entry format: one field ``e`` holding a JSON array of KV events (a single JSON object is accepted too), so
a publisher batches what it has, and optionally ``t``: the wall time the relaying replica received the batch
from its worker, from which readers measure how late they apply it (``gateway.state.lag``). The stream is
capped with ``MAXLEN ~``; a replica that falls behind the cap, or starts late, rebuilds from the workers'
``/kv/blocks`` snapshots, not from stream history.

Relay leadership: exactly one replica relays a given worker's SSE feed to the stream; it holds the key
``kvgate:relay:{worker}`` (set with a TTL, renewed by the holder) so N replicas do not publish N copies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, cast

from gateway.kvindex.feeds.kvgate import parse_event_payload
from gateway.state.lag import LagRecorder
from gateway.state.redis_client import MAX_BLOCK_S
from kvgate_core.kvcontract.events import EVENTS_STREAM, EventDecodeError, KVEvent, encode_events

if TYPE_CHECKING:
    from redis.asyncio import Redis

logger = logging.getLogger(__name__)

EVENT_FIELD: Final = b"e"
TIME_FIELD: Final = b"t"
DEFAULT_MAXLEN: Final = 100_000

_CLAIM_SCRIPT: Final = """
local v = redis.call('get', KEYS[1])
if v == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end
if not v then redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""


async def publish_events(
    redis: Redis,
    events: Sequence[KVEvent],
    *,
    stream: str = EVENTS_STREAM,
    maxlen: int = DEFAULT_MAXLEN,
    received_at: float | None = None,
) -> bytes | None:
    """XADD one batch of events (approximately capped at ``maxlen`` entries), with ``received_at`` (wall
    time the batch came from its worker) as ``t`` when given; returns the entry id.

    Raises:
        redis.RedisError: Redis is unreachable (callers degrade, see ``service.py``).
    """
    if not events:
        return None
    fields: dict[bytes, bytes] = {EVENT_FIELD: encode_events(events)}
    if received_at is not None:
        fields[TIME_FIELD] = repr(received_at).encode()
    entry_id = await redis.xadd(stream, fields, maxlen=maxlen, approximate=True)  # type: ignore[arg-type]
    return entry_id if isinstance(entry_id, bytes) else str(entry_id).encode()


async def last_entry_id(redis: Redis, stream: str = EVENTS_STREAM) -> bytes:
    """Id of the newest entry, or ``0-0`` for an empty or missing stream."""
    newest = cast("list[tuple[bytes, object]]", await redis.xrevrange(stream, count=1))
    return bytes(newest[0][0]) if newest else b"0-0"


_RELEASE_SCRIPT: Final = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


async def claim_relay(redis: Redis, worker: str, token: str, ttl_ms: int) -> bool:
    """Take or renew the relay lease of ``worker``; false when another replica holds it."""
    return bool(await redis.eval(_CLAIM_SCRIPT, 1, f"kvgate:relay:{worker}", token, ttl_ms))


async def release_relay(redis: Redis, worker: str, token: str) -> None:
    """Give up the relay lease of ``worker`` if this replica holds it (another takes over at once)."""
    await redis.eval(_RELEASE_SCRIPT, 1, f"kvgate:relay:{worker}", token)


class StreamReader:
    """Reads a stream (``kvgate:events`` by default) from a position on, handing each entry to a callback.

    ``read_once`` blocks at most ``block_ms`` (by default ``MAX_BLOCK_S``, which the shared client's socket
    timeout outlasts); errors (Redis down) propagate to the caller's loop.
    """

    __slots__ = ("_on_payload", "_redis", "_stream", "_wall", "block_ms", "lag", "last_id", "num_bad_entries")

    def __init__(
        self,
        redis: Redis,
        on_events: Callable[[Sequence[KVEvent]], None] | None = None,
        *,
        start_id: bytes = b"0-0",
        stream: str = EVENTS_STREAM,
        block_ms: int = int(MAX_BLOCK_S * 1000),
        on_payload: Callable[[bytes], None] | None = None,
        lag: LagRecorder | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """Read ``stream``: each entry's ``e`` field goes to ``on_payload``, or is parsed as KV events for
        ``on_events``; a payload callback raises ``EventDecodeError`` for a bad entry (it is skipped).
        ``lag``: where to record how late an entry with a ``t`` field is applied."""
        if on_payload is None:
            if on_events is None:
                raise ValueError("StreamReader needs on_events or on_payload")
            events_sink = on_events

            def on_payload(data: bytes) -> None:
                events_sink(parse_event_payload(data))

        self._redis = redis
        self._on_payload = on_payload
        self._stream = stream
        self.block_ms = block_ms
        self.last_id = start_id
        self.num_bad_entries = 0
        self.lag = lag
        self._wall = wall_clock

    async def read_once(self, count: int = 512) -> int:
        """Apply the next entries (waiting up to ``block_ms``); returns how many were read."""
        reply = cast(
            "list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] | None",
            await self._redis.xread({self._stream: self.last_id}, count=count, block=self.block_ms),
        )
        n = 0
        for _stream, entries in reply or ():
            for entry_id, fields in entries:
                self.last_id = bytes(entry_id)
                n += 1
                self._apply_entry(fields)
        return n

    def _apply_entry(self, fields: dict[bytes, bytes]) -> None:
        data = fields.get(EVENT_FIELD)
        try:
            if data is None:
                raise EventDecodeError("stream entry has no 'e' field")
            self._on_payload(data)
        except EventDecodeError as exc:
            self.num_bad_entries += 1
            logger.warning("skipping bad entry %s on %s: %s", self.last_id, self._stream, exc)
            return
        if self.lag is not None and (stamp := fields.get(TIME_FIELD)) is not None:
            try:
                self.lag.observe(self._wall() - float(stamp))
            except ValueError:
                pass  # a malformed stamp tells nothing; the events were applied


def raise_if_cancelling() -> None:
    """Re-raise a cancellation of the current task that a library swallowed.

    redis-py can eat the ``CancelledError`` delivered while a command is in flight; a loop that keeps going
    after that would hang its task group's exit, so Redis loops call this once per iteration.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def wait_for_entry(reader: StreamReader, entry_id: bytes, timeout_s: float = 10.0) -> None:
    """Until ``reader`` has applied ``entry_id`` (tests and rebuild barriers poll with this)."""
    target = _id_tuple(entry_id)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while _id_tuple(reader.last_id) < target:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"stream reader did not reach {entry_id!r}")
        await asyncio.sleep(0.005)


def _id_tuple(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)
