"""``GET /kv/blocks`` snapshots: parsed per tier, the hashes checked as the events' are."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.kvindex.feeds.kvgate import parse_snapshot
from kvgate_core.kvcontract.events import EventDecodeError, Tier


def test_a_snapshot_keeps_each_tiers_hashes() -> None:
    snap = parse_snapshot({"worker": "w", "block_size": 16, "tiers": {"gpu": [0, 2**64 - 1], "dram": []}})
    assert snap.worker == "w" and snap.block_size == 16
    assert snap.tiers == {Tier.GPU: (0, 2**64 - 1), Tier.DRAM: ()}


@pytest.mark.parametrize(
    "hashes",
    [[-1], [2**64], [1, True], [1, 2.0], [None], "12", {"1": 2}],
    ids=["negative", "too-big", "bool", "float", "null", "string", "object"],
)
def test_a_snapshot_with_bad_hashes_is_refused(hashes: Any) -> None:
    with pytest.raises(EventDecodeError, match="unsigned 64-bit"):
        parse_snapshot({"worker": "w", "block_size": 16, "tiers": {"gpu": hashes}})
