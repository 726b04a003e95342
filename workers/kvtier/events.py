"""Tier KV events: tell the gateway's index which blocks a shared tier gained or lost.

A tier calls ``TierEvents.stored``/``removed`` after a write or an eviction it performed. The sink is
injected (the worker's ``EventPublisher``, which puts events on ``GET /kv/events`` and the Redis stream);
a tier never publishes by itself. Evictions Redis performs on its own (``maxmemory-policy``) are not seen
by the client, so the index must treat ``dram`` entries as hints with a time limit; a pull of a block that
is gone is an ordinary miss.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvgate_core.kvcontract.events import EventType, KVEvent, Tier

EventSink = Callable[[KVEvent], None]


@dataclass(frozen=True, slots=True)
class TierEvents:
    """Builds and emits ``KVEvent``s for one tier.

    Attributes:
        sink: receives each event; it must not block (append to a bounded queue).
        source: the ``worker`` field of the events (the worker id that observed the change).
        tier: ``dram`` or ``ssd``.
        clock: wall-clock seconds for the ``ts`` field.
    """

    sink: EventSink
    source: str
    tier: Tier
    clock: Callable[[], float] = field(default=time.time)

    def stored(self, hashes: Sequence[int]) -> None:
        if hashes:
            self.sink(KVEvent(self.source, EventType.STORED, self.tier, tuple(hashes), self.clock()))

    def removed(self, hashes: Sequence[int]) -> None:
        if hashes:
            self.sink(KVEvent(self.source, EventType.REMOVED, self.tier, tuple(hashes), self.clock()))
