"""In-process state backends: the default for a single gateway and the unit-test doubles."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.state.protocols import WorkerLoad


class MemoryLoadBoard:
    """In-flight requests and tokens per worker, held in two dicts (event-loop confined)."""

    __slots__ = ("_requests", "_tokens")

    def __init__(self) -> None:
        self._requests: dict[str, int] = {}
        self._tokens: dict[str, int] = {}

    def acquire(self, worker: str, tokens: int) -> None:
        self._requests[worker] = self._requests.get(worker, 0) + 1
        self._tokens[worker] = self._tokens.get(worker, 0) + tokens

    def release(self, worker: str, tokens: int) -> None:
        self._requests[worker] = max(0, self._requests.get(worker, 0) - 1)
        self._tokens[worker] = max(0, self._tokens.get(worker, 0) - tokens)

    def get(self, worker: str) -> WorkerLoad:
        return WorkerLoad(self._requests.get(worker, 0), self._tokens.get(worker, 0))

    def snapshot(self) -> Mapping[str, WorkerLoad]:
        return {w: WorkerLoad(n, self._tokens.get(w, 0)) for w, n in self._requests.items()}
