"""Sequence numbers of a ZMQ event publisher: what to do with each batch, live or replayed.

A publisher numbers its batches 0, 1, 2… (per publisher, so per data-parallel rank). The subscriber applies
them in order; a live batch past the next expected one is a gap (ask the replay socket, else resync); a
replay may deliver batches that the live socket then delivers again (duplicates, skipped); a live number
below everything replayed means the publisher restarted (resync).
"""

from __future__ import annotations

from enum import Enum


class Verdict(Enum):
    APPLY = "apply"
    DUPLICATE = "duplicate"
    GAP = "gap"
    RESTART = "restart"


class SequenceTracker:
    """The last applied sequence number, and the window of replayed ones the live socket may repeat.

    ``last`` is -1 until the first batch; the first batch is always applied (nothing is known before it).
    """

    def __init__(self) -> None:
        self.last = -1
        self._floor = -1  # live numbers in (floor, last] were applied from a replay: duplicates

    def classify_live(self, seq: int) -> Verdict:
        if self.last < 0 or seq == self.last + 1:
            return Verdict.APPLY
        if seq > self.last + 1:
            return Verdict.GAP
        return Verdict.DUPLICATE if seq > self._floor else Verdict.RESTART

    def classify_replayed(self, seq: int) -> Verdict:
        if self.last < 0 or seq == self.last + 1:
            return Verdict.APPLY
        return Verdict.DUPLICATE if seq <= self.last else Verdict.GAP

    def applied(self, seq: int, *, live: bool) -> None:
        """``seq`` was applied (after a resync too); a live batch closes the duplicate window."""
        self.last = seq
        if live:
            self._floor = seq
