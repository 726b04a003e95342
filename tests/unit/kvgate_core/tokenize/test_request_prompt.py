from __future__ import annotations

from typing import Any

import pytest

from kvgate_core.tokenize.request_prompt import ChatPrompt, Endpoint, TextPrompt, TokenPrompt, parse_prompt

MESSAGES = [{"role": "user", "content": "hi"}]


def test_chat_body_fields() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    body = {
        "messages": MESSAGES,
        "tools": tools,
        "add_generation_prompt": False,
        "chat_template_kwargs": {"x": 1},
    }
    assert parse_prompt(body, Endpoint.CHAT) == ChatPrompt(MESSAGES, tools, False, {"x": 1})


def test_chat_defaults() -> None:
    assert parse_prompt({"messages": MESSAGES, "tools": []}, Endpoint.CHAT) == ChatPrompt(
        MESSAGES, None, True, {}
    )


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("text", TextPrompt("text")),
        ([1, 2, 3], TokenPrompt((1, 2, 3))),
        (["first", "second"], TextPrompt("first")),
        ([[4, 5], [6]], TokenPrompt((4, 5))),
    ],
    ids=["string", "ids", "string-batch", "ids-batch"],
)
def test_completion_prompts(prompt: Any, expected: object) -> None:
    assert parse_prompt({"prompt": prompt}, Endpoint.COMPLETIONS) == expected


@pytest.mark.parametrize(
    ("body", "endpoint", "message"),
    [
        ({}, Endpoint.COMPLETIONS, "'prompt' must be"),
        ({"prompt": []}, Endpoint.COMPLETIONS, "'prompt' must be"),
        ({"prompt": [[]]}, Endpoint.COMPLETIONS, "empty array"),
        ({"prompt": [1, -1]}, Endpoint.COMPLETIONS, "token ids"),
        ({"prompt": [1, True]}, Endpoint.COMPLETIONS, "token ids"),
        ({"prompt": [1, 2**32]}, Endpoint.COMPLETIONS, "token ids"),
        ({"prompt": [1.5]}, Endpoint.COMPLETIONS, "token ids"),
        ({}, Endpoint.CHAT, "'messages'"),
        ({"messages": MESSAGES, "tools": "x"}, Endpoint.CHAT, "'tools'"),
        ({"messages": MESSAGES, "add_generation_prompt": 1}, Endpoint.CHAT, "add_generation_prompt"),
        ({"messages": MESSAGES, "chat_template_kwargs": "x"}, Endpoint.CHAT, "chat_template_kwargs"),
    ],
    ids=[
        "no-prompt",
        "empty",
        "empty-ids",
        "negative",
        "bool",
        "too-big",
        "float",
        "no-messages",
        "tools",
        "gen-prompt",
        "kwargs",
    ],
)
def test_bad_bodies_raise_client_errors(body: dict[str, Any], endpoint: Endpoint, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_prompt(body, endpoint)
