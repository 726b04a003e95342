"""A fake SGLang 0.5.23 server (``python -m sglang.launch_server``), after its own source (the files read: docs/engines.md).

Version: SGLang 0.5.23 (the PyPI wheel, read 2026-10; docs/engines.md).

Reproduces:

- ``GET /v1/models`` (``owned_by: "sglang"``, ``root`` = model path, ``max_model_len``), ``/v1/models/{id}``;
  ``model`` in requests is not checked (lenient).
- ``GET /health`` (200, empty), ``/health_generate`` (runs a one-token generation), ``/server_info`` (the
  server arguments flattened, ``page_size``, ``kv_events_config`` as the JSON string it was given,
  ``max_total_num_tokens``, ``internal_states``, ``version``), ``/model_info``.
- ``GET /v1/loads`` in its exact JSON shape (``timestamp``, ``version``, ``accelerator``,
  ``num_accelerators``, ``loads[]`` with the core keys, ``memory`` and ``queues`` sections; ``?include=core``,
  ``?dp_rank=``, ``?format=prometheus`` → ``sglang_<key>{dp_rank=…}`` gauges). ``/get_load`` is gone (404).
- Prometheus ``/metrics`` only with ``--enable-metrics`` (``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``, ``sglang:token_usage`` …); 404 otherwise.
- ``POST /v1/tokenize`` (alias ``/tokenize``) with ``prompt`` or ``messages`` → ``{tokens, count, max_model_len}``.
- ``cached_tokens`` (``usage.prompt_tokens_details``) only with ``--enable-cache-report``, else null; usage has
  a top-level ``reasoning_tokens``; a streaming usage chunk only with ``stream_options.include_usage``;
  chunks are dumped with their nulls (``usage: null``, ``matched_stop: null``); ids are bare uuid hex.
- Token-in: ``input_ids`` on the chat route; ``lora_path`` selects a LoRA (cache namespace, ``lora_name``).
- Mid-stream error: ``data: {"error": {"object": "error", "message", "type", "param", "code"}}`` then
  ``data: [DONE]``.
- KV events with ``--kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:P", ...}'`` (or the
  shorthand ``--events-port P``): ZMQ ``(topic, seq8, msgpack [ts, events, dp_rank])``, tagged-map
  ``BlockStored`` per page (``block_hashes`` [signed int64], ``parent_block_hash``, ``token_ids``,
  ``block_size`` = page size, ``lora_id``, ``medium``, ``cache_salt`` / ``lora_name`` when set),
  ``BlockRemoved``, ``AllBlocksCleared`` (``POST /flush_cache``), ROUTER replay (``replay_endpoint``).
- ``--page-size`` defaults to 1, as the CUDA backends resolve it.

- Data parallelism with ``--dp-size N``: N ranks, each its own cache and its own publisher (rank ``r`` on the
  configured port + ``r``, replay port + ``r``, ``r`` in every batch); requests go round robin, or to the
  rank their ``data_parallel_rank`` names; ``/server_info`` has ``dp_size`` and, with a ZMQ publisher, the
  ``kv_events`` descriptor (``endpoint_host``, ``endpoint_port_base``, ``replay_endpoint_port_base``,
  ``block_size``, ``dp_size``: ``srt/entrypoints/runtime_context.py``); ``/v1/loads`` one entry per rank.

Not reproduced: the native ``/generate`` API, sessions, PD, the real SHA-256 page hashes (hashes here are
this fake's own 64-bit chain, shown signed; consumers re-hash from ``token_ids``), ``extra_key`` in events
(SGLang leaves it out too).
"""

from __future__ import annotations

import argparse
import itertools
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kvgate_core.tokenize.request_prompt import parse_chat
from tests.support.engines import sglang_events
from tests.support.engines.core import FakeEngine, GenRequest
from tests.support.engines.oai_request import BadRequestError, Job
from tests.support.engines.oai_response import Formatter, Reply, json_response
from tests.support.engines.prom import Sample, metrics_response
from tests.support.engines.server import FakeServer, build_app, engine_config, read_json

NAME = "sglang"
VERSION = "0.5.23"
DEFAULT_MODEL = "sglang-fake"
CONTEXT_LENGTH = 32_768


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--page-size", type=int, default=1, help="KV page size (default 1, as on CUDA)")
    parser.add_argument("--enable-metrics", action="store_true", help="serve Prometheus /metrics")
    parser.add_argument("--enable-cache-report", action="store_true", help="report cached_tokens in usage")
    parser.add_argument(
        "--kv-events-config", default=None, help="JSON: publisher, endpoint, replay_endpoint…"
    )
    parser.add_argument("--events-port", type=int, default=None, help="shorthand: ZMQ PUB on tcp://*:PORT")
    parser.add_argument("--events-replay-port", type=int, default=None, help="with --events-port: ROUTER")
    parser.add_argument(
        "--dp-size", type=int, default=1, help="data-parallel ranks: one cache and one publisher each"
    )


