"""Recorded-shape answers of the eight engine kinds, built from each engine's own source (docs/engines.md), and a
fake ``Get`` that serves them. vLLM's real 0.32.0 answers are in ``tests/fixtures/engines/vllm-0.32.0``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

VLLM_FIXTURES = Path(__file__).parents[3] / "fixtures" / "engines" / "vllm-0.32.0"

Answer = tuple[int, bytes] | Callable[[], tuple[int, bytes]]


def js(doc: Any, status: int = 200) -> tuple[int, bytes]:
    return status, orjson.dumps(doc)


def models(model: str, owned_by: str | None, **extra: Any) -> tuple[int, bytes]:
    card: dict[str, Any] = {"id": model, "object": "model", "created": 0, **extra}
    if owned_by is not None:
        card["owned_by"] = owned_by
    return js({"object": "list", "data": [card]})


VLLM_METRICS_DP2 = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 4.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 1.0
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="Qwen/Qwen3-8B",reason="capacity"} 99.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 1234.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 7.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 0.7
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="1",num_gpu_blocks="1000"} 1.0
"""

LMDEPLOY_METRICS = b"""# HELP lmdeploy:num_requests_running Number of requests in model execution batches.
# TYPE lmdeploy:num_requests_running gauge
lmdeploy:num_requests_running{engine="0",model_name="internlm2"} 6.0
# HELP lmdeploy:num_requests_waiting Number of requests waiting to be processed.
# TYPE lmdeploy:num_requests_waiting gauge
lmdeploy:num_requests_waiting{engine="0",model_name="internlm2"} 2.0
# HELP lmdeploy:num_api_requests_waiting Number of requests waiting for free request handles.
# TYPE lmdeploy:num_api_requests_waiting gauge
lmdeploy:num_api_requests_waiting{engine="0",model_name="internlm2"} 3.0
# HELP lmdeploy:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE lmdeploy:gpu_cache_usage_perc gauge
lmdeploy:gpu_cache_usage_perc{engine="0",model_name="internlm2"} 0.75
"""

TGI_METRICS = b"""# TYPE tgi_queue_size gauge
tgi_queue_size 5
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 12
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 4096
# TYPE tgi_batch_max_total_tokens gauge
tgi_batch_max_total_tokens 16384
# TYPE tgi_request_count counter
tgi_request_count 42
"""

SGLANG_SERVER_INFO = {
    "model_path": "Qwen/Qwen3-8B",
    "served_model_name": "Qwen/Qwen3-8B",
    "page_size": 16,
    "tp_size": 1,
    "disable_radix_cache": False,
    "max_total_num_tokens": 500000,
    "internal_states": [{"last_gen_throughput": 0.0}],
    "version": "0.5.23",
}

SGLANG_LOADS = {
    "timestamp": "2026-12-03T10:00:00+00:00",
    "version": "0.5.23",
    "accelerator": "NVIDIA H200",
    "num_accelerators": 1,
    "loads": [
        {"dp_rank": 0, "num_running_reqs": 7, "num_waiting_reqs": 2, "num_waiting_uncached_tokens": 900,
         "num_used_tokens": 1000, "num_total_tokens": 250000, "max_total_num_tokens": 250000,
         "max_running_requests": 64, "token_usage": 0.4, "gen_throughput": 10.0, "cache_hit_rate": 0.5,
         "utilization": 0.5},
        {"dp_rank": 1, "num_running_reqs": 3, "num_waiting_reqs": 0, "num_waiting_uncached_tokens": 0,
         "num_used_tokens": 10, "num_total_tokens": 250000, "max_total_num_tokens": 250000,
         "max_running_requests": 64, "token_usage": 0.2, "gen_throughput": 5.0, "cache_hit_rate": 0.1,
         "utilization": 0.1},
    ],
}  # fmt: skip


def trtllm_stat(
    iteration: int, *, active: int, queued: int, paused: int = 0, used: int = 0
) -> dict[str, Any]:
    return {
        "iter": iteration,
        "iterLatencyMS": 12.5,
        "numActiveRequests": active,
        "numQueuedRequests": queued,
        "numCompletedRequests": 0,
        "maxNumActiveRequests": 256,
        "gpuMemUsage": 1,
        "kvCacheStats": {"maxNumBlocks": 1000, "freeNumBlocks": 1000 - used, "usedNumBlocks": used,
                         "tokensPerBlock": 32, "allocTotalBlocks": used, "allocNewBlocks": 0,
                         "reusedBlocks": 0, "missedBlocks": 0, "cacheHitRate": 0.0},
        "inflightBatchingStats": {"numScheduledRequests": active, "numContextRequests": 1,
                                  "numGenRequests": active - 1, "numPausedRequests": paused, "numCtxTokens": 100},
    }  # fmt: skip


