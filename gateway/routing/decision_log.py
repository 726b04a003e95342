"""The last routing decisions, kept for the admin page (``GET /admin/ui/state``).
Compiled with mypyc (``docs/development.md``: what that rules out).

``Router.route`` appends each decision with the snapshot it was made on: one tuple into a bounded deque, O(1),
nothing formatted; compiled with the request path (``kvgate_core.native``). ``recent`` formats them only when
the page asks (``gateway.routing.decisions``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from gateway.routing.decisions import Entry, RecentDecision, format_entry
from policies.api import Decision, RouteRequest, WorkerView


class DecisionLog:
    """The last ``size`` decisions, newest last."""

    __slots__ = ("_clock", "_entries")

    def __init__(self, size: int = 50, clock: Callable[[], float] = time.monotonic) -> None:
        if size <= 0:
            raise ValueError("size must be positive")
        self._entries: deque[Entry] = deque(maxlen=size)
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self,
        req: RouteRequest,
        decision: Decision,
        views: tuple[WorkerView, ...],
        prefill_worker: str | None = None,
    ) -> None:
        """Keep one decision (``prefill_worker``: the PD prefill worker used, if any)."""
        self._entries.append((self._clock(), req, decision, views, prefill_worker))

    def recent(self, block_size: int, *, limit: int | None = None, top: int = 4) -> list[RecentDecision]:
        """The newest ``limit`` decisions (all kept by default), newest first, each with at most ``top``
        candidates: the chosen worker, then the others by score (prefix hit, then id, on ties)."""
        now = self._clock()
        entries = list(self._entries)[::-1][:limit]
        return [format_entry(entry, now, block_size, top) for entry in entries]
