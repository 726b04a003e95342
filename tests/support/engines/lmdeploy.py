"""A fake LMDeploy ``lmdeploy serve api_server``, after its own source (the files read: docs/engines.md).

Version: LMDeploy 0.16-0.18 (``main`` @ 1263d5c, 2026-08, tag v0.16.0; PyPI 0.18.0):
``lmdeploy/serve/openai/**``, ``lmdeploy/metrics/loggers.py``.

Reproduces:

- ``GET /v1/models`` (``owned_by: "lmdeploy"``, ``root``, ``parent``, ``permission``); a ``model`` other than
  the served name is taken as an adapter name and served by the base model.
- ``GET /health`` → ``{"status": "healthy", "message"}`` (200); ``GET /is_sleeping``.
- Prometheus ``/metrics`` on by default (``--disable-metrics`` removes it): gauges
  ``lmdeploy:num_requests_running``, ``lmdeploy:num_requests_waiting``, ``lmdeploy:num_api_requests_waiting``,
  ``lmdeploy:num_api_requests_routed``, ``lmdeploy:gpu_cache_usage_perc`` (0-1),
  ``lmdeploy:prefix_cache_hit_rate``, counters ``lmdeploy:prompt_tokens_total``,
  ``lmdeploy:cached_tokens_total``, ``lmdeploy:generation_tokens_total``; labels ``model_name``, ``engine``.
- ``POST /v1/encode {"input": str | [str], "do_preprocess": false, "add_bos": true}`` → ``{"input_ids",
  "length"}`` (``do_preprocess`` wraps one string as a user turn in the template; ``add_bos`` adds the BOS).
- Prefix caching **off** unless ``--enable-prefix-caching``; block ``--cache-block-seq-len`` 64. Usage always
  has ``prompt_tokens_details.cached_tokens`` (0 without prefix caching) and
  ``completion_tokens_details.reasoning_tokens``; a streaming usage chunk only with ``include_usage``.
- Response ids are the session ids ("1", "2" …). Token-in: ``input_ids`` when ``messages`` is empty (both:
  400). Mid-stream error ``data: {"error": {"message", "type", "code", "param"}}`` then ``data: [DONE]``.

Not reproduced: ``/generate``, ``/pooling``, ``/get_ppl``, sessions kept across requests, sleep/wakeup,
PD (``/distserve``), LMDeploy's own chat-template registry (the byte tokenizer's ChatML is used).
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kvgate_core.tokenize.request_prompt import ChatPrompt
from tests.support.engines.core import BOS_ID, FakeEngine
from tests.support.engines.oai_request import Job
from tests.support.engines.oai_response import Formatter, Reply, json_response, permission_model_list
from tests.support.engines.prom import Sample, metrics_response
from tests.support.engines.server import FakeServer, build_app, engine_config, read_json

NAME = "lmdeploy"
VERSION = "0.18.0"
DEFAULT_MODEL = "lmdeploy-fake"


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-block-seq-len", type=int, default=64, help="KV block size (default 64)")
    parser.add_argument("--enable-prefix-caching", action="store_true", help="reuse cached prefixes")
    parser.add_argument("--disable-metrics", action="store_true", help="no Prometheus /metrics")


class LmdeployFormatter(Formatter):
    def usage(self, reply: Reply) -> dict[str, Any] | None:
        base = super().usage(reply) or {}
        return {**base, "prompt_tokens_details": {"cached_tokens": reply.gen.cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip

    def choice(self, reply: Reply, text: str, finish: str | None, *, role: bool = False) -> dict[str, Any]:
        out = super().choice(reply, text, finish, role=role)
        if reply.chat:
            out["delta"] = {
                "role": "assistant",
                "content": text,
                "reasoning_content": None,
                "tool_calls": None,
            }
        return out

    def token_chunk(self, reply: Reply, text: str, finish: str | None) -> dict[str, Any]:
        return {**super().token_chunk(reply, text, finish), "usage": None}

    def role_chunk(self, reply: Reply) -> dict[str, Any] | None:
        return None

    def error_event(self, message: str) -> dict[str, Any] | None:
        return {"error": {"message": message, "type": "internal_error", "code": 500, "param": None}}

    def error_response(self, status: int, message: str) -> Response:
        body = {
            "object": "error",
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": status,
        }
        return json_response(body, status)


def _metrics(engine: FakeEngine, model: str) -> Response:
    s = engine.stats()
    labels = {"model_name": model, "engine": "0"}
    gauges = {
        "num_requests_running": s.running, "num_requests_waiting": s.waiting, "num_api_requests_waiting": 0,
        "num_api_requests_routed": s.running + s.waiting, "gpu_cache_usage_perc": s.kv_usage,
        "prefix_cache_hit_rate": s.cache_hit_rate,
    }  # fmt: skip
    counters = {"prompt_tokens_total": s.prompt_tokens_total, "cached_tokens_total": s.cached_tokens_total,
                "generation_tokens_total": s.generation_tokens_total}  # fmt: skip
    samples = [Sample(f"lmdeploy:{k}", v, labels=labels) for k, v in gauges.items()]
    samples += [Sample(f"lmdeploy:{k}", v, kind="counter", labels=labels) for k, v in counters.items()]
    return metrics_response(samples)


def create_app(args: argparse.Namespace) -> Starlette:
    config = engine_config(
        args, block_size=args.cache_block_seq_len, prefix_caching=args.enable_prefix_caching
    )
    engine = FakeEngine(config)
    fmt = LmdeployFormatter()
    sessions = itertools.count(1)

    def check(job: Job) -> Response | None:
        if job.body.get("input_ids") is not None and job.body.get("messages"):
            return fmt.error_response(400, "input_ids cannot be used when messages is non-empty. "
                                           "messages takes priority.")  # fmt: skip
        return None

    server = FakeServer(NAME, VERSION, engine, fmt, token_field="input_ids", check=check,
                        make_id=lambda _e: str(next(sessions)))  # fmt: skip

    async def models(_: Request) -> Response:
        return json_response(permission_model_list(args.model, "lmdeploy"))

    async def health(_: Request) -> Response:
        if engine.faults.unhealthy:  # serve/openai/endpoints/management.py: 503 unless healthy or sleeping
            return json_response({"status": "unhealthy", "message": "Engine is unhealthy."}, 503)
        return json_response({"status": "healthy", "message": "Engine is healthy."})

    async def is_sleeping(_: Request) -> Response:
        return json_response({"is_sleeping": False})

    async def metrics(_: Request) -> Response:
        return _metrics(engine, args.model)

    def encode_one(text: str, preprocess: bool, add_bos: bool) -> list[int]:
        if preprocess:
            text = engine.bundle.render(ChatPrompt([{"role": "user", "content": text}]))
        ids = engine.bundle.tokenizer.encode(text)
        return [BOS_ID, *ids] if add_bos else ids

    async def encode(request: Request) -> Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("input"), str | list):
            return fmt.error_response(400, "'input' must be a string or a list of strings")
        pre, bos = bool(body.get("do_preprocess", False)), bool(body.get("add_bos", True))
        if isinstance(body["input"], str):
            ids = encode_one(body["input"], pre, bos)
            return json_response({"input_ids": ids, "length": len(ids)})
        batch = [encode_one(str(t), pre, bos) for t in body["input"]]
        return json_response({"input_ids": batch, "length": [len(x) for x in batch]})

    routes = [
        Route("/v1/models", models), Route("/health", health), Route("/is_sleeping", is_sleeping),
        Route("/v1/encode", encode, methods=["POST"]),
    ]  # fmt: skip
    if not args.disable_metrics:
        routes.append(Route("/metrics", metrics))
    return build_app(server, routes)
