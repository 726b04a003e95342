"""Which of this gateway's in-flight requests still wait for their first token, per worker.
Compiled with mypyc (``docs/development.md``: what that rules out).

A worker's queue is the prefill ahead of a new request. In-flight tokens (``LoadBoard``) count every
request sent and not finished, most of which may be decoding already; the proxy sees each request's first
token, and once it reports them (``first_token``) the router can tell the policy how much of a worker's
in-flight work is prefill still to do (``WorkerView.prefill_tokens``). Other replicas' first tokens are
not seen here: their in-flight tokens count as not known to be past it.

Each request holds a ticket from ``open`` until ``close``; a ticket older than ``max_age_s`` (the
time-to-first-byte deadline: no prefill is pending past it) is dropped, so a path that never closes one
cannot leave a worker looking loaded for ever.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


class Ticket:
    """One request's share: ``prefill`` (its uncached prompt) pending until its first token, ``tokens``
    (prefill + completion budget) in flight until it ends."""

    # a plain class, not a dataclass: compiled (``kvgate_core.native``), one is built per request in C, where
    # a dataclass's generated ``__init__`` would run interpreted
    __slots__ = ("open", "opened_at", "pending", "prefill", "tokens", "worker")

    def __init__(
        self,
        worker: str,
        prefill: int,
        tokens: int,
        opened_at: float,
        pending: bool = True,
        open: bool = True,
    ) -> None:
        self.worker = worker
        self.prefill = prefill
        self.tokens = tokens
        self.opened_at = opened_at
        self.pending = pending
        self.open = open

    def __repr__(self) -> str:
        return (
            f"Ticket(worker={self.worker!r}, prefill={self.prefill}, tokens={self.tokens}, "
            f"opened_at={self.opened_at}, pending={self.pending}, open={self.open})"
        )


@dataclass(slots=True)
class _Worker:
    tickets: deque[Ticket] = field(default_factory=deque)
    pending: int = 0  # prefill tokens of open tickets still pending
    inflight: int = 0  # tokens of open tickets


class PrefillWatch:
    """Per worker: this gateway's in-flight tokens, and the part still waiting for a first token.

    Args:
        max_age_s: a ticket older than this is dropped (closed).
        clock: monotonic seconds.
    """

    __slots__ = ("_clock", "_max_age_s", "_seen", "_workers")

    def __init__(self, *, max_age_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_age_s = max_age_s
        self._clock = clock
        self._workers: dict[str, _Worker] = {}
        self._seen = False

    @property
    def reporting(self) -> bool:
        """Whether first tokens are reported at all (before the first one, nothing is known)."""
        return self._seen

    def open(self, worker: str, prefill: int, tokens: int) -> Ticket:
        """A request sent to ``worker``: ``prefill`` uncached prompt tokens, ``tokens`` in all."""
        w = self._workers.get(worker)
        if w is None:
            w = self._workers[worker] = _Worker()
        ticket = Ticket(worker, prefill, max(tokens, prefill), self._clock())
        w.tickets.append(ticket)
        w.pending += ticket.prefill
        w.inflight += ticket.tokens
        return ticket

    def first_token(self, ticket: Ticket) -> None:
        """The request's first token arrived: its prefill is done."""
        self._seen = True
        if ticket.open and ticket.pending:
            ticket.pending = False
            self._workers[ticket.worker].pending -= ticket.prefill

    def close(self, ticket: Ticket) -> None:
        """The request ended (once; again: nothing)."""
        if not ticket.open:
            return
        w = self._workers[ticket.worker]
        if ticket.pending:
            w.pending -= ticket.prefill
            ticket.pending = False
        ticket.open = False
        w.inflight -= ticket.tokens
        while w.tickets and not w.tickets[0].open:
            w.tickets.popleft()

    def prefill_tokens(self, worker: str, inflight_tokens: int) -> int | None:
        """Of ``inflight_tokens`` (every replica's, from the load board), those not known to be past their
        first token: this gateway's pending prefill plus what is not its own. None until first tokens are
        reported."""
        if not self._seen:
            return None
        w = self._workers.get(worker)
        if w is None:
            return inflight_tokens
        self._expire(w)
        others = max(0, inflight_tokens - w.inflight)
        return min(inflight_tokens, others + w.pending)

    def _expire(self, w: _Worker) -> None:
        """Close the oldest tickets past ``max_age_s`` (``close`` keeps the front ticket an open one)."""
        cutoff = self._clock() - self._max_age_s
        while w.tickets and w.tickets[0].opened_at < cutoff:
            self.close(w.tickets[0])
