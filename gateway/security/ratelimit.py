"""Per-key request and token rate limits as an ASGI middleware (429 with ``Retry-After``).

Applies to the routes that reach workers (``gateway.openai.routes.WORKER_PATHS``: completions, the Responses
API, embeddings, the pass-through routes). The key is the API key id set by the auth
middleware (or the client address when auth is off). Tokens charged up front are an estimate: the body's
bytes / 4 for the prompt plus its ``max_tokens`` (default 256), which keeps the check free of tokenizing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import orjson

from gateway.errors import RateLimited
from gateway.openai.routes import WORKER_PATHS
from gateway.security.buckets import BucketStore, Rate
from kvgate_core.asgi import ASGIApp, Message, Receive, Scope, Send

_LIMITED = WORKER_PATHS
_DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True, slots=True)
class RateLimits:
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None


def _client_key(scope: Scope) -> str:
    state = scope.get("state") or {}
    if "api_key_id" in state:
        return str(state["api_key_id"])
    client = scope.get("client") or ("unknown", 0)
    return f"ip:{client[0]}"


def estimate_tokens(body: bytes) -> int:
    """Prompt estimate (bytes / 4) plus the completion budget the body asks for."""
    max_tokens = _DEFAULT_MAX_TOKENS
    try:
        obj = orjson.loads(body)
        value = None
        if isinstance(obj, dict):
            value = obj.get("max_completion_tokens", obj.get("max_tokens", obj.get("max_output_tokens")))
        if isinstance(value, int) and value > 0:
            max_tokens = value
    except orjson.JSONDecodeError:
        pass
    return len(body) // 4 + max_tokens


async def _read_body(receive: Receive) -> tuple[bytes, list[Message]]:
    chunks: list[bytes] = []
    messages: list[Message] = []
    while True:
        msg = await receive()
        messages.append(msg)
        if msg["type"] != "http.request":
            break
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            break
    return b"".join(chunks), messages


class RateLimitMiddleware:
    """Answers 429 ``rate_limit_exceeded`` with ``Retry-After`` when a key's bucket is empty."""

    def __init__(self, app: ASGIApp, limits: RateLimits, buckets: BucketStore) -> None:
        self.app = app
        self.limits = limits
        self.buckets = buckets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in _LIMITED or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        key = _client_key(scope)
        wait = 0.0
        if self.limits.requests_per_minute:
            wait = await self.buckets.take(f"{key}:req", 1, Rate(self.limits.requests_per_minute))
        if wait == 0.0 and self.limits.tokens_per_minute:
            body, replay = await _read_body(receive)
            wait = await self.buckets.take(
                f"{key}:tok", estimate_tokens(body), Rate(self.limits.tokens_per_minute)
            )
            receive = _replaying(replay, receive)
        if wait > 0.0:
            retry = max(1, math.ceil(wait))
            raise RateLimited(f"Rate limit reached; retry in {retry} s.", retry_after_s=retry)
        await self.app(scope, receive, send)


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
