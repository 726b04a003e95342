"""Filters for pipelines: ``healthy``, ``role`` and ``max_queue``.

What it does:
    ``healthy`` keeps workers whose health checks pass (the pipeline already applies it implicitly; it is
    here for explicit configs). ``role`` keeps workers whose role is one of ``roles``. ``max_queue`` keeps
    workers whose queue depth is at most ``max_queue_depth``; when no worker qualifies it keeps them all
    (it is a preference, not admission control), unless ``strict`` is true.

Inputs (needs):
    Nothing beyond the load snapshot (health, role, queue depth).

Parameters:
    role.roles: roles to keep, from ``both``, ``prefill``, ``decode`` (default ``[both]``).
    max_queue.max_queue_depth: the deepest queue a worker may have (default 32).
    max_queue.strict: when true, an empty result stays empty and the gateway answers 503 (default false).

Example config:
    policy:
      type: pipeline
      filters:
        - healthy
        - {type: role, params: {roles: [both]}}
        - {type: max_queue, params: {max_queue_depth: 16}}
      scorers: [inflight_tokens]
      picker: max_score

Limitations:
    A pipeline only ever sees ``both`` workers (the serving-role rule), so ``role`` can only narrow
    further there; it matters in PD sub-pipelines and third-party policies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.api import PolicyContext, Role, RouteRequest, WorkerView
from policies.plugins import Kind, NoParams, define


class HealthyFilter:
    """Keeps healthy workers."""

    name = "healthy"

    def filter(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Sequence[WorkerView]:
        return [w for w in workers if w.healthy]


@dataclass(frozen=True, slots=True)
class RoleParams:
    roles: tuple[str, ...] = (Role.BOTH.value,)

    def validate(self) -> None:
        valid = {r.value for r in Role}
        bad = [r for r in self.roles if r not in valid]
        if bad or not self.roles:
            raise ValueError(f"roles must be a non-empty list of {sorted(valid)}, got {list(self.roles)}")


class RoleFilter:
    """Keeps workers whose role is one of the configured roles."""

    name = "role"

    def __init__(self, params: RoleParams) -> None:
        self._roles = frozenset(Role(r) for r in params.roles)

    def filter(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Sequence[WorkerView]:
        return [w for w in workers if w.role in self._roles]


@dataclass(frozen=True, slots=True)
class MaxQueueParams:
    max_queue_depth: int = 32
    strict: bool = False

    def validate(self) -> None:
        if self.max_queue_depth < 0:
            raise ValueError("max_queue_depth must be >= 0")


class MaxQueueFilter:
    """Keeps workers whose queue is at most ``max_queue_depth`` deep (all if none is, unless strict)."""

    name = "max_queue"

    def __init__(self, params: MaxQueueParams) -> None:
        self._max = params.max_queue_depth
        self._strict = params.strict

    def filter(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Sequence[WorkerView]:
        kept = [w for w in workers if w.queue_depth <= self._max]
        return kept if kept or self._strict else workers


def _healthy(ctx: PolicyContext, params: NoParams) -> HealthyFilter:
    return HealthyFilter()


def _role(ctx: PolicyContext, params: RoleParams) -> RoleFilter:
    return RoleFilter(params)


def _max_queue(ctx: PolicyContext, params: MaxQueueParams) -> MaxQueueFilter:
    return MaxQueueFilter(params)


PLUGINS = (
    define("healthy", Kind.FILTER, NoParams, _healthy),
    define("role", Kind.FILTER, RoleParams, _role),
    define("max_queue", Kind.FILTER, MaxQueueParams, _max_queue),
)
