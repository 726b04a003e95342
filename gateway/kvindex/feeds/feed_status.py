"""Health of a foreign engine's KV event sources: counters, and whether the index can trust them.

A source is ``connecting`` until its first batch, ``flowing`` while batches arrive, ``quiet`` once no batch
came for ``quiet_after_s`` (since the last one, or since the start), and ``stopped`` when its feed ended.
Given ``activity`` (how many requests the gateway routed to the worker so far), silence counts only from
the first request routed there after the last batch: an idle engine publishes nothing and is not quiet.
A quiet source is reported (its state, and one WARNING line) and its worker's blocks are no longer trusted:
the engine may have stopped publishing (a restart without events, a broken socket) while the index still
holds what it said before. ``WorkerFeeds`` combines one worker's sources (one per data-parallel rank) and
calls ``on_quiet(worker_id)`` / ``on_flowing(worker_id)`` when the worker's combined state changes, so
routing can fall back for that worker and trust it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal

logger = logging.getLogger(__name__)

FeedState = Literal["connecting", "flowing", "quiet", "stopped"]
DEFAULT_QUIET_AFTER_S = 30.0


class FeedStatus:
    """Counters and state of one event source (one ZMQ publisher or one HTTP drain).

    Args:
        source: the source's address, for logs and ``as_dict``.
        clock: monotonic seconds.
        quiet_after_s: seconds without a batch after which the source is quiet.
        on_change: called with the new state on every state change.
        skipped: what the source's translator could not index, by reason (a live view, for ``as_dict``).
        activity: requests routed to the worker so far (a counter); None: silence alone makes it quiet.
    """

    def __init__(
        self,
        source: str,
        *,
        clock: Callable[[], float],
        quiet_after_s: float = DEFAULT_QUIET_AFTER_S,
        on_change: Callable[[FeedState], None] | None = None,
        skipped: Mapping[str, int] | None = None,
        activity: Callable[[], int] | None = None,
    ) -> None:
        self.source = source
        self.quiet_after_s = quiet_after_s
        self.state: FeedState = "connecting"
        self.started_at = clock()
        self.last_event_at: float | None = None
        self.last_seq = -1
        self.num_batches = 0
        self.num_bad_batches = 0
        self.num_gaps = 0
        self.num_replays = 0
        self.num_resyncs = 0
        self._clock = clock
        self._on_change = on_change
        self._skipped = skipped
        self._activity = activity
        self._routed_at_batch = activity() if activity is not None else 0
        self._pending_since: float | None = None  # first tick that saw a request routed after the last batch

    def note_batch(self) -> None:
        """A batch arrived (live or replayed, readable or not): the source is flowing."""
        self.last_event_at = self._clock()
        self.num_batches += 1
        if self._activity is not None:
            self._routed_at_batch = self._activity()
            self._pending_since = None
        self._enter("flowing")

    def tick(self) -> None:
        """Check for quiet; feeds call it at least once a second."""
        if self.state not in ("connecting", "flowing"):
            return
        since = self.last_event_at if self.last_event_at is not None else self.started_at
        if self._activity is not None:
            if self._pending_since is None:
                if self._activity() <= self._routed_at_batch:
                    return  # nothing routed there since the last batch: silence is expected
                self._pending_since = self._clock()
            since = self._pending_since
        if self._clock() - since >= self.quiet_after_s:
            logger.warning(
                "KV event source %s is quiet: no batch for %.0f s; its worker's blocks are not trusted",
                self.source, self.quiet_after_s,
            )  # fmt: skip
            self._enter("quiet")

    def stop(self) -> None:
        """The feed ended."""
        self._enter("stopped")

    def as_dict(self) -> dict[str, Any]:
        """The status as JSON-ready data (``last_event_age_s``: seconds since the last batch, or None)."""
        now = self._clock()
        return {
            "source": self.source,
            "state": self.state,
            "last_event_at": self.last_event_at,
            "last_event_age_s": None if self.last_event_at is None else round(now - self.last_event_at, 3),
            "last_seq": self.last_seq,
            "num_batches": self.num_batches,
            "num_bad_batches": self.num_bad_batches,
            "num_gaps": self.num_gaps,
            "num_replays": self.num_replays,
            "num_resyncs": self.num_resyncs,
            "skipped": dict(self._skipped or {}),
        }

    def _enter(self, state: FeedState) -> None:
        if state == self.state:
            return
        if self.state == "quiet" and state == "flowing":
            logger.info("KV event source %s is flowing again", self.source)
        self.state = state
        if self._on_change is not None:
            self._on_change(state)


class WorkerFeeds:
    """The event sources of one worker and their combined state.

    Combined: ``quiet`` when any source is quiet, else ``flowing`` when any flows, ``stopped`` when all
    stopped, else ``connecting``.

    Args:
        worker_id: the gateway registry id.
        engine: the engine kind (for ``as_dict``).
        on_quiet: called with ``worker_id`` when the combined state becomes ``quiet``.
        on_flowing: called with ``worker_id`` when it becomes ``flowing``.
    """

    def __init__(
        self,
        worker_id: str,
        engine: str,
        *,
        on_quiet: Callable[[str], None] | None = None,
        on_flowing: Callable[[str], None] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.engine = engine
        self.sources: list[FeedStatus] = []
        self._state: FeedState = "connecting"
        self._on_quiet = on_quiet
        self._on_flowing = on_flowing

    def add_source(
        self,
        source: str,
        *,
        clock: Callable[[], float],
        quiet_after_s: float = DEFAULT_QUIET_AFTER_S,
        skipped: Mapping[str, int] | None = None,
        activity: Callable[[], int] | None = None,
    ) -> FeedStatus:
        """A new source's status, wired to the combined state."""
        status = FeedStatus(
            source, clock=clock, quiet_after_s=quiet_after_s, on_change=self._changed, skipped=skipped,
            activity=activity,
        )  # fmt: skip
        self.sources.append(status)
        return status

    @property
    def state(self) -> FeedState:
        return self._state

    @property
    def trusted(self) -> bool:
        """Whether the index's blocks for this worker can be trusted (no source quiet or stopped)."""
        return self._state in ("connecting", "flowing")

    def as_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "state": self._state,
            "trusted": self.trusted,
            "sources": [s.as_dict() for s in self.sources],
        }

    def _changed(self, _state: FeedState) -> None:
        states = {s.state for s in self.sources}
        new: FeedState
        if "quiet" in states:
            new = "quiet"
        elif "flowing" in states:
            new = "flowing"
        elif states == {"stopped"}:
            new = "stopped"
        else:
            new = "connecting"
        if new == self._state:
            return
        self._state = new
        if new == "quiet" and self._on_quiet is not None:
            self._on_quiet(self.worker_id)
        elif new == "flowing" and self._on_flowing is not None:
            self._on_flowing(self.worker_id)
