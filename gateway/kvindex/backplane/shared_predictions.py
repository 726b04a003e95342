"""Routing predictions shared between gateway replicas (``redis://`` state).

A replica's ``record_routed`` is applied to its local index at once and also queued for the Redis stream
``kvgate:routed``; the other replicas apply it as their own prediction (same short TTL, counted from when
they receive it). A burst of sibling requests spread over N replicas by a load balancer then lands on one
worker, as it would through one gateway, before any ``stored`` event exists. Predictions are ephemeral: a
lost batch (Redis down) costs nothing but that hint. The publishing side is in ``relay.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

import orjson

from gateway.kvindex.index import KVIndex, PrefixHit
from kvgate_core.kvcontract.events import EventDecodeError, KVEvent

ROUTED_STREAM: Final = "kvgate:routed"

Routed = tuple[str, tuple[int, ...]]


def encode_routed(replica: str, items: Sequence[Routed], queued_at: float | None = None) -> bytes:
    """``{"r": replica, "p": [[worker, [hashes...]], ...], "t": queued_at}``: ``t`` (optional) is the wall
    time the oldest item was queued, from which receivers measure how late they see it."""
    body: dict[str, object] = {"r": replica, "p": [[w, list(h)] for w, h in items]}
    if queued_at is not None:
        body["t"] = queued_at
    return orjson.dumps(body)


def decode_routed(data: bytes) -> tuple[str, list[Routed], float | None]:
    """Inverse of ``encode_routed``: the replica, its items and ``t`` (None where absent: older replicas).

    Raises:
        EventDecodeError: not that shape.
    """
    try:
        obj = orjson.loads(data)
        replica, items = obj["r"], obj["p"]
        out = [(str(w), tuple(int(h) for h in hashes)) for w, hashes in items]
        queued_at = obj.get("t")
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EventDecodeError(f"bad routed entry: {exc}") from exc
    if not isinstance(replica, str):
        raise EventDecodeError("bad routed entry: replica must be a string")
    if queued_at is not None and (type(queued_at) not in (int, float)):
        raise EventDecodeError("bad routed entry: t must be a number")
    return replica, out, None if queued_at is None else float(queued_at)


class ReplicatedKVIndex:
    """A local ``KVIndex`` whose ``record_routed`` calls are also handed to ``share`` (for other replicas).

    Every other method delegates to the local index unchanged; lookups never touch Redis.
    """

    __slots__ = ("_share", "local")

    def __init__(self, local: KVIndex, share: Callable[[str, Sequence[int]], None]) -> None:
        self.local = local
        self._share = share

    def apply(self, event: KVEvent) -> None:
        self.local.apply(event)

    def record_routed(self, worker: str, hashes: Sequence[int]) -> None:
        self.local.record_routed(worker, hashes)
        if hashes:
            self._share(worker, hashes)

    def record_remote(self, worker: str, hashes: Sequence[int]) -> None:
        """Apply another replica's prediction (not shared again)."""
        self.local.record_routed(worker, hashes)

    def longest_prefix(self, hashes: Sequence[int], workers: Iterable[str]) -> Mapping[str, PrefixHit]:
        return self.local.longest_prefix(hashes, workers)

    def remove_worker(self, worker: str) -> None:
        self.local.remove_worker(worker)

    def num_blocks(self) -> int:
        return self.local.num_blocks()

    def worker_blocks(self) -> Mapping[str, int]:
        return self.local.worker_blocks()
