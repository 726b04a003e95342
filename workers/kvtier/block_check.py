"""Verifies stored values before a tier serves them, counting what it rejects."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

from kvgate_core.kvcontract.wire import BlockLayout, BlockMismatchError, WireError, unpack_block
from workers.kvtier.stats import TierStats

logger = logging.getLogger(__name__)


class Verdict(Enum):
    OK = "ok"
    CORRUPT = "corrupt"
    MISMATCHED = "mismatched"


@dataclass(frozen=True, slots=True)
class BlockChecker:
    """Checks a value read under ``block_hash`` against the tier's model and (optional) layout.

    Pure and thread safe: it returns a verdict and leaves counting to ``tally`` on the event loop.
    """

    model: str
    layout: BlockLayout | None = None

    def verdict(self, value: bytes, block_hash: int) -> Verdict:
        try:
            unpack_block(value, model=self.model, block_hash=block_hash, layout=self.layout)
        except BlockMismatchError as exc:
            logger.debug("tier block %016x is foreign: %s", block_hash, exc)
            return Verdict.MISMATCHED
        except WireError as exc:
            logger.debug("tier block %016x is damaged: %s", block_hash, exc)
            return Verdict.CORRUPT
        return Verdict.OK


def tally(stats: TierStats, verdicts: list[Verdict]) -> None:
    """Add rejected values to ``stats`` (hits and misses are counted by the caller)."""
    for v in verdicts:
        if v is Verdict.CORRUPT:
            stats.corrupt += 1
        elif v is Verdict.MISMATCHED:
            stats.mismatched += 1
