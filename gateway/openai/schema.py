"""Edge validation of OpenAI request bodies: parse once with orjson, check only what can go wrong.

Deliberately not pydantic: the proxy forwards the client's original bytes, so the gateway reads and
checks only the fields routing and safety need (model, messages/prompt, max_tokens, stream, a few types);
everything else (tools, response_format, logprobs, seed, …) reaches the worker untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from kvgate_core.tokenize.request_prompt import Endpoint

_NUMBER_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """The fields of a request body the gateway acts on, with the whole parsed body."""

    body: Mapping[str, Any]
    endpoint: Endpoint
    model: str
    stream: bool
    max_tokens: int | None
    session_id: str | None


def _fail(message: str, param: str | None) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise _fail("'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise _fail("'messages' must be a non-empty array of message objects", "messages")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise _fail(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]")


def _is_token_list(value: list[Any]) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def _check_prompt(prompt: Any) -> None:
    if prompt is None:
        raise _fail("'prompt' is required", "prompt")
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt) or _is_token_list(prompt):
            return
        if all(isinstance(p, list) and p and _is_token_list(p) for p in prompt):
            return
    raise _fail("'prompt' must be a string, an array of strings, or an array of token ids", "prompt")


def _max_tokens(body: Mapping[str, Any], limit: int) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise _fail(f"'{key}' must be an integer", key)
        if value < 1 or value > limit:
            raise _fail(f"'{key}' must be between 1 and {limit} (got {value})", key)
        return value
    return None


def _check_types(body: Mapping[str, Any]) -> None:
    for key in _NUMBER_FIELDS:
        value = body.get(key)
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise _fail(f"'{key}' must be a number", key)
    n = body.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128):
        raise _fail("'n' must be an integer between 1 and 128", "n")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _fail("'stream_options' must be an object", "stream_options")


def parse_request(raw: bytes, endpoint: Endpoint, *, max_tokens_limit: int) -> ParsedRequest:
    """Parse and check a chat/completions body.

    Raises:
        InvalidRequest: the body is not JSON, not an object, or a checked field is missing or wrong.
    """
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise _fail("the request body is not valid JSON", None) from None
    if not isinstance(body, dict):
        raise _fail("the request body must be a JSON object", None)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("'model' is required and must be a non-empty string", "model")
    if endpoint is Endpoint.CHAT:
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body.get("prompt"))
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _fail("'stream' must be a boolean", "stream")
    _check_types(body)
    user = body.get("user")
    return ParsedRequest(
        body=body,
        endpoint=endpoint,
        model=model,
        stream=stream,
        max_tokens=_max_tokens(body, max_tokens_limit),
        session_id=user if isinstance(user, str) else None,
    )