class SGLangFormatter(Formatter):
    def __init__(self, cache_report: bool) -> None:
        self.cache_report = cache_report

    def choice(self, reply: Reply, text: str, finish: str | None, *, role: bool = False) -> dict[str, Any]:
        out = super().choice(reply, text, finish, role=role)
        if reply.chat:
            out["delta"] = {"role": "assistant" if role else None, "content": text, "reasoning_content": None,
                            "tool_calls": None}  # fmt: skip
        out["matched_stop"] = None
        return out

    def role_chunk(self, reply: Reply) -> dict[str, Any] | None:
        chunk = super().role_chunk(reply)
        return None if chunk is None else {**chunk, "usage": None}

    def token_chunk(self, reply: Reply, text: str, finish: str | None) -> dict[str, Any]:
        return {**super().token_chunk(reply, text, finish), "usage": None}

    def usage(self, reply: Reply) -> dict[str, Any] | None:
        base = super().usage(reply) or {}
        details = {"cached_tokens": reply.gen.cached_tokens} if self.cache_report else None
        return {**base, "prompt_tokens_details": details, "reasoning_tokens": 0}


def _loads(engines: Sequence[FakeEngine], request: Request) -> Response:
    include = {x.strip() for x in request.query_params.get("include", "").split(",") if x.strip()}
    ranks = range(len(engines))
    if (asked := request.query_params.get("dp_rank")) is not None:
        ranks = (
            range(int(asked), int(asked) + 1) if asked.isdigit() and int(asked) < len(engines) else range(0)
        )
    loads = [_rank_load(engines[r], r, include) for r in ranks]
    if request.query_params.get("format") == "prometheus":
        samples = []
        for load in loads:
            labels = {"dp_rank": str(load["dp_rank"])}
            flat = [(k, v) for k, v in load.items() if isinstance(v, int | float) and k != "dp_rank"]
            flat += [(f"{sec}_{k}", v) for sec in ("memory", "queues") for k, v in load.get(sec, {}).items()]
            samples += [Sample(f"sglang_{k}", v, labels=labels) for k, v in flat]
        return metrics_response(samples)
    return json_response({
        "timestamp": datetime.now(UTC).isoformat(), "version": VERSION, "accelerator": "NVIDIA H100 80GB HBM3",
        "num_accelerators": len(engines), "loads": loads,
    })  # fmt: skip


def _rank_load(engine: FakeEngine, rank: int, include: set[str]) -> dict[str, Any]:
    s = engine.stats()
    load: dict[str, Any] = {
        "dp_rank": rank, "num_running_reqs": s.running, "num_waiting_reqs": s.waiting,
        "num_waiting_uncached_tokens": s.waiting_tokens, "num_used_tokens": s.kv_used_tokens,
        "num_total_tokens": s.kv_tokens, "num_active_tokens": s.kv_used_tokens - s.cached_blocks * s.block_size,
        "max_total_num_tokens": s.kv_tokens, "max_running_requests": s.max_running,
        "token_usage": round(s.kv_usage, 4), "gen_throughput": round(s.gen_throughput, 2),
        "cache_hit_rate": round(s.cache_hit_rate, 4), "utilization": round(s.running / s.max_running, 4),
    }  # fmt: skip
    if include != {"core"}:
        load["memory"] = {
            "weight_gb": 0.27,
            "kv_cache_gb": 1.5,
            "graph_gb": 0.0,
            "token_capacity": s.kv_tokens,
        }
        load["queues"] = {
            "waiting": s.waiting,
            "grammar": 0,
            "paused": 0,
            "retracted": 0,
            "prealloc_ready": 0,
        }
    return load


