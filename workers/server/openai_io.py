"""OpenAI request parsing into engine types, and response/SSE formatting from engine chunks.

Parsing reads only the fields the engine acts on and ignores the rest (``logprobs``, ``tools`` beyond the
template, ``user``…). Formatting splices orjson-encoded text into pre-built byte templates, so a streamed
chunk costs one small ``orjson.dumps`` and no dict building.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from kvgate_core.kvcontract.extra_keys import request_extra_keys
from kvgate_core.kvcontract.media import contains_media
from kvgate_core.tokenize.request_prompt import Endpoint, Prompt, parse_prompt
from workers.engine_api import GenerationChunk, SamplingParams
from workers.server.errors import ApiError, bad_request

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_N = 8  # most choices one chat/completions request may ask for
_CHAT_LIMITS = ("max_completion_tokens", "max_tokens")  # the first one present wins


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
    n: int = 1  # choices to generate (chat and completions)
    has_media: bool = False  # the prompt has image/audio/file parts

    def sampling(self, num_prompt_tokens: int, max_model_len: int) -> SamplingParams:
        """Sampling parameters; an absent limit fills the context (chat, responses) or is 16 (completions)."""
        max_tokens = self.max_tokens
        if max_tokens is None:
            room = max(1, max_model_len - num_prompt_tokens)
            is_completion = self.endpoint is Endpoint.COMPLETIONS
            max_tokens = min(room, COMPLETIONS_DEFAULT_MAX_TOKENS) if is_completion else room
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
    """Validate a chat, completions or responses body against what this worker serves.

    Raises:
        ApiError: 400 for a bad field, 404 for another model.
    """
    model = check_model(body, served_model)
    n = 1 if endpoint is Endpoint.RESPONSES else _n(body)
    prompt = body.get("prompt")
    is_batch = isinstance(prompt, list) and len(prompt) > 1 and isinstance(prompt[0], str | list)
    if endpoint is Endpoint.COMPLETIONS and is_batch:
        raise bad_request("batched prompts are not supported: send one prompt per request", "prompt")
    try:
        parsed_prompt = parse_prompt(body, endpoint)
    except ValueError as exc:
        raise bad_request(str(exc), prompt_param(endpoint)) from exc
    max_tokens = _max_tokens(body, endpoint)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    try:
        keys = request_extra_keys(body, tenant)  # lora, cache_salt, tenant: exactly as the gateway hashes
    except ValueError as exc:
        raise bad_request(str(exc), "lora" if "lora" in str(exc) else "cache_salt") from None
    return ParsedRequest(
        endpoint, parsed_prompt, model, _bool(body, "stream", False), _bool(options, "include_usage", False),
        max_tokens, keys, body, n, _has_media(body, endpoint),
    )  # fmt: skip


def check_model(body: Mapping[str, Any], served_model: str) -> str:
    """The body's ``model`` (default: the served one). Raises ``ApiError``: 400 not a string, 404 another."""
    model = body.get("model", served_model)
    if not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    if model != served_model:
        raise ApiError(404, f"the model '{model}' does not exist on this worker (it serves '{served_model}')",
                       param="model", code="model_not_found")  # fmt: skip
    return model


def prompt_param(endpoint: Endpoint) -> str:
    """The body field that holds an endpoint's prompt (the ``param`` of errors about it)."""
    return {Endpoint.CHAT: "messages", Endpoint.RESPONSES: "input"}.get(endpoint, "prompt")


def _n(body: Mapping[str, Any]) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if type(n) is not int or not 1 <= n <= MAX_N:
        raise bad_request(f"'n' must be an integer from 1 to {MAX_N}", "n")
    return n


def _max_tokens(body: Mapping[str, Any], endpoint: Endpoint) -> int | None:
    keys = ("max_output_tokens",) if endpoint is Endpoint.RESPONSES else _CHAT_LIMITS
    for key in keys:
        value = _optional_int(body, key)
        if value is not None:
            if value < 1:
                raise bad_request(f"'{key}' must be at least 1", key)
            return value
    return None


def _has_media(body: Mapping[str, Any], endpoint: Endpoint) -> bool:
    if endpoint is Endpoint.CHAT:
        return contains_media(body.get("messages"))
    return endpoint is Endpoint.RESPONSES and contains_media(body.get("input"))


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


def usage_dict(lasts: Sequence[GenerationChunk]) -> dict[str, Any]:
    """``usage`` of a request from each choice's last chunk: the prompt once, every choice's output."""
    first = lasts[0]
    completion = sum(chunk.num_output_tokens for chunk in lasts)
    return {
        "prompt_tokens": first.num_prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.num_prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.num_cached_tokens},
    }


class ResponseFormatter:
    """Builds the JSON of one response (SSE chunks or the whole body) for chat or completions.

    Each of the ``n`` choices has its own pre-built chunk head carrying its ``index``.
    """

    __slots__ = ("_chat", "_created", "_heads", "_id", "_mid", "_model", "_n", "_object")

    def __init__(
        self, endpoint: Endpoint, request_id: str, model: str, created: int | None = None, n: int = 1
    ) -> None:  # fmt: skip
        self._chat = endpoint is Endpoint.CHAT
        self._id = request_id
        self._model = model
        self._n = n
        self._created = int(time.time()) if created is None else created
        self._object = "chat.completion" if self._chat else "text_completion"
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        common = orjson.dumps({"id": request_id, "object": obj, "created": self._created, "model": model})
        field = b'"delta":{"content":' if self._chat else b'"text":'
        head = b"data: " + common[:-1] + b',"choices":[{"index":'
        self._heads = [head + str(i).encode() + b"," + field for i in range(n)]
        self._mid = (b"}" if self._chat else b"") + b',"logprobs":null,"finish_reason":'

    def sse_role(self) -> bytes:
        """The first chat chunk of every choice (the assistant role); completions have none."""
        if not self._chat:
            return b""
        role = b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        return b"".join(head[: -len(b'{"content":')] + role for head in self._heads)

    def sse_chunk(self, text: str, finish_reason: str | None, index: int = 0) -> bytes:
        fr = b"null" if finish_reason is None else orjson.dumps(finish_reason)
        return self._heads[index] + orjson.dumps(text) + self._mid + fr + b"}]}\n\n"

    def sse_usage(self, lasts: Sequence[GenerationChunk]) -> bytes:
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        doc = {"id": self._id, "object": obj, "created": self._created, "model": self._model, "choices": [],
               "usage": usage_dict(lasts)}  # fmt: skip
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    def full(self, texts: Sequence[str], lasts: Sequence[GenerationChunk]) -> bytes:
        """The whole (non-streamed) response: one choice per text, in index order."""
        choices: list[dict[str, Any]] = []
        for index, (text, last) in enumerate(zip(texts, lasts, strict=True)):
            choice: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": _finish(last)}
            if self._chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choices.append(choice)
        doc = {"id": self._id, "object": self._object, "created": self._created, "model": self._model,
               "choices": choices, "usage": usage_dict(lasts)}  # fmt: skip
        return orjson.dumps(doc)


def _finish(chunk: GenerationChunk) -> str | None:
    return None if chunk.finish_reason is None else chunk.finish_reason.value


SSE_DONE = b"data: [DONE]\n\n"
