"""``UpstreamQueue``: the requests waiting in the upstream pool for a connection to a worker.
Compiled with mypyc (``docs/development.md``: what that rules out).

Apart from ``gateway.proxy.upstream`` (an async context manager, which mypyc does not compile) because the
routing snapshot calls it once per worker per request: compiled (``kvgate_core.native``), that is a C call.
"""

from __future__ import annotations

from kvgate_core.h1 import H1Pool, Target


class UpstreamQueue:
    """``queue(worker_url)``: the requests waiting in ``pool`` for a connection to that worker (the routing
    snapshot adds them to the worker's queue depth); 0 at once while nothing waits anywhere."""

    __slots__ = ("_pool", "_targets")

    def __init__(self, pool: H1Pool) -> None:
        self._pool = pool
        self._targets: dict[str, Target] = {}

    def __call__(self, url: str) -> int:
        if not self._pool.num_waiting:
            return 0
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = Target.parse(url)
        return self._pool.waiting(target)