def _metrics(engine: FakeEngine, model: str) -> Response:
    s = engine.stats()
    labels = {"model_name": model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
    gauges = {
        "num_running_reqs": s.running, "num_queue_reqs": s.waiting, "token_usage": s.kv_usage,
        "num_used_tokens": s.kv_used_tokens, "cache_hit_rate": s.cache_hit_rate,
        "utilization": s.running / s.max_running, "max_total_num_tokens": s.kv_tokens,
        "kv_used_tokens": s.kv_used_tokens, "kv_available_tokens": s.kv_tokens - s.kv_used_tokens,
        "kv_evictable_tokens": s.cached_blocks * s.block_size, "gen_throughput": s.gen_throughput,
    }  # fmt: skip
    counters = {"prompt_tokens_total": s.prompt_tokens_total, "generation_tokens_total": s.generation_tokens_total,
                "cached_tokens_total": s.cached_tokens_total, "num_requests_total": s.finished_total}  # fmt: skip
    samples = [Sample(f"sglang:{k}", v, labels=labels) for k, v in gauges.items()]
    samples += [Sample(f"sglang:{k}", v, kind="counter", labels=labels) for k, v in counters.items()]
    return metrics_response(samples)


def _server_info(args: argparse.Namespace, events_config: str | None, engine: FakeEngine) -> dict[str, Any]:
    s = engine.stats()
    info = {
        "model_path": args.model, "tokenizer_path": args.model, "served_model_name": args.model,
        "host": "127.0.0.1", "port": args.port, "page_size": args.page_size, "context_length": CONTEXT_LENGTH,
        "max_running_requests": args.max_running, "enable_metrics": args.enable_metrics,
        "enable_cache_report": args.enable_cache_report, "kv_events_config": events_config,
        "disable_radix_cache": False, "chunked_prefill_size": 8192, "mem_fraction_static": 0.88,
        "max_total_num_tokens": s.kv_tokens, "max_req_input_len": CONTEXT_LENGTH - 5,
        "internal_states": [{"last_gen_throughput": s.gen_throughput, "memory_usage": {"token_capacity": s.kv_tokens}}],
        "version": VERSION, "dp_size": args.dp_size,
    }  # fmt: skip
    described = sglang_events.descriptor(events_config, args.dp_size, args.page_size)
    if described is not None:
        info["kv_events"] = described
    return info


def _tokenize(engine: FakeEngine, body: object) -> Response:
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    if body.get("messages") is not None:
        ids = engine.bundle.encode(parse_chat(body))
    elif isinstance(body.get("prompt"), str):
        ids = engine.bundle.tokenizer.encode(
            body["prompt"], add_special_tokens=bool(body.get("add_special_tokens", True))
        )
    else:
        raise BadRequestError("either 'prompt' or 'messages' is required")
    return json_response({"tokens": ids, "count": len(ids), "max_model_len": CONTEXT_LENGTH})


def create_app(args: argparse.Namespace) -> Starlette:
    events_config = sglang_events.events_config(args)
    publishers = sglang_events.publishers_of(events_config, args.dp_size)
    config = engine_config(args, block_size=args.page_size)
    engines = [FakeEngine(config, publishers[r : r + 1]) for r in range(args.dp_size)]
    engine = engines[0]
    fmt = SGLangFormatter(args.enable_cache_report)
    turn = itertools.count()

    def pick(job: Job) -> FakeEngine:
        """The DP controller: the rank the request names (``data_parallel_rank``), else round robin."""
        rank = job.body.get("data_parallel_rank")
        if isinstance(rank, int) and 0 <= rank < len(engines):
            return engines[rank]
        return engines[next(turn) % len(engines)]

    def lora_of(job: Job) -> str | None:
        lora = job.body.get("lora_path")
        return lora if isinstance(lora, str) else None

    server = FakeServer(NAME, VERSION, engine, fmt, token_field="input_ids", lora_of=lora_of,
                        make_id=lambda _e: uuid.uuid4().hex, pick=pick)  # fmt: skip
    card = {"id": args.model, "object": "model", "created": 0, "owned_by": "sglang", "root": args.model,
            "max_model_len": CONTEXT_LENGTH}  # fmt: skip

    async def models(_: Request) -> Response:
        return json_response({"object": "list", "data": [card]})

    async def one_model(request: Request) -> Response:
        if request.path_params["model"] != args.model:
            return fmt.error_response(404, f"The model `{request.path_params['model']}` does not exist.")
        return json_response(card)

    async def health(_: Request) -> Response:
        return Response(status_code=503 if engine.faults.unhealthy else 200)

    async def health_generate(_: Request) -> Response:
        await engine.submit(GenRequest([1, 2, 3], 1)).collect()
        return Response(status_code=200)

    async def server_info(_: Request) -> Response:
        return json_response(_server_info(args, events_config, engine))

    async def model_info(_: Request) -> Response:
        return json_response({"model_path": args.model, "tokenizer_path": args.model, "is_generation": True})

    async def loads(request: Request) -> Response:
        return _loads(engines, request)

    async def metrics(_: Request) -> Response:
        if not args.enable_metrics:
            return json_response({"detail": "Not Found"}, 404)
        return _metrics(engine, args.model)

    async def tokenize(request: Request) -> Response:
        try:
            return _tokenize(engine, await read_json(request))
        except (BadRequestError, ValueError) as exc:
            return fmt.error_response(400, str(exc))

    async def flush_cache(_: Request) -> Response:
        for each in engines:
            each.reset()
        return Response("Cache flushed.\nPlease check backend logs for more details. (When there are running "
                        "or waiting requests, the operation will not be performed.)\n")  # fmt: skip

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        for publisher in publishers:
            publisher.start()
        try:
            yield
        finally:
            for publisher in publishers:
                await publisher.stop()

    routes = [
        Route("/v1/models", models), Route("/v1/models/{model:path}", one_model), Route("/health", health),
        Route("/health_generate", health_generate), Route("/server_info", server_info),
        Route("/model_info", model_info), Route("/v1/loads", loads), Route("/metrics", metrics),
        Route("/v1/tokenize", tokenize, methods=["POST"]), Route("/tokenize", tokenize, methods=["POST"]),
        Route("/flush_cache", flush_cache, methods=["POST", "GET"]),
    ]  # fmt: skip
    return build_app(server, routes, lifespan=lifespan)
