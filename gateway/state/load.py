"""``WorkerLoad``: one worker's in-flight and recent figures, as a load board reports them.
Compiled with mypyc (``docs/development.md``: what that rules out).

A plain class rather than a frozen dataclass so that it can be compiled with the request path
(``kvgate_core.native``): the routing snapshot builds one per worker per request, and a compiled class is
built and read in C where a dataclass runs its generated ``__init__`` interpreted. Its fields are ``Final``
(mypy rejects a write) and it compares, hashes and prints by value, like the dataclass it replaces.
"""

from __future__ import annotations

from typing import Final


class WorkerLoad:
    """In-flight work the gateway(s) sent a worker and have not seen finish, and what they routed lately.

    ``recent_tokens`` / ``recent_requests`` / ``recent_cached_tokens``: the prompt + completion-budget tokens
    (the requests; the prompt tokens predicted cached there) every replica routed to the worker,
    exponentially decayed (``gateway.state.recent``; a replica that leaves takes its share with it).
    ``recent_streams`` / ``recent_follow_ups``: of those requests, the ones that started a new stream there
    and the ones that followed one there (``policies.placement``), decayed the same way.
    """

    __slots__ = (
        "inflight_requests",
        "inflight_tokens",
        "recent_cached_tokens",
        "recent_follow_ups",
        "recent_requests",
        "recent_streams",
        "recent_tokens",
    )  # fmt: skip

    def __init__(
        self,
        inflight_requests: int = 0,
        inflight_tokens: int = 0,
        recent_tokens: float = 0.0,
        recent_requests: float = 0.0,
        recent_cached_tokens: float = 0.0,
        recent_streams: float = 0.0,
        recent_follow_ups: float = 0.0,
    ) -> None:
        self.inflight_requests: Final = inflight_requests
        self.inflight_tokens: Final = inflight_tokens
        self.recent_tokens: Final = recent_tokens
        self.recent_requests: Final = recent_requests
        self.recent_cached_tokens: Final = recent_cached_tokens
        self.recent_streams: Final = recent_streams
        self.recent_follow_ups: Final = recent_follow_ups

    def astuple(self) -> tuple[int, int, float, float, float, float, float]:
        """The fields in declaration order."""
        return (
            self.inflight_requests, self.inflight_tokens, self.recent_tokens, self.recent_requests,
            self.recent_cached_tokens, self.recent_streams, self.recent_follow_ups,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkerLoad):
            return NotImplemented
        return self.astuple() == other.astuple()

    def __hash__(self) -> int:
        return hash(self.astuple())

    def __repr__(self) -> str:
        return (
            f"WorkerLoad(inflight_requests={self.inflight_requests}, inflight_tokens={self.inflight_tokens}, "
            f"recent_tokens={self.recent_tokens}, recent_requests={self.recent_requests}, "
            f"recent_cached_tokens={self.recent_cached_tokens}, recent_streams={self.recent_streams}, "
            f"recent_follow_ups={self.recent_follow_ups})"
        )
