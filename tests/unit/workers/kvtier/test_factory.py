"""open_tier builds the tier the flags ask for."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate_core.kvcontract.events import KVEvent, Tier
from kvgate_core.kvcontract.wire import BlockLayout, BlockMeta, pack_block
from workers.kvtier.factory import TierSettings, open_tier
from workers.kvtier.layered import LayeredTier
from workers.kvtier.redis_tier import RedisTier
from workers.kvtier.ssd_tier import SsdTier


@pytest.mark.parametrize(
    ("use_redis", "use_ssd", "expected"),
    [(False, False, type(None)), (True, False, RedisTier), (False, True, SsdTier), (True, True, LayeredTier)],
    ids=["none", "redis", "ssd", "both"],
)
async def test_open_tier_picks_the_configured_tiers(
    use_redis: bool, use_ssd: bool, expected: type, tmp_path: Path, redis_url: str
) -> None:
    events: list[KVEvent] = []
    settings = TierSettings(
        "m", redis_url=redis_url if use_redis else None, ssd_dir=tmp_path if use_ssd else None
    )
    tier = await open_tier(settings, sink=events.append, worker_id="w7")
    assert isinstance(tier, expected)
    if tier is None:
        return
    layout = BlockLayout(1, 1, "uint8", (4,))
    await tier.put_many([(1, pack_block(BlockMeta.of("m", 1, layout), b"abcd"))])
    if isinstance(tier, LayeredTier):
        await tier.flush()
    assert {(e.worker, e.tier) for e in events} == {
        ("w7", t) for t, on in ((Tier.DRAM, use_redis), (Tier.SSD, use_ssd)) if on
    }
    await tier.aclose()


async def test_open_tier_rejects_bad_url() -> None:
    with pytest.raises(ValueError, match="redis://"):
        await open_tier(TierSettings("m", redis_url="http://nope"))
