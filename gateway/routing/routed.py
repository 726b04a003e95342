"""``Routed``: a routing decision with what the proxy needs to carry it out.
Compiled with mypyc (``docs/development.md``: what that rules out).

A plain class compiled with the request path (``kvgate_core.native``), not a frozen dataclass: the proxy
reads its fields a dozen times per request, and compiled code reads a compiled class's fields from its
struct where an interpreted dataclass costs a generic attribute lookup each. Its fields are ``Final`` (mypy
rejects a write); ``without_prefill`` and ``moved_to`` stand for the copies ``dataclasses.replace`` made.
"""

from __future__ import annotations

from typing import Final

from gateway.fleet.registry import WorkerRecord
from gateway.routing.prefill_watch import Ticket
from policies.api import Decision, RouteRequest


class Routed:
    """A decision with what the proxy needs: the chosen record and its predicted cached tokens.

    Attributes:
        request, decision: what was routed and the policy's answer.
        record: the chosen worker; ``prefix_hit_tokens``: the prompt tokens predicted cached there, in its
            engine's tokens (what its usage will report).
        prefill: PD: the prefill worker (None: the decode worker prefills).
        best_hit_tokens: the best predicted hit on any worker (closed-loop feedback).
        balanced: placed by load or pinned, not by the policy: its observer is not told.
        ticket: its share of the worker's pending prefill (``Router.first_token``).
        uncached_tokens: the prompt's tokens not predicted cached, in the gateway's tokens (the load the
            request brings, counted like every other load figure); by default the prompt less
            ``prefix_hit_tokens``, which is right where the gateway's tokens are the engine's.
    """

    __slots__ = (
        "balanced", "best_hit_tokens", "decision", "prefill", "prefix_hit_tokens", "record", "request",
        "ticket", "uncached_tokens",
    )  # fmt: skip

    def __init__(
        self,
        request: RouteRequest,
        decision: Decision,
        record: WorkerRecord,
        prefix_hit_tokens: int,
        prefill: WorkerRecord | None = None,
        best_hit_tokens: int = 0,
        balanced: bool = False,
        ticket: Ticket | None = None,
        uncached_tokens: int = -1,
    ) -> None:
        self.request: Final = request
        self.decision: Final = decision
        self.record: Final = record
        self.prefix_hit_tokens: Final = prefix_hit_tokens
        self.prefill: Final = prefill
        self.best_hit_tokens: Final = best_hit_tokens
        self.balanced: Final = balanced
        self.ticket: Final = ticket
        self.uncached_tokens: Final = (
            uncached_tokens if uncached_tokens >= 0 else max(0, request.num_prompt_tokens - prefix_hit_tokens)
        )

    @property
    def prefill_id(self) -> str | None:
        return self.prefill.id if self.prefill is not None else None

    def without_prefill(self) -> Routed:
        """The same decision served by its decode worker alone (a PD prefill failed)."""
        return Routed(
            self.request, self.decision, self.record, self.prefix_hit_tokens, None, self.best_hit_tokens,
            self.balanced, self.ticket, self.uncached_tokens,
        )  # fmt: skip

    def moved_to(self, record: WorkerRecord) -> Routed:
        """The request served by ``record`` instead, placed there by load (no predicted hit)."""
        return Routed(
            self.request, self.decision, record, 0, self.prefill, self.best_hit_tokens, True, self.ticket
        )

    def __repr__(self) -> str:
        return (
            f"Routed(worker={self.record.id!r}, prefix_hit_tokens={self.prefix_hit_tokens}, "
            f"prefill={self.prefill_id!r}, balanced={self.balanced}, decision={self.decision!r})"
        )
