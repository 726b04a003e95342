"""The last routing decisions as the admin page shows them: what was asked, whom the policy chose and why,
and how the best candidates scored.

``DecisionLog`` (``gateway.routing.decision_log``, compiled with the request path) keeps them unformatted;
these interpreted dataclasses are the page's response model (pydantic reads their annotations).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.api import Decision, RouteRequest, WorkerView

# (monotonic time, request, decision, snapshot, prefill worker actually used)
Entry = tuple[float, RouteRequest, Decision, tuple[WorkerView, ...], str | None]


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


def format_entry(entry: Entry, now: float, block_size: int, top: int) -> RecentDecision:
    """A decision ``DecisionLog`` kept, as the admin page shows it (at most ``top`` candidates)."""
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
