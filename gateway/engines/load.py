"""Pure parsers of the engines' load signals, one per ``LoadFormat``, all yielding ``EngineLoad`` (or
``NoLoad`` with the reason). Nothing here raises on malformed input.

- ``kvgate``: kvgate's own ``GET /load`` JSON ``{running, waiting, kv_usage, max_running, cached blocks…}``.
- ``prometheus``: Prometheus text, the gauges named per engine in ``gateway.engines.prometheus``.
- ``sglang_loads``: SGLang's ``GET /v1/loads`` JSON, one entry per DP rank under ``loads``.
- ``sglang_get_load``: the older SGLang's ``GET /get_load``, a JSON list with one entry per DP rank
  (``dp_rank``, ``num_reqs`` = running + waiting, ``num_waiting_reqs``, ``num_tokens`` or ``num_pages``):
  ``GetLoadReqOutput`` in SGLang's ``python/sglang/srt/managers/io_struct.py``, filled by the scheduler's
  ``get_load``.
- ``trtllm_json``: TensorRT-LLM's ``GET /metrics``, a JSON list of iteration stats drained on read: the newest
  counts; an empty list means no iteration ran since the last read (the previous figures stand).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.engines.figures import EngineLoad, NoLoad
from gateway.engines.profiles import EngineKind, LoadFormat
from gateway.engines.prometheus import parse_prometheus


def parse_load(kind: EngineKind, load_format: LoadFormat, body: bytes) -> EngineLoad | NoLoad:
    """The figures in ``body``, the answer of an engine of ``kind`` in ``load_format``."""
    if load_format == "prometheus":
        return parse_prometheus(kind, body)
    if load_format == "none":
        return NoLoad(f"{kind} publishes no load signal")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return NoLoad(f"the load signal is not JSON ({exc})")
    if load_format == "kvgate":
        return kvgate_load(data) if isinstance(data, dict) else NoLoad("/load is not a JSON object")
    if load_format == "sglang_loads":
        return sglang_loads(data)
    if load_format == "sglang_get_load":
        return sglang_get_load(data)
    return trtllm_stats(data)


def _num(data: Mapping[str, Any], *keys: str) -> float | None:
    for key in keys:
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _int(data: Mapping[str, Any], *keys: str) -> int:
    value = _num(data, *keys)
    return int(value) if value is not None else 0


def kvgate_load(data: Mapping[str, Any]) -> EngineLoad:
    """kvgate's worker ``/load`` (unknown keys ignored, missing counts 0, ``kv_usage`` clamped to 0–1)."""
    usage = _num(data, "kv_usage")
    return EngineLoad(
        running=_int(data, "running", "num_running"),
        waiting=_int(data, "waiting", "num_waiting", "queue_depth"),
        kv_usage=min(1.0, max(0.0, usage)) if usage is not None else 0.0,
        max_running=_int(data, "max_running", "max_num_seqs"),
        cached_blocks=_int(data, "cached_blocks", "num_cached_blocks", "kv_blocks_cached"),
    )


def sglang_loads(data: object) -> EngineLoad | NoLoad:
    """SGLang ``/v1/loads``: counts and capacity summed over DP ranks, ``token_usage`` averaged."""
    loads = data.get("loads") if isinstance(data, dict) else None
    ranks = [r for r in loads if isinstance(r, dict)] if isinstance(loads, list) else []
    if not ranks:
        return NoLoad("/v1/loads has no 'loads' entries")
    usages = [u for r in ranks if (u := _num(r, "token_usage")) is not None]
    capacity = sum(_int(r, "max_total_num_tokens") for r in ranks)
    return EngineLoad(
        running=sum(_int(r, "num_running_reqs") for r in ranks),
        waiting=sum(_int(r, "num_waiting_reqs") for r in ranks),
        kv_usage=min(1.0, max(0.0, sum(usages) / len(usages))) if usages else None,
        max_running=sum(_int(r, "max_running_requests") for r in ranks),
        capacity_tokens=capacity or None,
    )


def sglang_get_load(data: object) -> EngineLoad | NoLoad:
    """The older SGLang ``/get_load``: requests summed over DP ranks, running = ``num_reqs`` - waiting (it
    carries no KV usage or capacity)."""
    entries = data if isinstance(data, list) else [data]
    ranks = [r for r in entries if isinstance(r, dict) and "num_reqs" in r]
    if not ranks:
        return NoLoad("/get_load has no entries with num_reqs")
    waiting = sum(_int(r, "num_waiting_reqs") for r in ranks)
    return EngineLoad(running=max(0, sum(_int(r, "num_reqs") for r in ranks) - waiting), waiting=waiting)


def trtllm_stats(data: object) -> EngineLoad | NoLoad:
    """TensorRT-LLM's iteration stats: the newest entry (its ``iter`` is the highest) counts."""
    if not isinstance(data, list):
        return NoLoad("/metrics is not a JSON list of iteration stats")
    if not data:
        return NoLoad("no new iteration stats since the last read", keep_previous=True)
    stats = [s for s in (_stat(item) for item in data) if s is not None]
    if not stats:
        return NoLoad("the iteration stats are not JSON objects")
    newest = max(enumerate(stats), key=lambda p: (_num(p[1], "iter") or 0.0, p[0]))[1]
    return _trtllm_figures(newest)


def _stat(item: object) -> Mapping[str, Any] | None:
    if isinstance(item, str):  # some releases queue each entry as a JSON string
        try:
            item = orjson.loads(item)
        except orjson.JSONDecodeError:
            return None
    return item if isinstance(item, dict) else None


def _trtllm_figures(stat: Mapping[str, Any]) -> EngineLoad:
    kv = stat.get("kvCacheStats")
    kv = kv if isinstance(kv, dict) else {}
    batching = stat.get("inflightBatchingStats")
    paused = _int(batching, "numPausedRequests") if isinstance(batching, dict) else 0
    max_blocks = _num(kv, "maxNumBlocks")
    used = _num(kv, "usedNumBlocks")
    if used is None and max_blocks is not None and (free := _num(kv, "freeNumBlocks")) is not None:
        used = max_blocks - free
    per_block = _int(kv, "tokensPerBlock")
    return EngineLoad(
        running=_int(stat, "numActiveRequests"),
        waiting=_int(stat, "numQueuedRequests") + paused,
        kv_usage=min(1.0, max(0.0, used / max_blocks)) if used is not None and max_blocks else None,
        max_running=_int(stat, "maxNumActiveRequests"),
        block_size=per_block or None,
        capacity_tokens=int(max_blocks) * per_block if max_blocks and per_block else None,
    )