class TrtllmMetrics:
    """TensorRT-LLM's ``GET /metrics``: a queue of iteration stats that each read drains."""

    def __init__(self, *stats: dict[str, Any]) -> None:
        self.queue = list(stats)
        self.reads = 0

    def __call__(self) -> tuple[int, bytes]:
        self.reads += 1
        drained, self.queue = self.queue, []
        return js(drained)


def engine_answers(kind: str) -> dict[str, Answer]:
    """What a server of ``kind`` answers, by GET path (anything else is 404)."""
    if kind == "kvgate":
        return {
            "/health": js({"status": "ok"}),
            "/v1/models": models("tiny", "kvgate", max_model_len=2048),
            "/load": js({"worker": "w", "model": "tiny", "running": 2, "waiting": 1, "kv_usage": 0.5,
                         "num_cached_blocks": 7, "num_total_blocks": 100, "max_running": 8}),
        }  # fmt: skip
    if kind == "vllm":
        return {
            "/health": (200, b""),
            "/v1/models": models("Qwen/Qwen3-8B", "vllm", root="/models/qwen3-8b", max_model_len=4096),
            "/version": js({"version": "0.32.0"}),
            "/load": js({"server_load": 0}),
            "/metrics": (200, VLLM_METRICS_DP2),
        }
    if kind == "sglang":
        return {
            "/health": (200, b""),
            "/v1/models": models("Qwen/Qwen3-8B", "sglang", root="Qwen/Qwen3-8B", max_model_len=4096),
            "/server_info": js(SGLANG_SERVER_INFO),
            "/v1/loads?include=core": js(SGLANG_LOADS),
        }
    if kind == "trtllm":
        return {
            "/health": (200, b""),
            "/v1/models": models("llama-3.1-8b", "tensorrt_llm"),
            "/version": js({"version": "1.2.1"}),
            "/server_info": js({"disaggregated_params": None}),
            "/metrics": TrtllmMetrics(
                trtllm_stat(41, active=1, queued=0), trtllm_stat(42, active=5, queued=2, paused=1, used=250)
            ),
        }
    if kind == "tgi":
        model = "meta-llama/Llama-3.1-8B-Instruct"
        return {
            "/health": (200, b""),
            "/v1/models": models(model, model),
            "/info": js({"model_id": model, "model_sha": None, "max_total_tokens": 8192, "max_input_tokens": 8191,
                         "max_concurrent_requests": 128, "router": "text-generation-router", "version": "3.3.7",
                         "sha": "db931fc", "docker_label": None}),
            "/metrics": (200, TGI_METRICS),
        }  # fmt: skip
    if kind == "lmdeploy":
        return {
            "/health": js({"status": "healthy", "message": ""}),
            "/v1/models": models("internlm2", "lmdeploy", root="internlm2"),
            "/metrics": (200, LMDEPLOY_METRICS),
        }
    if kind == "mii":
        return {
            "/health": js({"status": "ok"}),
            "/v1/models": models("mistralai/Mistral-7B-v0.1", "deepspeed-mii", root="mistralai/Mistral-7B-v0.1",
                                 permission=[{"object": "model_permission"}]),
        }  # fmt: skip
    if kind == "openai":
        return {"/health": (200, b"ok"), "/v1/models": models("gpt-oss-20b", "system")}
    raise ValueError(kind)


class FakeServers:
    """A fake ``Get`` over several servers, by base URL; records every (base URL, path) asked."""

    def __init__(self, servers: Mapping[str, dict[str, Answer]]) -> None:
        self.servers = dict(servers)
        self.calls: list[tuple[str, str]] = []
        self.down: set[str] = set()
        self.slow: dict[tuple[str, str], float] = {}  # (base URL, path) -> seconds before it answers

    async def __call__(self, base_url: str, path: str) -> tuple[int, bytes]:
        self.calls.append((base_url, path))
        if base_url in self.down:
            raise ConnectionRefusedError(f"{base_url} refused")
        if (delay := self.slow.get((base_url, path))) is not None:
            await asyncio.sleep(delay)
        answer = self.servers[base_url].get(path)
        if answer is None:
            return js({"detail": "Not Found"}, 404)
        return answer() if callable(answer) else answer

    def count(self, base_url: str, path: str) -> int:
        return self.calls.count((base_url, path))


KINDS = ("kvgate", "vllm", "sglang", "trtllm", "tgi", "lmdeploy", "mii", "openai")
