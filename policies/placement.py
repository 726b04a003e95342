"""What a routed request does to its worker's sticky traffic: it starts a stream, follows one, or neither.

A request whose prompt no candidate holds more of than any other (up to ``TOLERANCE_BLOCKS``: a block that
two unrelated prompts share by chance) was placed freely: a new session, a cold prefix, a one-off. Later
requests that share its prompt will follow it to that worker, so it is a **new stream** there. A request sent
to a worker holding more of its prompt than the least-holding candidate **follows** a stream. The gateway
counts both per worker in the shared state (``WorkerView.recent_streams`` / ``recent_follow_ups``), so a
policy can tell how many follow-ups a new stream brings on this fleet's traffic (a prefix-group workload:
several; a trace of one-offs: few) and where the young streams went, before their traffic shows in the
recent tokens.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Final

from policies.api import WorkerId, WorkerView

#: Blocks of difference still counted as "the same": unrelated prompts can share a leading block by chance.
TOLERANCE_BLOCKS: Final = 1


class Placement(enum.Enum):
    """How a routed request relates to the cache of the worker it went to."""

    OTHER = "other"  # a spill or a partial hit: neither
    NEW_STREAM = "new_stream"  # no candidate held materially more of its prompt
    FOLLOW_UP = "follow_up"  # its worker held more of its prompt than the least-holding candidate


def held_blocks(view: WorkerView) -> int:
    """Leading blocks of the prompt a worker can serve without recomputing: its cache, then the tier."""
    return view.gpu_hit_blocks + view.tier_hit_blocks


def is_free(pool: Sequence[WorkerView]) -> bool:
    """No worker of ``pool`` holds more than ``TOLERANCE_BLOCKS`` more of the prompt than another."""
    if not pool:
        return False
    held = [held_blocks(w) for w in pool]
    return max(held) - min(held) <= TOLERANCE_BLOCKS


def placement_of(pool: Sequence[WorkerView], chosen: WorkerId) -> Placement:
    """What routing to ``chosen`` (a member of ``pool``, the candidates it was chosen from) is."""
    if is_free(pool):
        return Placement.NEW_STREAM
    least = min(held_blocks(w) for w in pool)
    mine = next((held_blocks(w) for w in pool if w.id == chosen), least)
    return Placement.FOLLOW_UP if mine > least + TOLERANCE_BLOCKS else Placement.OTHER
