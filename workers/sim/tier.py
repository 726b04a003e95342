"""The simulated worker's shared KV tier: which blocks were pushed, kept for real in Redis.

A simulated worker has no KV bytes, so the tier holds only the fact that a block was pushed: one Redis set
per model, ``kvgate:sim:tier:{model}``, whose members are block hashes (16 hex digits). Sims in different
processes pointed at the same Redis therefore share it, exactly like real workers share the DRAM tier.

What it costs is modelled, not measured: pulling ``n`` blocks takes ``latency + n * block_bytes /
bandwidth`` (``--tier-pull-latency-ms``, ``--tier-pull-gbps``, ``--sim-kv-bytes-per-token``); the scheduler
weighs that against recomputing with ``workers.kvtier.planner.plan_pull``, as a real worker does.

A tier outage never fails a request: a lookup that fails is a miss, a push that fails is logged and lost.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import redis.asyncio as aioredis
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

SET_PREFIX: Final = "kvgate:sim:tier:"
DEFAULT_KV_BYTES_PER_TOKEN: Final = 23_040  # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims x (K, V) x fp16


@dataclass(frozen=True, slots=True)
class PullCost:
    """The modelled cost of a tier pull.

    Attributes:
        bytes_per_s: tier read bandwidth.
        latency_s: fixed cost of one batched read.
        block_bytes: bytes of one KV block.
    """

    bytes_per_s: float
    latency_s: float
    block_bytes: int

    def __post_init__(self) -> None:
        if self.bytes_per_s <= 0 or self.latency_s < 0 or self.block_bytes <= 0:
            raise ValueError("tier pull bandwidth and block size must be > 0 and latency >= 0")

    def seconds(self, num_blocks: int) -> float:
        """Seconds to pull ``num_blocks`` blocks in one batch (0 for none)."""
        if num_blocks <= 0:
            return 0.0
        return self.latency_s + num_blocks * self.block_bytes / self.bytes_per_s


def add_tier_arguments(parser: argparse.ArgumentParser) -> None:
    """The sim's tier-cost flags (used with ``--sim --kv-tier redis://…``)."""
    a = parser.add_argument
    a("--tier-pull-gbps", type=float, default=10.0, help="sim: tier read bandwidth in GB/s (default 10)")
    a("--tier-pull-latency-ms", type=float, default=1.0, help="sim: fixed cost of one tier read (default 1)")
    a(
        "--sim-kv-bytes-per-token",
        type=int,
        default=DEFAULT_KV_BYTES_PER_TOKEN,
        help=f"sim: KV bytes per token, for pull costs (default {DEFAULT_KV_BYTES_PER_TOKEN})",
    )


def pull_cost_from_args(args: argparse.Namespace, block_size: int) -> PullCost:
    """The ``PullCost`` the flags describe.

    Raises:
        ValueError: a flag is out of range.
    """
    return PullCost(
        bytes_per_s=float(getattr(args, "tier_pull_gbps", 10.0)) * 1e9,
        latency_s=float(getattr(args, "tier_pull_latency_ms", 1.0)) / 1000.0,
        block_bytes=int(getattr(args, "sim_kv_bytes_per_token", DEFAULT_KV_BYTES_PER_TOKEN)) * block_size,
    )


class SimTier:
    """Markers of pushed blocks in a Redis set shared by every sim of one model.

    Args:
        client: an asyncio Redis client (owned: ``aclose`` closes it).
        model: the served model id (one set per model).
        cost: the modelled pull cost.
    """

    def __init__(self, client: aioredis.Redis, model: str, cost: PullCost) -> None:
        self._client = client
        self._key = SET_PREFIX + model
        self.cost = cost

    @classmethod
    def from_url(cls, url: str, model: str, cost: PullCost) -> SimTier:
        """A tier on the Redis at ``url`` (connects lazily, on first use).

        Raises:
            ValueError: ``url`` is not a redis:// URL.
        """
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"--kv-tier must be a redis:// URL (got {url!r})")
        client = aioredis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        return cls(client, model, cost)

    async def prefix(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the tier holds (0 when Redis is unreachable)."""
        if not hashes:
            return 0
        try:
            flags = await self._client.smismember(self._key, [f"{h:016x}" for h in hashes])
        except (RedisError, OSError) as exc:
            logger.warning("sim tier lookup failed: %r", exc)
            return 0
        for i, flag in enumerate(flags):
            if not flag:
                return i
        return len(flags)

    async def push(self, hashes: Sequence[int]) -> bool:
        """Record ``hashes`` as pushed; True once Redis acknowledged the write (durable for readers)."""
        if not hashes:
            return True
        try:
            await self._client.sadd(self._key, *(f"{h:016x}" for h in hashes))
        except (RedisError, OSError) as exc:
            logger.warning("sim tier push failed: %r", exc)
            return False
        return True

    async def aclose(self) -> None:
        await self._client.aclose()
