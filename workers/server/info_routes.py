"""The worker's non-generation routes: models, health, load, KV events and blocks, tokenizer.

``GET /kv/events`` is SSE of ``KVEvent`` JSON, one event per ``data:`` line. Unless ``?snapshot=0``, it
starts with a ``cleared`` event and a ``stored`` event of every cached block (per tier), taken atomically
with the subscription, so a consumer's view is exact from its first event on. A consumer too slow to keep
up is dropped (the stream ends) and reconnects for a fresh snapshot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from kvgate_core.kvcontract.events import EventType, KVEvent, Tier, encode_event
from kvgate_core.tokenize.request_prompt import Endpoint, parse_prompt
from workers.engine_api import Engine, EventSubscription
from workers.server.errors import ApiError, bad_request
from workers.server.generation import WorkerContext
from workers.server.openai_io import parse_body

KEEPALIVE_S = 15.0


def _json(doc: object, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status, media_type="application/json")


def _ctx(request: Request) -> WorkerContext:
    ctx: WorkerContext = request.app.state.worker
    return ctx


async def health(request: Request) -> Response:
    return _json({"status": "ok"})


async def models(request: Request) -> Response:
    ctx = _ctx(request)
    engine = ctx.engine
    card = {"id": engine.model_id, "object": "model", "created": 0, "owned_by": ctx.owned_by,
            "max_model_len": engine.max_model_len}  # fmt: skip
    return _json({"object": "list", "data": [card]})


async def load(request: Request) -> Response:
    engine = _ctx(request).engine
    return _json({"worker": engine.worker_id, "model": engine.model_id, **engine.load().to_dict()})


async def kv_blocks(request: Request) -> Response:
    engine = _ctx(request).engine
    tiers = {tier: list(hashes) for tier, hashes in engine.cached_block_hashes().items()}
    return _json({"worker": engine.worker_id, "model": engine.model_id, "block_size": engine.block_size,
                  "tiers": tiers})  # fmt: skip


async def kv_events(request: Request) -> Response:
    engine = _ctx(request).engine
    subscription = engine.subscribe()
    snapshot = _snapshot(engine) if request.query_params.get("snapshot", "1") not in ("0", "false") else []
    return StreamingResponse(_event_stream(subscription, snapshot), media_type="text/event-stream",
                             headers={"cache-control": "no-cache"})  # fmt: skip


def _snapshot(engine: Engine) -> list[KVEvent]:
    now = time.time()
    out: list[KVEvent] = []
    for tier_name, hashes in engine.cached_block_hashes().items():
        tier = Tier(tier_name)
        out.append(KVEvent(engine.worker_id, EventType.CLEARED, tier, (), now))
        if hashes:
            out.append(KVEvent(engine.worker_id, EventType.STORED, tier, tuple(hashes), now))
    return out


async def _event_stream(
    subscription: EventSubscription, snapshot: list[KVEvent]
) -> AsyncGenerator[bytes, None]:
    try:
        for event in snapshot:
            yield b"data: " + encode_event(event) + b"\n\n"
        while True:
            try:
                async with asyncio.timeout(KEEPALIVE_S):
                    event = await anext(subscription)
            except TimeoutError:
                yield b": keepalive\n\n"
                continue
            except StopAsyncIteration:
                return
            batch = [event, *subscription.drain()]
            yield b"".join(b"data: " + encode_event(e) + b"\n\n" for e in batch)
    finally:
        await subscription.aclose()


async def tokenize(request: Request) -> Response:
    """``{"prompt": str | [ids]}`` or ``{"messages": [...]}`` → ``{"tokens", "count", "max_model_len"}``."""
    ctx = _ctx(request)
    try:
        body = parse_body(await request.body())
        endpoint = Endpoint.CHAT if "messages" in body else Endpoint.COMPLETIONS
        try:
            tokens = ctx.bundle.encode(parse_prompt(body, endpoint))
        except ValueError as exc:
            raise bad_request(str(exc), "messages" if endpoint is Endpoint.CHAT else "prompt") from exc
    except ApiError as exc:
        return exc.response()
    return _json({"tokens": tokens, "count": len(tokens), "max_model_len": ctx.engine.max_model_len})


async def tokenizer(request: Request) -> Response:
    """The served tokenizer, chat template and special tokens (``TokenizerBundle.to_json``)."""
    return Response(_ctx(request).bundle.to_json(), media_type="application/json")
