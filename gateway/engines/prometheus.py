"""Load figures from an engine's Prometheus text (vLLM, LMDeploy, TGI; SGLang and TensorRT-LLM where they
serve it), parsed with ``prometheus_client``'s text parser.

A busy engine's ``/metrics`` is ~100 KB, nearly all histograms nobody here reads: the lines of the few
families named in the engine's ``PromNames`` are picked out first (a prefix test per line), and only those go
through the parser. Counts are summed over every series (DP ranks under ``engine``/``dp_rank``, models under
``model_name``); usage fractions are averaged over them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from gateway.engines.figures import EngineLoad, NoLoad
from gateway.engines.profiles import EngineKind


@dataclass(frozen=True, slots=True)
class PromNames:
    """The gauges that carry one engine's load (metric names as the engine writes them).

    Attributes:
        running: requests in the running batch (all summed).
        waiting: requests queued (all summed).
        kv_usage: a gauge of KV cache in use, 0–1 (averaged over its series).
        kv_used_tokens: KV tokens in use, for engines that give a used/total pair instead (TGI).
        capacity_tokens: KV capacity in tokens (summed), the ``kv_used_tokens`` denominator.
        block_size: KV block (page) size in tokens.
        capacity_blocks: KV capacity in blocks (times ``block_size``).
        cache_info: vLLM's info gauge whose labels carry ``block_size``, ``num_gpu_blocks`` and
            ``enable_prefix_caching``.
    """

    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...] = ()
    kv_used_tokens: str | None = None
    capacity_tokens: str | None = None
    block_size: str | None = None
    capacity_blocks: str | None = None
    cache_info: str | None = None

    def wanted(self) -> frozenset[str]:
        names = (
            self.kv_used_tokens,
            self.capacity_tokens,
            self.block_size,
            self.capacity_blocks,
            self.cache_info,
        )
        return frozenset((*self.running, *self.waiting, *self.kv_usage, *(n for n in names if n)))


PROM_NAMES: Final[Mapping[EngineKind, PromNames]] = {
    # vllm/v1/metrics/loggers.py; gpu_cache_usage_perc is the pre-V1 name of the usage gauge
    EngineKind.VLLM: PromNames(
        running=("vllm:num_requests_running",),
        waiting=("vllm:num_requests_waiting",),
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        cache_info="vllm:cache_config_info",
    ),
    # lmdeploy/metrics/loggers.py: API-side waiting (no free request handle) queues ahead of the engine's
    EngineKind.LMDEPLOY: PromNames(
        running=("lmdeploy:num_requests_running",),
        waiting=("lmdeploy:num_requests_waiting", "lmdeploy:num_api_requests_waiting"),
        kv_usage=("lmdeploy:gpu_cache_usage_perc",),
    ),
    # TGI v3 router: tokens the running batch reserved over the batch token budget is its KV-usage proxy
    EngineKind.TGI: PromNames(
        running=("tgi_batch_current_size",),
        waiting=("tgi_queue_size",),
        kv_used_tokens="tgi_batch_current_max_tokens",
        capacity_tokens="tgi_batch_max_total_tokens",
    ),
    # SGLang with --enable-metrics (its profile reads /v1/loads, which is always on)
    EngineKind.SGLANG: PromNames(
        running=("sglang:num_running_reqs",),
        waiting=("sglang:num_queue_reqs",),
        kv_usage=("sglang:token_usage",),
        capacity_tokens="sglang:max_total_num_tokens",
    ),
    # TensorRT-LLM /prometheus/metrics (with return_perf_metrics; tensorrt_llm/metrics/collector.py)
    EngineKind.TRTLLM: PromNames(
        running=("trtllm_num_requests_running",),
        waiting=("trtllm_num_requests_waiting",),
        kv_usage=("trtllm_kv_cache_utilization",),
        block_size="trtllm_kv_cache_tokens_per_block",
        capacity_blocks="trtllm_kv_cache_max_blocks",
    ),
}

_Series = dict[str, list[tuple[Mapping[str, str], float]]]


def parse_prometheus(kind: EngineKind, body: bytes) -> EngineLoad | NoLoad:
    """The load figures in ``body`` (Prometheus text) for an engine of ``kind``; ``NoLoad`` saying why not."""
    names = PROM_NAMES.get(kind)
    if names is None:
        return NoLoad(f"no Prometheus load gauges are known for {kind}")
    series = _series(_pick(body.decode("utf-8", "replace"), names.wanted()))
    if isinstance(series, NoLoad):
        return series
    if not any(n in series for n in (*names.running, *names.waiting)):
        return NoLoad(f"{' / '.join((*names.running, *names.waiting))} absent from the metrics")
    block_size, capacity, prefix = _cache_facts(names, series)
    used = _sum(series, (names.kv_used_tokens,)) if names.kv_used_tokens else None
    kv_usage = _mean(series, names.kv_usage)
    if used is not None and capacity:
        kv_usage = used / capacity
    return EngineLoad(
        running=round(_sum(series, names.running) or 0.0),
        waiting=round(_sum(series, names.waiting) or 0.0),
        kv_usage=None if kv_usage is None else min(1.0, max(0.0, kv_usage)),
        block_size=block_size,
        capacity_tokens=capacity,
        prefix_caching=prefix,
    )


def _pick(text: str, wanted: frozenset[str]) -> str:
    """The lines of ``text`` that belong to the ``wanted`` families (samples and their HELP/TYPE lines)."""
    prefixes = tuple(wanted)
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[2] in wanted:
                kept.append(line)
        elif line.startswith(prefixes) and _name_of(line) in wanted:
            kept.append(line)
    return "\n".join(kept) + "\n"


def _name_of(line: str) -> str:
    end = len(line)
    for stop in ("{", " ", "\t"):
        at = line.find(stop)
        if 0 <= at < end:
            end = at
    return line[:end]


def _series(text: str) -> _Series | NoLoad:
    out: _Series = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if math.isfinite(sample.value):
                    out.setdefault(sample.name, []).append((sample.labels, float(sample.value)))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        return NoLoad(f"malformed Prometheus text: {exc}")
    return out


def _sum(series: _Series, names: Iterable[str | None]) -> float | None:
    values = [v for n in names if n for _, v in series.get(n, ())]
    return sum(values) if values else None


def _mean(series: _Series, names: Iterable[str]) -> float | None:
    for name in names:  # the first name present wins (newer name before older)
        values = [v for _, v in series.get(name, ())]
        if values:
            return sum(values) / len(values)
    return None


def _cache_facts(names: PromNames, series: _Series) -> tuple[int | None, int | None, bool | None]:
    """(block size, KV capacity in tokens, prefix caching on) where the metrics say."""
    if names.cache_info:
        return _vllm_cache_info(series.get(names.cache_info, []))
    block = _sum(series, (names.block_size,)) if names.block_size else None
    block_size = round(block) if block else None
    capacity = _sum(series, (names.capacity_tokens,)) if names.capacity_tokens else None
    blocks = _sum(series, (names.capacity_blocks,)) if names.capacity_blocks else None
    if capacity is None and blocks and block_size:
        capacity = blocks * block_size
    return block_size, round(capacity) if capacity else None, None


def _vllm_cache_info(
    samples: list[tuple[Mapping[str, str], float]],
) -> tuple[int | None, int | None, bool | None]:
    """vLLM's ``cache_config_info`` labels: one series per engine (DP rank), each with its own KV pool."""
    block_size: int | None = None
    capacity = 0
    prefix: bool | None = None
    for labels, _ in samples:
        size, blocks = _label_int(labels, "block_size"), _label_int(labels, "num_gpu_blocks")
        block_size = block_size or size
        if size and blocks:
            capacity += size * blocks
        elif tokens := _label_int(labels, "kv_cache_size_tokens"):
            capacity += tokens
        flag = labels.get("enable_prefix_caching")
        if flag in ("True", "False"):
            prefix = flag == "True"
    return block_size, capacity or None, prefix


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    try:
        value = int(labels.get(key, ""))
    except ValueError:  # "None" before the engine sized its cache
        return None
    return value if value > 0 else None
