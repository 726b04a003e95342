"""How a worker's engine facts read to people: the detection log line and the ``/admin/workers`` ``engine``
object (which the KV service extends with its ``events`` state)."""

from __future__ import annotations

import time

from gateway.engines.affinity import prefix_reuse_now
from gateway.engines.profiles import EngineFacts, EngineKind

_PARITY_PATHS = {"tokenize": "/tokenize", "v1_tokenize": "/v1/tokenize", "chat_tokenize": "/chat_tokenize"}


def health_basis(facts: EngineFacts) -> str:
    """What marks the worker healthy: its ``/health``, or (MII's static 200) its requests' outcomes."""
    if facts.profile.health_trusted:
        return "/health"
    return f"passive: /health is a static 200 on {facts.kind}; failed requests open its circuit breaker"


def engine_summary(facts: EngineFacts, configured: EngineKind, now: float | None = None) -> dict[str, object]:
    """The ``engine`` object of one worker in ``/admin/workers`` (``now``: the health checker's monotonic
    clock, for the load figures' age)."""
    profile = facts.profile
    read_at = facts.load_read_at
    age = (time.monotonic() if now is None else now) - read_at if read_at is not None else None
    return {
        "kind": str(facts.kind),
        "configured": str(configured),
        "detected_by": facts.detected_by,
        "version": facts.version,
        "served_model": facts.served_model,
        "load_signal": facts.load_signal,
        "load_note": facts.load_note,
        "load_path": facts.load_path,
        "load_age_s": round(age, 3) if age is not None else None,
        "block_size": facts.block_size if facts.block_size is not None else profile.default_block_size,
        "block_size_source": "engine" if facts.block_size is not None else "default",
        "kv_capacity_tokens": facts.kv_capacity_tokens,
        "prefix_reuse": prefix_reuse_now(facts),
        "no_affinity_reason": facts.no_affinity_reason,
        "health": health_basis(facts),
        "parity_route": _PARITY_PATHS.get(profile.parity_route),
        "reports_cached_tokens": facts.reports_cached_tokens,
        "index_mode": facts.index_mode,
    }


def describe(worker_id: str, facts: EngineFacts) -> str:
    """One line for the log: what the worker is and how the gateway will read it."""
    profile = facts.profile
    version = f" {facts.version}" if facts.version else ""
    load = f"load from {profile.load_path}" if profile.load_path else "no load signal (in-flight count)"
    if profile.fallback_load is not None:
        load += f" (else {profile.fallback_load[0]})"
    block = (
        f"block {facts.block_size}" if facts.block_size else f"block {profile.default_block_size} (default)"
    )
    capacity = f", KV {facts.kv_capacity_tokens} tokens" if facts.kv_capacity_tokens else ""
    parity = _PARITY_PATHS.get(profile.parity_route, "none")
    line = (
        f"worker {worker_id} is {facts.kind}{version} ({facts.detected_by}): {load}, {block}{capacity}, "
        f"events {profile.events}, parity probe {parity}"
    )
    if not profile.health_trusted:
        line += f"; health {health_basis(facts)}"
    if facts.no_affinity_reason:
        line += f"; no cache affinity: {facts.no_affinity_reason}"
    return line
