"""The last routing decisions, for the admin page: what was asked, whom the policy chose and why, and how
the best candidates scored.

``Router.route`` appends each decision with the snapshot it was made on (one tuple into a bounded deque:
O(1), nothing formatted). ``recent`` formats them only when the page asks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from policies.api import Decision, RouteRequest, WorkerView

# (monotonic time, request, decision, snapshot, prefill worker actually used)
_Entry = tuple[float, RouteRequest, Decision, tuple[WorkerView, ...], str | None]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One worker as the policy saw it: its score, predicted prefix hit and load."""

    id: str
    score: float | None
    hit_tokens: int
    inflight: int
    queue: int
    healthy: bool


@dataclass(frozen=True, slots=True)
class RecentDecision:
    """One decision, formatted: ``candidates`` holds the chosen worker and the best-scored others."""

    age_s: float
    model: str
    prompt_tokens: int
    blocks: int
    worker: str | None
    prefill_worker: str | None
    reason: str
    candidates: tuple[Candidate, ...]


class DecisionLog:
    """The last ``size`` decisions, newest last."""

    __slots__ = ("_clock", "_entries")

    def __init__(self, size: int = 50, clock: Callable[[], float] = time.monotonic) -> None:
        if size <= 0:
            raise ValueError("size must be positive")
        self._entries: deque[_Entry] = deque(maxlen=size)
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
        return [_format(entry, now, block_size, top) for entry in entries]


def _format(entry: _Entry, now: float, block_size: int, top: int) -> RecentDecision:
    at, req, decision, views, prefill = entry
    scores = decision.scores

    def rank(v: WorkerView) -> tuple[bool, float, int, str]:
        return (v.id != decision.worker, -(scores.get(v.id) or 0.0), -v.gpu_hit_blocks, v.id)

    chosen = sorted(views, key=rank)[:top]
    return RecentDecision(
        age_s=max(0.0, now - at),
        model=req.model,
        prompt_tokens=req.num_prompt_tokens,
        blocks=len(req.block_hashes),
        worker=decision.worker,
        prefill_worker=prefill,
        reason=decision.reason,
        candidates=tuple(
            Candidate(
                id=v.id,
                score=scores.get(v.id),
                hit_tokens=min(v.gpu_hit_blocks * block_size, req.num_prompt_tokens),
                inflight=v.inflight_requests,
                queue=v.queue_depth,
                healthy=v.healthy,
            )
            for v in chosen
        ),
    )
