"""A worker's engine signals onto its record: the detected facts, and each round's load scrape.

The scrape reads the load signal the worker's engine profile names (kvgate's ``/load``, vLLM/LMDeploy/TGI
``/metrics``, SGLang ``/v1/loads`` or, where that answers 404, the older SGLang's ``/get_load``,
TensorRT-LLM's ``/prometheus/metrics`` or, without it, its slow and draining JSON ``/metrics``) and writes
the figures onto the same ``WorkerRecord`` fields kvgate's own workers fill, so the policies see one shape.
Where an engine has no signal, or it fails, ``facts.load_signal`` says ``in-flight`` and ``facts.load_note``
says why: the gateway's own in-flight count is then the load term. ``facts.load_path`` and
``facts.load_read_at`` say where and when it was last read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gateway.engines.affinity import update_affinity
from gateway.engines.figures import EngineLoad, NoLoad
from gateway.engines.load import parse_load
from gateway.engines.probe import Get
from gateway.engines.profiles import EngineFacts, EngineKind
from gateway.fleet.registry import WorkerRecord

#: facts that detection does not own: the KV service's event endpoints and its free-form notes
_NOT_DETECTED = frozenset(
    {
        "event_endpoints",
        "extra",
        "load_signal",
        "load_note",
        "events_trusted",
        "reports_cached_tokens",
        "index_mode",
        "load_read_at",
    }
)


def adopt_detection(record: WorkerRecord, detected: EngineFacts) -> None:
    """Copy what detection found onto ``record.facts`` (kept as the same object), the operator's
    ``kv_tokens=``/``prefix_cache=`` winning over the engine's word, then recompute the affinity rule."""
    facts = record.facts
    for f in dataclasses.fields(EngineFacts):
        if f.name not in _NOT_DETECTED:
            setattr(facts, f.name, getattr(detected, f.name))
    if record.operator_kv_tokens is not None:
        facts.kv_capacity_tokens = record.operator_kv_tokens
    if record.operator_prefix_cache is not None:
        facts.prefix_reuse = record.operator_prefix_cache
    update_affinity(facts)


def apply_engine_load(record: WorkerRecord, load: EngineLoad) -> None:
    """Write one scrape's figures onto the record (and cache facts the engine had not stated yet)."""
    record.running = load.running
    record.max_running = load.max_running
    record.queue_depth = load.waiting
    record.finished_since_probe = 0
    record.kv_usage = load.kv_usage if load.kv_usage is not None else 0.0
    record.cached_blocks = load.cached_blocks or 0
    facts = record.facts
    if facts.block_size is None and load.block_size:
        facts.block_size = load.block_size
    if facts.kv_capacity_tokens is None and load.capacity_tokens:
        facts.kv_capacity_tokens = load.capacity_tokens
    if facts.prefix_reuse is None and load.prefix_caching is not None:
        facts.prefix_reuse = load.prefix_caching
        update_affinity(facts)


def _stand_in(record: WorkerRecord, note: str, *, zero: bool = False) -> None:
    """The gateway's in-flight count is the load term; ``zero`` drops engine figures that no longer apply."""
    record.facts.load_signal = "in-flight"
    record.facts.load_note = note
    if zero:
        record.running = record.queue_depth = record.max_running = 0
        record.kv_usage = 0.0


async def scrape_load(
    record: WorkerRecord, get: Get, *, enabled: bool = True, clock: Callable[[], float] = lambda: 0.0
) -> None:
    """Read the worker's load signal once and apply it (``enabled=False``: ``--engine-load off``, the
    gateway's in-flight count stands in for every worker); ``clock``: when a successful read answered.

    Raises:
        OSError, TimeoutError: the GET failed (the health checker's ``_scrape`` lets the in-flight count stand
            in; the worker's health is the probe's business).
    """
    facts = record.facts
    profile = facts.profile
    if not enabled:
        _stand_in(
            record, "engine load signals are off (--engine-load off); in-flight count stands in", zero=True
        )
        return
    if facts.kind is EngineKind.AUTO:
        _stand_in(record, "engine not detected yet; the gateway's in-flight count stands in", zero=True)
        return
    path, load_format = profile.load_path, profile.load_format
    if path is None:
        _stand_in(
            record,
            f"{facts.kind} publishes no load signal; the gateway's in-flight count stands in",
            zero=True,
        )
        return
    fallback = profile.fallback_load
    if fallback is not None and facts.load_path == fallback[0]:
        path, load_format = fallback  # it answered there before (an older release, a flag left off)
    status, body = await get(record.url, path)
    if status == 404 and fallback is not None and path != fallback[0]:
        path, load_format = fallback
        status, body = await get(record.url, path)
    if status != 200:
        _stand_in(record, f"GET {path} answered {status}; in-flight count stands in (last figures kept)")
        return
    parsed = parse_load(facts.kind, load_format, body)
    if isinstance(parsed, NoLoad):
        if parsed.keep_previous and facts.load_signal == "engine":
            facts.load_note = f"from {path}: {parsed.reason}; the last figures stand"
        else:
            _stand_in(record, f"GET {path}: {parsed.reason}; in-flight count stands in")
        return
    apply_engine_load(record, parsed)
    facts.load_signal = "engine"
    facts.load_path, facts.load_read_at = path, clock()
    facts.load_note = f"from {path}" + (
        " (drained on read: kvgate is its only reader)" if load_format == "trtllm_json" else ""
    )
