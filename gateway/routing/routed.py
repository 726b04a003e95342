"""``Routed``: a routing decision with what the proxy needs to carry it out.

Kept apart from the router because the router is compiled (``kvgate_core.native``) and a frozen dataclass
defined in a compiled module is built through its interpreted ``__init__``; here ``fast_constructor`` can
build one per request cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.fleet.registry import WorkerRecord
from gateway.routing.prefill_watch import Ticket
from policies.api import Decision, RouteRequest


@dataclass(frozen=True, slots=True)
class Routed:
    """A decision with what the proxy needs: the chosen record and its predicted cached tokens."""

    request: RouteRequest
    decision: Decision
    record: WorkerRecord
    prefix_hit_tokens: int
    prefill: WorkerRecord | None = None  # PD: the prefill worker (None: the decode worker prefills)
    best_hit_tokens: int = 0  # the best predicted hit on any worker (closed-loop feedback)
    balanced: bool = False  # placed by load or pinned, not by the policy: its observer is not told
    ticket: Ticket | None = None  # its share of the worker's pending prefill (``Router.first_token``)

    @property
    def prefill_id(self) -> str | None:
        return self.prefill.id if self.prefill is not None else None
