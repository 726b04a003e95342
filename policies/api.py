"""The routing policy API: value types a policy sees and returns, and the plugin protocols.

This module imports only the standard library. Built-in policies live in ``policies.builtin``; the
runtime that composes filters, scorers and pickers lives in ``policies.pipeline``; discovery of
third-party policies (entry-point group ``kvgate.policies``) lives in ``policies.registry``.

Contract shared by every protocol here:

- Calls are synchronous, side-effect free on their inputs, and do no I/O. The gateway gathers tokens,
  block hashes, prefix hits and load first, then hands a frozen snapshot to the policy.
- Inputs are never mutated. Randomness comes only from ``PolicyContext.rng`` so a fixed seed gives a
  fixed decision.
- A policy declares the inputs it reads in ``needs``; the gateway skips tokenizing and the KV index
  lookup when no configured policy needs them.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NewType, Protocol, runtime_checkable

WorkerId = NewType("WorkerId", str)


class Role(StrEnum):
    """What a worker may be used for."""

    BOTH = "both"
    PREFILL = "prefill"
    DECODE = "decode"


class Need(StrEnum):
    """Inputs that the gateway computes only when a policy asks for them."""

    TOKENS = "tokens"
    BLOCK_HASHES = "block_hashes"
    PREFIX_HITS = "prefix_hits"


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a policy knows about the request being routed.

    Attributes:
        model: the model name the client asked for.
        num_prompt_tokens: prompt length in tokens (0 when tokens were not needed).
        block_hashes: the prompt's full-block hashes in the kvcontract scheme (empty when not needed).
        session_id: a sticky-session key (header ``x-session-id`` or the body's ``user``), if any.
        headers: request headers, lower-cased names.
        max_tokens: the completion budget the client asked for (None when unset).
    """

    model: str
    num_prompt_tokens: int = 0
    block_hashes: tuple[int, ...] = ()
    session_id: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A read-only snapshot of one worker at routing time.

    Attributes:
        id: stable worker id.
        role: the pool it serves.
        healthy: health checks pass and its circuit breaker is closed.
        inflight_requests: requests the gateway(s) sent it that have not finished.
        inflight_tokens: prompt + expected completion tokens of those requests.
        queue_depth: requests waiting on the worker (its last ``/load``, less one per request the gateway saw
            finish there since), 0 when unknown.
        kv_usage: fraction of its KV cache in use, in [0, 1].
        gpu_hit_blocks: leading blocks of this request the index places in the worker's own cache.
        tier_hit_blocks: further leading blocks present in the shared dram/ssd tiers.
        recent_tokens: prompt + completion-budget tokens every gateway replica routed to the worker lately,
            exponentially decayed (the gateway's ``--recent-half-life-s``); only requests whose prompt was
            tokenized count their prompt. The same figure on every replica (up to the state sync interval).
        recent_requests: requests routed to the worker lately, decayed the same way.
        recent_cached_tokens: the part of ``recent_tokens`` that was prompt predicted cached on the worker
            when routed (work the worker did not have to prefill), decayed the same way.
        recent_streams: requests placed on the worker lately that no candidate held materially more of
            (new sessions, cold prefixes, one-offs: ``policies.placement``), decayed the same way.
        recent_follow_ups: requests sent to the worker lately because it held more of their prompt than the
            least-holding candidate, decayed the same way.
        prefill_tokens: of ``inflight_tokens``, the prompt tokens (predicted uncached) of requests that have
            not produced their first token yet: the prefill queued or running on the worker. None where the
            gateway cannot tell (it has not seen a first token reported yet).
    """

    id: WorkerId
    role: Role = Role.BOTH
    healthy: bool = True
    inflight_requests: int = 0
    inflight_tokens: int = 0
    queue_depth: int = 0
    kv_usage: float = 0.0
    gpu_hit_blocks: int = 0
    tier_hit_blocks: int = 0
    recent_tokens: float = 0.0
    recent_requests: float = 0.0
    recent_cached_tokens: float = 0.0
    recent_streams: float = 0.0
    recent_follow_ups: float = 0.0
    prefill_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer.

    Attributes:
        worker: the worker that serves the request (the decode worker under PD).
        prefill_worker: under PD, the worker that computes the prompt's KV first; else None.
        scores: per-worker scores in [0, 1] (for explanations and ``/admin/route``).
        reason: a short human-readable reason.
    """

    worker: WorkerId | None
    prefill_worker: WorkerId | None = None
    scores: Mapping[WorkerId, float] = field(default_factory=dict)
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to a routed request, reported to observers when it finishes."""

    decision: Decision
    request: RouteRequest
    ok: bool
    cached_tokens: int | None = None
    latency_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """Everything a policy factory may use: a clock, a seeded RNG, a logger, the KV block size,
    ``replicas()``: how many gateway replicas route the same fleet now, this one included (they see each
    other's routing only after the shared state's sync interval; 1 without shared state), and
    ``replica_rank()``: this replica's position among them, in ``[0, replicas())``, a different one each."""

    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("kvgate.policies"))
    block_size: int = 16
    replicas: Callable[[], int] = field(default=lambda: 1)
    replica_rank: Callable[[], int] = field(default=lambda: 0)


@runtime_checkable
class Filter(Protocol):
    """Narrows the candidate workers.

    ``filter`` returns a subsequence of ``workers`` (same objects, same order); an empty result means no
    worker qualifies.
    """

    name: str

    def filter(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Sequence[WorkerView]: ...


@runtime_checkable
class Scorer(Protocol):
    """Scores candidate workers; 1 is best, 0 worst. Out-of-range scores are clamped by the pipeline.

    The result maps every worker id of ``workers`` to a score; a missing id counts as 0.
    """

    name: str

    def score(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Mapping[WorkerId, float]: ...


@runtime_checkable
class Picker(Protocol):
    """Chooses one worker from scored candidates; None only when ``scored`` is empty."""

    name: str

    def pick(self, req: RouteRequest, scored: Sequence[tuple[WorkerView, float]]) -> WorkerView | None: ...


@runtime_checkable
class Policy(Protocol):
    """Chooses the worker(s) for a request.

    ``select`` returns a ``Decision`` whose ``worker`` is None when no worker qualifies (the gateway then
    answers 503). It never returns an unhealthy worker or one whose role cannot serve the request.
    """

    name: str
    needs: frozenset[Need]

    def select(self, req: RouteRequest, workers: Sequence[WorkerView]) -> Decision: ...


@runtime_checkable
class Observer(Protocol):
    """Optional hooks for policies that keep state (cursors, session tables, predicted caches)."""

    def on_routed(self, req: RouteRequest, decision: Decision) -> None: ...

    def on_finished(self, outcome: Outcome) -> None: ...


@runtime_checkable
class Decider(Protocol):
    """Under PD: whether a request should be prefilled on a separate worker."""

    def disaggregate(self, req: RouteRequest, decode_worker: WorkerView) -> bool: ...


PolicyFactory = Callable[[PolicyContext, Mapping[str, Any]], Policy]
"""Builds a policy instance from the context and its validated-by-the-factory params."""
