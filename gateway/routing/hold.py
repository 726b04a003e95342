"""A request's hold on a worker's in-flight accounting, taken when it is sent and released exactly once.
Compiled with mypyc (``docs/development.md``: what that rules out).
"""

from __future__ import annotations

from gateway.fleet.registry import WorkerRecord
from gateway.state.protocols import LoadBoard


class Hold:
    """One attempt's share of a worker's in-flight accounting; ``take`` acquires it, ``end`` releases it once.

    Callers end it as soon as the worker has answered (so a client's next request never sees its own
    finished request as load) and again in a ``finally``, which then does nothing.
    """

    # a plain class, not a dataclass: compiled (``kvgate_core.native``), one is built per attempt in C, where
    # a dataclass's generated ``__init__`` would run interpreted
    __slots__ = ("held", "load", "record", "tokens")

    def __init__(self, load: LoadBoard, record: WorkerRecord, tokens: int, held: bool = True) -> None:
        self.load = load
        self.record = record
        self.tokens = tokens
        self.held = held

    @classmethod
    def take(cls, load: LoadBoard, record: WorkerRecord, tokens: int) -> Hold:
        load.acquire(record.id, tokens)
        return cls(load, record, tokens)

    def end(self, *, answered: bool) -> None:
        """Release the hold (again: nothing); ``answered``: the worker finished the request, which also
        moved its queue by one (``WorkerRecord.finished_since_probe``)."""
        if self.held:
            self.held = False
            self.load.release(self.record.id, self.tokens)
            if answered:
                self.record.finished_since_probe += 1
