"""``pd_disaggregation``: prefill on one worker, decode on another, when that saves work.

What it does:
    Picks the decode worker by load among healthy ``decode``/``both`` workers (fewest in-flight tokens,
    seeded tie-break). If that worker already holds most of the prompt (its cache plus the shared tier
    leave fewer than ``min_uncached_tokens`` to compute), it serves alone. Otherwise the prefill worker is
    picked cache-aware among healthy ``prefill``/``both`` workers with the ``prefix_cache_aware`` cost
    model; it computes the prompt's KV and pushes it to the shared tier, and the decode worker pulls it
    and generates. The decision is ``worker=decode, prefill_worker=prefill`` (None when the decode worker
    prefills itself: not worth it, no prefill worker available, or it is itself the cheapest).

Inputs (needs):
    Prompt token count, block hashes, per-worker prefix hits and load.

Parameters:
    min_uncached_tokens: disaggregate only when at least this many prompt tokens are missing on the
        decode worker (default 512).
    prefill: params of the prefill worker's cost model, as for ``prefix_cache_aware`` (default: its
        defaults).

Example config:
    policy:
      type: pd_disaggregation
      params:
        min_uncached_tokens: 256
        prefill: {tier_pull_cost: 0.1}

Limitations:
    The decode worker is chosen by load only, so a conversation's next turn may decode on a worker
    without its KV (the tier then supplies it). Pools are fixed by the workers' roles; moving ``both``
    workers between pools is the gateway's job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policies.api import Need, PolicyContext, RouteRequest, WorkerView
from policies.builtin.least_load import LeastLoad
from policies.builtin.prefix_cache_aware import CacheCostParams, PrefixCacheAware
from policies.candidates import DECODE_ROLES, PREFILL_ROLES
from policies.config import parse_params
from policies.pd import PDPolicy
from policies.plugins import Kind, define


@dataclass(frozen=True, slots=True)
class PDParams:
    min_uncached_tokens: int = 512
    prefill: Mapping[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if self.min_uncached_tokens < 0:
            raise ValueError("min_uncached_tokens must be >= 0")


class UncachedTokensDecider:
    """Disaggregate when the decode worker lacks at least ``min_uncached_tokens`` of the prompt."""

    needs = frozenset({Need.TOKENS, Need.BLOCK_HASHES, Need.PREFIX_HITS})

    def __init__(self, min_uncached_tokens: int, block_size: int) -> None:
        self._min = min_uncached_tokens
        self._bs = block_size

    def disaggregate(self, req: RouteRequest, decode_worker: WorkerView) -> bool:
        prompt = max(req.num_prompt_tokens, len(req.block_hashes) * self._bs)
        held = (decode_worker.gpu_hit_blocks + decode_worker.tier_hit_blocks) * self._bs
        return prompt - held >= self._min


def build_pd(ctx: PolicyContext, params: PDParams) -> PDPolicy:
    """The built-in PD policy: cost-model prefill, least-load decode, uncached-tokens decider."""
    cost = parse_params(CacheCostParams, params.prefill, "policy 'pd_disaggregation': params.prefill")
    return PDPolicy(
        "pd_disaggregation",
        prefill=PrefixCacheAware(cost, ctx, roles=PREFILL_ROLES),
        decode=LeastLoad(ctx.rng, roles=DECODE_ROLES),
        decider=UncachedTokensDecider(params.min_uncached_tokens, ctx.block_size),
    )


PLUGINS = (define("pd_disaggregation", Kind.POLICY, PDParams, build_pd),)
