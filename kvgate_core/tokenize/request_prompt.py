"""The prompt of an OpenAI request body, parsed into one of three shapes (chat, text, token ids).

The gateway and the workers both parse with ``parse_prompt`` and tokenize with ``TokenizerBundle.encode``,
so they agree on what the engine sees. ``/v1/completions`` accepts a string, a list of token ids, or a batch
(a list of strings or of token-id lists): a batch is represented by its first prompt, which is what routing
hashes (the others share the worker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kvgate_core.tokenize.chat_template import normalize_messages
from kvgate_core.tokenize.responses_input import responses_messages, responses_tools


class Endpoint(StrEnum):
    """The OpenAI endpoint a prompt came through: it decides how the prompt is parsed and rendered."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    RESPONSES = "responses"  # the Responses API: rendered as the chat it stands for (``responses_input``)


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A chat conversation to render with the model's template."""

    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]] | None = None
    add_generation_prompt: bool = True
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TextPrompt:
    """A completion prompt given as text."""

    text: str


@dataclass(frozen=True, slots=True)
class TokenPrompt:
    """A completion prompt given as token ids (used as-is)."""

    token_ids: tuple[int, ...]


Prompt = ChatPrompt | TextPrompt | TokenPrompt


def parse_prompt(body: Mapping[str, Any], endpoint: Endpoint) -> Prompt:
    """The prompt of a request body.

    Raises:
        ValueError: the body has no usable prompt; the message is client-facing.
    """
    if endpoint is Endpoint.CHAT:
        return parse_chat(body)
    if endpoint is Endpoint.RESPONSES:
        return parse_responses(body)
    return parse_completion(body.get("prompt"))


def parse_responses(body: Mapping[str, Any]) -> ChatPrompt:
    """A Responses API body as the chat prompt the engine renders (``responses_input``)."""
    messages = normalize_messages(responses_messages(body))
    return ChatPrompt(messages, responses_tools(body), True, {})


def parse_chat(body: Mapping[str, Any]) -> ChatPrompt:
    """``messages``, ``tools``, ``add_generation_prompt`` and ``chat_template_kwargs`` of a chat body."""
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ValueError("'tools' must be an array of objects")
    add_generation_prompt = body.get("add_generation_prompt", True)
    if not isinstance(add_generation_prompt, bool):
        raise ValueError("'add_generation_prompt' must be a boolean")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ValueError("'chat_template_kwargs' must be an object")
    return ChatPrompt(normalize_messages(body.get("messages")), tools or None, add_generation_prompt, kwargs)


def parse_completion(prompt: object) -> TextPrompt | TokenPrompt:
    """A completions ``prompt``: a string, token ids, or a batch of either (its first element)."""
    if isinstance(prompt, str):
        return TextPrompt(prompt)
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return TextPrompt(first)
        if isinstance(first, list):
            return TokenPrompt(_token_ids(first))
        return TokenPrompt(_token_ids(prompt))
    raise ValueError("'prompt' must be a string, an array of token ids, or a non-empty array of those")


def _token_ids(values: list[Any]) -> tuple[int, ...]:
    if not values:
        raise ValueError("'prompt' must not be an empty array of token ids")
    for v in values:
        if type(v) is not int or not 0 <= v < 2**32:
            raise ValueError("'prompt' token ids must be integers in [0, 2**32)")
    return tuple(values)
