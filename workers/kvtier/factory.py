"""Builds the tier a worker's flags ask for: Redis (``--kv-tier``), SSD (``--ssd-dir``), both, or none."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvgate_core.kvcontract.events import Tier
from kvgate_core.kvcontract.wire import BlockLayout
from workers.kvtier.events import EventSink, TierEvents
from workers.kvtier.layered import LayeredConfig, LayeredTier
from workers.kvtier.protocols import WritableTier
from workers.kvtier.redis_tier import RedisTier, RedisTierConfig
from workers.kvtier.ssd_tier import SsdTier, SsdTierConfig


@dataclass(frozen=True, slots=True)
class TierSettings:
    """What the worker was configured with.

    Attributes:
        model: the served model id.
        layout: the engine's block layout (``BlockCodec.layout``); ``None`` skips the layout check.
        redis_url: the DRAM tier (``--kv-tier``), or ``None``.
        redis_cluster: connect to a Redis Cluster.
        ssd_dir: the SSD tier directory (``--ssd-dir``), or ``None``.
        ssd_capacity_bytes: the SSD tier's capacity.
        ttl_s: expiry of DRAM blocks (``None``: Redis's LRU alone).
        queue_blocks: write-behind queue bound when both tiers are used.
    """

    model: str
    layout: BlockLayout | None = None
    redis_url: str | None = None
    redis_cluster: bool = False
    ssd_dir: Path | None = None
    ssd_capacity_bytes: int = 64 << 30
    ttl_s: float | None = None
    queue_blocks: int = 1024


async def open_tier(
    settings: TierSettings, *, sink: EventSink | None = None, worker_id: str = "worker"
) -> WritableTier | None:
    """The configured tier, ready to use; ``None`` when neither Redis nor a directory is configured.

    Raises:
        ValueError: a setting is invalid (bad URL scheme, non-positive capacity).
    """
    dram = ssd = None
    if settings.redis_url is not None:
        cfg = RedisTierConfig(
            settings.redis_url,
            settings.model,
            layout=settings.layout,
            cluster=settings.redis_cluster,
            ttl_s=settings.ttl_s,
        )
        dram = RedisTier(cfg, events=None if sink is None else TierEvents(sink, worker_id, Tier.DRAM))
    if settings.ssd_dir is not None:
        ssd_cfg = SsdTierConfig(
            settings.ssd_dir, settings.model, settings.ssd_capacity_bytes, settings.layout
        )
        ssd = await SsdTier.open(
            ssd_cfg, events=None if sink is None else TierEvents(sink, worker_id, Tier.SSD)
        )
    if dram is not None and ssd is not None:
        return LayeredTier(dram, ssd, LayeredConfig(queue_blocks=settings.queue_blocks))
    return dram or ssd
