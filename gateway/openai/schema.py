"""Edge validation of OpenAI request bodies: parse once with orjson, check only what can go wrong.
Compiled with mypyc (``docs/development.md``: what that rules out).

Deliberately not pydantic: the proxy forwards the client's original bytes, so the gateway reads and
checks only the fields routing and safety need (model, messages/prompt/input, max_tokens, stream, a few
types); everything else (tools, response_format, logprobs, seed, n, …) reaches the worker untouched.

Each body arrives on a ``Route``: how the gateway places it (cache-aware on its prompt, or load-balanced),
the path it goes to upstream and how its stream ends (``Framing``). ``parse_request`` reads the prompt
routes (chat, completions, the Responses API), ``parse_balanced`` the others (embeddings and the declared
pass-through routes of ``gateway.openai.routes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from gateway.errors import InvalidRequest
from gateway.openai.parsed import (
    CHAT_ROUTE,
    COMPLETIONS_ROUTE,
    PROMPT_ROUTES,
    RESPONSES_ROUTE,
    Framing,
    Route,
)
from kvgate_core.tokenize.request_prompt import Endpoint

__all__ = [
    "CHAT_ROUTE",
    "COMPLETIONS_ROUTE",
    "PROMPT_ROUTES",
    "RESPONSES_ROUTE",
    "Framing",
    "ParsedRequest",
    "Route",
    "parse_balanced",
    "parse_request",
]


class ParsedRequest:
    """The fields of a request body the gateway acts on, with the whole parsed body.

    ``endpoint`` is None on a load-balanced route (no prompt to hash); ``model`` is then "" when the body
    named none. ``previous_response_id``: a Responses API request continuing a response stored on the
    worker that created it (the gateway sends it there). A plain class compiled with the parser, its fields
    ``Final``: built once and read a dozen times per request, from C (``kvgate_core.native``).
    """

    __slots__ = (
        "body", "endpoint", "max_tokens", "model", "previous_response_id", "route", "session_id", "stream",
    )  # fmt: skip

    def __init__(
        self,
        body: Mapping[str, Any],
        endpoint: Endpoint | None,
        model: str,
        stream: bool,
        max_tokens: int | None,
        session_id: str | None,
        route: Route = CHAT_ROUTE,
        previous_response_id: str | None = None,
    ) -> None:
        self.body: Final = body
        self.endpoint: Final = endpoint
        self.model: Final = model
        self.stream: Final = stream
        self.max_tokens: Final = max_tokens
        self.session_id: Final = session_id
        self.route: Final = route
        self.previous_response_id: Final = previous_response_id

    def __repr__(self) -> str:
        return (
            f"ParsedRequest(route={self.route.label!r}, model={self.model!r}, stream={self.stream}, "
            f"max_tokens={self.max_tokens}, session_id={self.session_id!r}, "
            f"previous_response_id={self.previous_response_id!r})"
        )


_NUMBER_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_MAX_ID_LENGTH: Final = 256


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
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
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


def _load_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise _fail("the request body is not valid JSON", None) from None
    if not isinstance(body, dict):
        raise _fail("the request body must be a JSON object", None)
    return body


def _stream(body: Mapping[str, Any]) -> bool:
    stream = body.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise _fail("'stream' must be a boolean", "stream")
    return stream


def _check_input(body: Mapping[str, Any]) -> str | None:
    """The Responses API's ``input`` / ``instructions`` shapes; its ``previous_response_id``, if any."""
    previous = body.get("previous_response_id")
    if previous is not None and (
        not isinstance(previous, str) or not previous or len(previous) > _MAX_ID_LENGTH or "/" in previous
    ):
        raise _fail("'previous_response_id' must be a response id", "previous_response_id")
    items = body.get("input")
    if items is None:
        raise _fail("'input' is required", "input")
    if not isinstance(items, str) and not (isinstance(items, list) and items):
        raise _fail("'input' must be a string or a non-empty array of input items", "input")
    if isinstance(items, list):
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise _fail(f"input[{i}] must be an object", f"input[{i}]")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _fail("'instructions' must be a string", "instructions")
    return previous


def parse_request(raw: bytes, endpoint: Endpoint, *, max_tokens_limit: int) -> ParsedRequest:
    """Parse and check a chat / completions / Responses API body.

    Raises:
        InvalidRequest: the body is not JSON, not an object, or a checked field is missing or wrong.
    """
    body = _load_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("'model' is required and must be a non-empty string", "model")
    previous = None
    if endpoint is Endpoint.CHAT:
        _check_messages(body.get("messages"))
    elif endpoint is Endpoint.RESPONSES:
        previous = _check_input(body)
    else:
        _check_prompt(body.get("prompt"))
    stream = _stream(body)
    _check_types(body)
    user = body.get("user")
    return ParsedRequest(
        body=body,
        endpoint=endpoint,
        model=model,
        stream=stream,
        max_tokens=_max_tokens(body, max_tokens_limit),
        session_id=user if isinstance(user, str) else None,
        route=PROMPT_ROUTES[endpoint],
        previous_response_id=previous,
    )


def parse_balanced(raw: bytes, route: Route, *, require_model: bool) -> ParsedRequest:
    """Parse a body for a load-balanced route (embeddings, pass-through): a JSON object whose ``model``, when
    present, is a non-empty string; nothing else is read.

    Raises:
        InvalidRequest: not a JSON object, a bad ``model``, or none where ``require_model``.
    """
    body = _load_object(raw) if raw.strip() else {}
    model = body.get("model")
    if model is None and not require_model:
        model = ""
    elif not isinstance(model, str) or not model:
        raise _fail("'model' is required and must be a non-empty string", "model")
    stream = body.get("stream") is True
    user = body.get("user")
    return ParsedRequest(
        body=body, endpoint=None, model=model, stream=stream, max_tokens=None,
        session_id=user if isinstance(user, str) else None, route=route,
    )  # fmt: skip
