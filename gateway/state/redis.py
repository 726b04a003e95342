"""Redis state for gateway replicas: a ``LoadBoard`` whose figures are shared through Redis.

Each replica counts its own in-flight work and recent routed work locally (synchronous, never waits on Redis)
and a background task publishes those figures and pulls the other replicas'. A replica writes its *absolute*
figures to its own hash ``kvgate:load:{replica}`` (``HSET`` + ``PEXPIRE``, one pipeline) rather than
``HINCRBY`` deltas: a lost write or a Redis restart then heals at the next push, and a replica that dies
vanishes with its key's TTL instead of leaving increments behind. Fields: ``epoch`` (``gateway.state.recent``)
and ``v``, every figure packed in one JSON value, ``{"k": "rtsqcnf", "w": {worker: [r, t, s, q, c, n, f]}}``:
in-flight requests / tokens, then the decayed sums of routed tokens / requests / predicted cached prompt
tokens / new streams / follow-ups relative to ``epoch``; ``k`` names the positions; and ``c``, written when a
push carries changes, the wall time of the oldest of them, from which the other replicas measure how late
they see them (``lag``, ``gateway.state.lag``). A pull parses one value
per replica instead of one Redis field per figure: a sync's client CPU with 8 workers and 4 replicas is 0.3 ms
packed vs 1.3 ms with a field per figure, and with 64 workers and 8 replicas 1.1 vs 18.7 ms (37% of a core at
20 syncs/s). Replicas of other versions share the board: a reader ignores letters it does not know and reads
missing ones as 0, and it still reads the older layout (one field per figure, ``{worker}\0{letter}``); while
it sees a replica that writes that layout (and so reads only it), it writes its own figures that way too.
Redis down: the board answers local figures only, ``degraded`` is set, a warning is logged once per interval,
and it recovers by itself.

The client is ``State.redis`` (``gateway.state.redis_client``), shared with the KV index's Redis side
(``gateway/kvindex/``) and the rate limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, cast

import orjson

from gateway.state.lag import LagRecorder
from gateway.state.protocols import State, WorkerLoad
from gateway.state.recent import RecentConfig, RecentSums, decayed
from gateway.state.redis_client import RedisClientSettings, open_redis
from policies.placement import Placement

if TYPE_CHECKING:
    from redis.asyncio import Redis


logger = logging.getLogger(__name__)

KEY_PREFIX: Final = "kvgate:load:"
_SEP: Final = "\x00"
_EPOCH: Final = b"epoch"
_PACKED: Final = b"v"
_CHANGED: Final = b"c"  # wall time of the oldest change a push carries (``LagRecorder``)
_RECENT_FIELDS: Final = ("s", "q", "c", "n", "f")  # field kinds of the recent sums, in ``SLOTS`` order
_LETTERS: Final = "rt" + "".join(_RECENT_FIELDS)  # a worker's figures in ``v``, in this order
_SLOT_OF: Final = {kind: i for i, kind in enumerate(_LETTERS)}
_NO_SUMS: Final = (0.0,) * len(_RECENT_FIELDS)  # a row's recent sums before any request (r and t stay ints)


@dataclass(frozen=True, slots=True)
class RedisLoadConfig:
    """Timing of the shared load board.

    Attributes:
        sync_interval_s: how often figures are pushed and pulled while the board is idle.
        busy_sync_interval_s: how often while it is busy: this replica's figures changed since the last
            push, or the last pull found another replica's changed. A burst of requests spread over the
            replicas is then seen by all of them within about this interval instead of
            ``sync_interval_s`` (``loadtest.route_sim --replicas 4 --sync-lag-s``: on the trace with
            bursts spread over 10 ms, four replicas' TTFT p50 is 1.07x one replica's at a 50 ms lag and
            1.02x at 10 ms), and an idle board costs no more than before. An idle board's first change
            wakes it at once.
        busy_hold_s: how long after the last change it saw (its own, or another replica's at a pull) the
            board keeps the busy pace: a pull that lands between another replica's pushes finds nothing new,
            and without the hold it would drop to the idle pace in the middle of that replica's burst.
        key_ttl_s: a replica's figures disappear this long after its last push.
        warn_interval_s: at most one "Redis unreachable" warning per interval.
        discover_interval_s: how often the other replicas' keys are listed again (``SCAN``); in between,
            each sync reads the keys it knows, so a new replica counts within this interval.
    """

    sync_interval_s: float = 0.05
    busy_sync_interval_s: float = 0.01
    busy_hold_s: float = 0.05
    key_ttl_s: float = 5.0
    warn_interval_s: float = 30.0
    discover_interval_s: float = 1.0
    recent: RecentConfig = field(default_factory=RecentConfig)


class RedisLoadBoard:
    """``LoadBoard`` = this replica's own counts + the other replicas' last pulled counts."""

    def __init__(
        self,
        redis: Redis,
        *,
        replica_id: str | None = None,
        config: RedisLoadConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self.replica_id = replica_id or uuid.uuid4().hex
        self.config = config or RedisLoadConfig()
        self._clock = clock
        self._wall = wall_clock
        self._own: dict[str, list[int]] = {}  # worker -> [in-flight requests, in-flight tokens]
        self._recent = RecentSums(self.config.recent, wall_clock)
        self._others: dict[str, WorkerLoad] = {}  # recent figures as of ``_pulled_at``
        self._older_readers = False  # a replica that reads only one field per figure shares the board
        self._num_others = 0  # other replicas with a live key at the last pull
        self._rank = 0  # this replica's position among the live keys, sorted
        self._other_keys: list[bytes] = []  # the other replicas' keys, as of the last discovery
        self._discovered_at = float("-inf")
        self._pulled_at = 0.0
        self._last_warning = float("-inf")
        self.degraded = False
        self._changed = False  # own figures changed since the last push
        self._wake = asyncio.Event()  # set by an idle board's first change
        self._seen: list[bytes | None] = []  # the other replicas' packed figures at the last pull
        self.busy = False  # sync at ``busy_sync_interval_s``
        self._busy_until = float("-inf")  # ``busy`` holds until then (``busy_hold_s``)
        self.num_syncs = 0
        self._changed_at = 0.0  # wall time of the first change since the last push
        self._changes_seen: dict[bytes, bytes | None] = {}  # other replica's key -> its ``c``, last pull
        #: how old the other replicas' changes were when a pull took them in (kind ``load``)
        self.lag = LagRecorder()

    @property
    def key(self) -> str:
        return KEY_PREFIX + self.replica_id

    def acquire(self, worker: str, tokens: int) -> None:
        counts = self._own.setdefault(worker, [0, 0])
        counts[0] += 1
        counts[1] += tokens
        self._note_change()

    def release(self, worker: str, tokens: int) -> None:
        counts = self._own.setdefault(worker, [0, 0])
        counts[0] = max(0, counts[0] - 1)
        counts[1] = max(0, counts[1] - tokens)
        self._note_change()

    def add_routed(
        self, worker: str, tokens: int, cached_tokens: int = 0, placement: Placement = Placement.OTHER
    ) -> None:
        self._recent.add(worker, tokens, cached_tokens, placement)
        self._own.setdefault(worker, [0, 0])
        self._note_change()

    def _note_change(self) -> None:
        if self._changed:
            return
        self._changed = True
        self._changed_at = self._wall()
        if not self.busy:
            self._wake.set()

    def replicas(self) -> int:
        return 1 + self._num_others

    def rank(self) -> int:
        return self._rank

    def get(self, worker: str) -> WorkerLoad:
        return self.loads((worker,))[0]

    def loads(self, workers: Sequence[str]) -> list[WorkerLoad]:
        recent = self._recent
        now = recent.now()
        mine_scale = recent.scale(now)
        their_scale = decayed(1.0, self._pulled_at, now, recent.half_life_s)
        out = []
        for worker in workers:  # compiled code calls these methods and the constructor directly
            inflight, inflight_tokens = self._own.get(worker) or (0, 0)
            tokens, requests, cached, streams, follow_ups = recent.scaled(worker, mine_scale)
            other = self._others.get(worker)
            if other is not None:
                inflight += other.inflight_requests
                inflight_tokens += other.inflight_tokens
                tokens += other.recent_tokens * their_scale
                requests += other.recent_requests * their_scale
                cached += other.recent_cached_tokens * their_scale
                streams += other.recent_streams * their_scale
                follow_ups += other.recent_follow_ups * their_scale
            out.append(WorkerLoad(inflight, inflight_tokens, tokens, requests, cached, streams, follow_ups))
        return out

    def snapshot(self) -> Mapping[str, WorkerLoad]:
        return {w: self.get(w) for w in self._own.keys() | self._others.keys()}

    async def run(self) -> None:
        """Push and pull forever (cancel to stop); Redis errors degrade, never raise."""
        from redis.exceptions import RedisError

        task = asyncio.current_task()
        while True:
            try:
                await self.sync_once()
            except (RedisError, OSError) as exc:
                self._mark_down(exc)
            # redis-py can swallow a CancelledError raised mid-command; honour the pending cancel anyway.
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
            if self.busy or self.degraded:  # degraded: retry at the idle pace, whatever changes
                await asyncio.sleep(
                    self.config.busy_sync_interval_s if self.busy else self.config.sync_interval_s
                )
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.sync_interval_s):
                    await self._wake.wait()
            self._wake.clear()

    async def sync_once(self) -> None:
        """Publish this replica's figures and pull the others' (one pipelined round trip), listing the
        other replicas' keys again first when ``discover_interval_s`` has passed."""
        ttl_ms = int(self.config.key_ttl_s * 1000)
        own = self.key.encode()
        if self._clock() - self._discovered_at >= self.config.discover_interval_s:
            keys = [k async for k in self._redis.scan_iter(match=KEY_PREFIX + "*", count=100)]
            self._other_keys = [k for k in keys if k != own]
            self._discovered_at = self._clock()
        self._recent.now()  # rebase before publishing
        changed, self._changed = self._changed, False
        async with self._redis.pipeline(transaction=False) as pipe:
            figures: dict[str, list[float]] = {w: [*c, *_NO_SUMS] for w, c in self._own.items()}
            for w, sums in self._recent.items():
                figures.setdefault(w, [0, 0, *_NO_SUMS])[2:] = sums
            # written even with no figures yet: the key is also this replica's presence (``replicas``)
            mapping: dict[str, float | bytes] = {
                _EPOCH.decode(): self._recent.epoch,
                _PACKED.decode(): orjson.dumps({"k": _LETTERS, "w": figures}),
            }
            if changed:
                mapping[_CHANGED.decode()] = self._changed_at
            if self._older_readers:
                mapping.update(_field_layout(figures))
            pipe.hset(self.key, mapping=mapping)  # type: ignore[arg-type]
            pipe.pexpire(self.key, ttl_ms)
            others = self._other_keys
            for key in others:
                pipe.hgetall(key)
            hashes = cast("list[dict[bytes, bytes]]", (await pipe.execute())[2:])
        now = self._recent.now()
        self._others, bad = _sum_figures(hashes, now, self._recent.half_life_s)
        if bad and self._clock() - self._last_warning >= self.config.warn_interval_s:
            self._last_warning = self._clock()
            logger.warning("ignoring %d malformed load figure hash(es) of other replicas", bad)
        self._older_readers = any(h and _PACKED not in h for h in hashes)
        seen = [h.get(_PACKED) for h in hashes]
        if changed or seen != self._seen:
            self._busy_until = self._clock() + self.config.busy_hold_s
        self.busy = self._clock() < self._busy_until
        self._seen = seen
        self._note_lags(others, hashes)
        self.num_syncs += 1
        live = [key for key, h in zip(others, hashes, strict=True) if h]  # a gone replica's key reads empty
        self._num_others = len(live)
        self._rank = sum(1 for key in live if key < own)
        self._pulled_at = now
        if self.degraded:
            logger.warning("Redis state reachable again: load figures are fleet-wide")
        self.degraded = False

    def _note_lags(self, keys: Sequence[bytes], hashes: Sequence[dict[bytes, bytes]]) -> None:
        """Record, per other replica whose newest push carries changes this board has not seen, how old the
        oldest of them is now. From the second pull of a replica on: the ``c`` found at the first says
        nothing about the sync's delay. A push this board's pulls skipped is not counted (both boards run
        at the busy pace while either one's figures change, so that is rare under traffic)."""
        wall = self._wall()
        seen = self._changes_seen
        for key, fields in zip(keys, hashes, strict=True):
            stamp = fields.get(_CHANGED)
            if key in seen and stamp is not None and stamp != seen[key]:
                try:
                    self.lag.observe(wall - float(stamp))
                except ValueError:
                    pass  # a malformed stamp (a replica with a bug) tells nothing
            seen[key] = stamp
        if len(seen) > 2 * len(keys) + 16:  # replicas come and go: keep only the listed ones
            self._changes_seen = {key: seen.get(key) for key in keys}

    def _mark_down(self, exc: BaseException) -> None:
        self.degraded = True
        self.busy = False
        self._busy_until = float("-inf")
        self._others = {}
        self._num_others = 0
        self._rank = 0
        self._discovered_at = float("-inf")  # list the keys again once Redis answers
        now = self._clock()
        if now - self._last_warning >= self.config.warn_interval_s:
            self._last_warning = now
            logger.warning("Redis state unreachable (%s): load figures are this replica's only", exc)


def _field_layout(figures: dict[str, list[float]]) -> dict[str, float]:
    """The older layout of the same figures: one hash field per figure, ``{worker}\\0{letter}``."""
    return {
        f"{w}{_SEP}{kind}": v
        for w, values in figures.items()
        for kind, v in zip(_LETTERS, values, strict=True)
    }


def _figures_of(fields: dict[bytes, bytes]) -> dict[str, list[float]]:
    """One replica's figures per worker, in ``_LETTERS`` order (recent sums relative to its epoch), from
    either layout; unknown letters are ignored and missing ones read 0.

    Raises:
        ValueError, TypeError, KeyError, AttributeError: the hash is malformed.
    """
    out: dict[str, list[float]] = {}
    packed = fields.get(_PACKED)
    if packed is not None:
        body = orjson.loads(packed)
        slots = [_SLOT_OF.get(letter) for letter in body["k"]]
        for worker, values in body["w"].items():
            row = out[str(worker)] = [0.0] * len(_LETTERS)
            for slot, value in zip(slots, values, strict=False):
                if slot is not None:
                    row[slot] = float(value)
        return out
    for raw, value in fields.items():
        worker, _, kind = raw.decode().rpartition(_SEP)
        if (slot := _SLOT_OF.get(kind)) is not None and worker:
            out.setdefault(worker, [0.0] * len(_LETTERS))[slot] = float(value)
    return out


def _sum_figures(
    hashes: list[dict[bytes, bytes]], now: float, half_life_s: float
) -> tuple[dict[str, WorkerLoad], int]:
    """Other replicas' figures summed per worker, recent sums evaluated at ``now``; and how many hashes were
    malformed (a replica with a bug) and skipped rather than failing the sync."""
    totals: dict[str, list[float]] = {}
    bad = 0
    for fields in hashes:
        try:
            epoch = float(fields.get(_EPOCH, b"0"))
            figures = _figures_of(fields)
        except (ValueError, TypeError, KeyError, AttributeError):
            bad += 1
            continue
        keep = decayed(1.0, epoch, now, half_life_s)
        for worker, values in figures.items():
            row = totals.setdefault(worker, [0.0] * len(_LETTERS))
            row[0] += values[0]
            row[1] += values[1]
            for i in range(2, len(_LETTERS)):
                row[i] += values[i] * keep
    return {w: WorkerLoad(int(v[0]), int(v[1]), *v[2:]) for w, v in totals.items()}, bad


@contextlib.asynccontextmanager
async def open_redis_state(
    url: str, *, config: RedisLoadConfig | None = None, client: RedisClientSettings | None = None
) -> AsyncIterator[State]:
    """Open the Redis state named by ``url``: a ``State`` whose ``load`` is a ``RedisLoadBoard`` and whose
    ``redis`` is the gateway's one Redis client (``open_redis``), named ``{client_name}:{replica id}``.

    The client is opened here and closed on exit (after the KV service and the rate limits, opened later,
    are done with it); the sync task runs for the context's lifetime. A Redis that is down at start is not
    an error: the board starts degraded and recovers by itself.

    Raises:
        ValueError: ``url`` is not a Redis URL the client can parse.
    """
    from redis.exceptions import RedisError

    settings = client or RedisClientSettings()
    replica_id = uuid.uuid4().hex
    if settings.client_name is not None:
        settings = dataclasses.replace(settings, client_name=f"{settings.client_name}:{replica_id}")
    async with open_redis(url, settings) as redis:
        board = RedisLoadBoard(redis, replica_id=replica_id, config=config)
        try:
            body_error: BaseException | None = None
            async with asyncio.TaskGroup() as tasks:
                task = tasks.create_task(board.run(), name="redis-load-board")
                try:
                    yield State(load=board, url=url, redis=redis)
                except BaseException as exc:  # noqa: BLE001 - re-raised unchanged below, not wrapped in a group
                    body_error = exc
                finally:
                    task.cancel()
            if body_error is not None:
                raise body_error
        finally:
            with contextlib.suppress(RedisError, OSError):
                await redis.delete(board.key)
