"""In-process state backends: the default for a single gateway and the unit-test doubles.
Compiled with mypyc (``docs/development.md``: what that rules out).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from gateway.state.protocols import WorkerLoad
from gateway.state.recent import RecentConfig, RecentSums
from policies.placement import Placement


class MemoryLoadBoard:
    """In-flight requests and tokens and recent routed work per worker, in dicts (event-loop confined).

    Args:
        recent: half-life of the recent routed load.
        clock: wall clock (``time.time``), injected for tests and simulations.
    """

    __slots__ = ("_recent", "_requests", "_tokens")

    def __init__(self, recent: RecentConfig | None = None, clock: Callable[[], float] = time.time) -> None:
        self._requests: dict[str, int] = {}
        self._tokens: dict[str, int] = {}
        self._recent = RecentSums(recent or RecentConfig(), clock)

    def acquire(self, worker: str, tokens: int) -> None:
        self._requests[worker] = self._requests.get(worker, 0) + 1
        self._tokens[worker] = self._tokens.get(worker, 0) + tokens

    def release(self, worker: str, tokens: int) -> None:
        self._requests[worker] = max(0, self._requests.get(worker, 0) - 1)
        self._tokens[worker] = max(0, self._tokens.get(worker, 0) - tokens)

    def replicas(self) -> int:
        return 1

    def rank(self) -> int:
        return 0

    def add_routed(
        self, worker: str, tokens: int, cached_tokens: int = 0, placement: Placement = Placement.OTHER
    ) -> None:
        self._recent.add(worker, tokens, cached_tokens, placement)
        self._requests.setdefault(worker, 0)

    def get(self, worker: str) -> WorkerLoad:
        return self.loads((worker,))[0]

    def loads(self, workers: Sequence[str]) -> list[WorkerLoad]:
        recent = self._recent
        scale = recent.scale(recent.now())
        out = []
        for w in workers:  # compiled code calls these methods and the constructor directly
            tokens, requests, cached, streams, follow_ups = recent.scaled(w, scale)
            out.append(
                WorkerLoad(
                    self._requests.get(w, 0),
                    self._tokens.get(w, 0),
                    tokens,
                    requests,
                    cached,
                    streams,
                    follow_ups,
                )
            )
        return out

    def snapshot(self) -> Mapping[str, WorkerLoad]:
        return {w: self.get(w) for w in self._requests}
