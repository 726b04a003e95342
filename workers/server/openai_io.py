"""OpenAI request parsing into engine types, and response/SSE formatting from engine chunks.

Parsing reads only the fields the engine acts on and ignores the rest (``logprobs``, ``tools`` beyond the
template, ``user``…). Formatting splices orjson-encoded text into pre-built byte templates, so a streamed
chunk costs one small ``orjson.dumps`` and no dict building.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from kvgate_core.kvcontract.extra_keys import request_extra_keys
from kvgate_core.tokenize.request_prompt import Endpoint, Prompt, parse_prompt
from workers.engine_api import GenerationChunk, SamplingParams
from workers.server.errors import ApiError, bad_request

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What a chat or completions body asks for, before tokenization."""

    endpoint: Endpoint
    prompt: Prompt
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    extra_keys: tuple[str, ...]
    body: Mapping[str, Any]

    def sampling(self, num_prompt_tokens: int, max_model_len: int) -> SamplingParams:
        """Sampling parameters; an absent ``max_tokens`` fills the context (chat) or is 16 (completions)."""
        max_tokens = self.max_tokens
        if max_tokens is None:
            room = max(1, max_model_len - num_prompt_tokens)
            max_tokens = room if self.endpoint is Endpoint.CHAT else min(room, COMPLETIONS_DEFAULT_MAX_TOKENS)
        b = self.body
        stop = b.get("stop")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=_number(b, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(b, "top_p", 1.0, 0.0, 1.0),
            top_k=_int(b, "top_k", 0, -1),
            seed=_optional_int(b, "seed"),
            stop=(stop,) if isinstance(stop, str) else tuple(_str_list(b, "stop")),
            stop_token_ids=tuple(_int_list(b, "stop_token_ids")),
            ignore_eos=_bool(b, "ignore_eos", False),
        )


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body. Raises ``ApiError`` (400) otherwise."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


def parse_request(
    body: Mapping[str, Any], endpoint: Endpoint, served_model: str, tenant: str | None = None
) -> ParsedRequest:
    """Validate a chat/completions body against what this worker serves.

    Raises:
        ApiError: 400 for a bad field, 404 for another model.
    """
    model = body.get("model", served_model)
    if not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    if model != served_model:
        raise ApiError(404, f"the model '{model}' does not exist on this worker (it serves '{served_model}')",
                       param="model", code="model_not_found")  # fmt: skip
    n = body.get("n", 1)
    if n != 1 or type(n) is not int:
        raise bad_request("only n=1 is supported", "n")
    prompt = body.get("prompt")
    is_batch = isinstance(prompt, list) and len(prompt) > 1 and isinstance(prompt[0], str | list)
    if endpoint is Endpoint.COMPLETIONS and is_batch:
        raise bad_request("batched prompts are not supported: send one prompt per request", "prompt")
    try:
        parsed_prompt = parse_prompt(body, endpoint)
    except ValueError as exc:
        raise bad_request(str(exc), "messages" if endpoint is Endpoint.CHAT else "prompt") from exc
    max_tokens = _optional_int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _optional_int(body, "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise bad_request("'max_tokens' must be at least 1", "max_tokens")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    try:
        keys = request_extra_keys(body, tenant)  # lora, cache_salt, tenant: exactly as the gateway hashes
    except ValueError as exc:
        raise bad_request(str(exc), "lora" if "lora" in str(exc) else "cache_salt") from None
    return ParsedRequest(
        endpoint, parsed_prompt, model, _bool(body, "stream", False), _bool(options, "include_usage", False),
        max_tokens, keys, body,
    )  # fmt: skip


# -- field validation ------------------------------------------------------------------------------------


def _bool(b: Mapping[str, Any], key: str, default: bool) -> bool:
    v = b.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"'{key}' must be a boolean", key)
    return v


def _optional_int(b: Mapping[str, Any], key: str) -> int | None:
    v = b.get(key)
    if v is not None and (type(v) is not int):
        raise bad_request(f"'{key}' must be an integer", key)
    return v


def _int(b: Mapping[str, Any], key: str, default: int, low: int) -> int:
    v = _optional_int(b, key)
    if v is not None and v < low:
        raise bad_request(f"'{key}' must be at least {low}", key)
    return default if v is None else v


def _number(b: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    v = b.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not low <= v <= high:
        raise bad_request(f"'{key}' must be a number in [{low}, {high}]", key)
    return float(v)


def _str_list(b: Mapping[str, Any], key: str) -> list[str]:
    v = b.get(key) or []
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
        raise bad_request(f"'{key}' must be a string or an array of non-empty strings", key)
    return v


def _int_list(b: Mapping[str, Any], key: str) -> list[int]:
    v = b.get(key) or []
    if not isinstance(v, list) or not all(type(i) is int for i in v):
        raise bad_request(f"'{key}' must be an array of integers", key)
    return v


# -- formatting -----------------------------------------------------------------------------------------


def usage_dict(chunk: GenerationChunk) -> dict[str, Any]:
    return {
        "prompt_tokens": chunk.num_prompt_tokens,
        "completion_tokens": chunk.num_output_tokens,
        "total_tokens": chunk.num_prompt_tokens + chunk.num_output_tokens,
        "prompt_tokens_details": {"cached_tokens": chunk.num_cached_tokens},
    }


class ResponseFormatter:
    """Builds the JSON of one response (SSE chunks or the whole body) for chat or completions."""

    __slots__ = ("_chat", "_created", "_head", "_id", "_mid", "_model", "_object")

    def __init__(self, endpoint: Endpoint, request_id: str, model: str, created: int | None = None) -> None:
        self._chat = endpoint is Endpoint.CHAT
        self._id = request_id
        self._model = model
        self._created = int(time.time()) if created is None else created
        self._object = "chat.completion" if self._chat else "text_completion"
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        common = orjson.dumps({"id": request_id, "object": obj, "created": self._created, "model": model})
        field = b'"delta":{"content":' if self._chat else b'"text":'
        self._head = b"data: " + common[:-1] + b',"choices":[{"index":0,' + field
        self._mid = (b"}" if self._chat else b"") + b',"logprobs":null,"finish_reason":'

    def sse_role(self) -> bytes:
        """The first chat chunk (the assistant role); completions have none."""
        if not self._chat:
            return b""
        return (
            self._head[: -len(b'{"content":')]
            + b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def sse_chunk(self, text: str, finish_reason: str | None) -> bytes:
        fr = b"null" if finish_reason is None else orjson.dumps(finish_reason)
        return self._head + orjson.dumps(text) + self._mid + fr + b"}]}\n\n"

    def sse_usage(self, last: GenerationChunk) -> bytes:
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        doc = {"id": self._id, "object": obj, "created": self._created, "model": self._model, "choices": [],
               "usage": usage_dict(last)}  # fmt: skip
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    def full(self, text: str, last: GenerationChunk) -> bytes:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": _finish(last)}
        if self._chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        doc = {"id": self._id, "object": self._object, "created": self._created, "model": self._model,
               "choices": [choice], "usage": usage_dict(last)}  # fmt: skip
        return orjson.dumps(doc)


def _finish(chunk: GenerationChunk) -> str | None:
    return None if chunk.finish_reason is None else chunk.finish_reason.value


SSE_DONE = b"data: [DONE]\n\n"
