"""A Responses API request as the chat conversation an engine renders."""

from __future__ import annotations

from typing import Any

import pytest

from kvgate_core.tokenize.request_prompt import ChatPrompt, Endpoint, parse_prompt
from kvgate_core.tokenize.responses_input import responses_messages, responses_tools


def test_a_string_input_with_instructions() -> None:
    body = {"instructions": "Be brief.", "input": "Hello"}
    assert responses_messages(body) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
    ]


def test_items_become_chat_turns() -> None:
    body = {
        "input": [
            {"role": "developer", "content": "rules"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "assistant", "content": [{"type": "output_text", "text": "It rains."}]},
        ]
    }
    messages = responses_messages(body)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    call = messages[2]["tool_calls"][0]
    assert call == {
        "id": "c1",
        "type": "function",
        "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
    }
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "rain"}
    prompt = parse_prompt(body, Endpoint.RESPONSES)
    assert isinstance(prompt, ChatPrompt)
    assert prompt.messages[1]["content"] == "weather?"  # parts flattened as chat's are


def test_function_tools_take_chats_shape_and_built_ins_are_left_out() -> None:
    tools = [
        {"type": "function", "name": "weather", "description": "d", "parameters": {"type": "object"}},
        {"type": "web_search_preview"},
    ]
    assert responses_tools({"tools": tools}) == [
        {
            "type": "function",
            "function": {"name": "weather", "description": "d", "parameters": {"type": "object"}},
        }
    ]
    assert responses_tools({}) is None


@pytest.mark.parametrize(
    "body",
    [
        {"input": 3},
        {"input": []},
        {"input": [{"role": "wizard", "content": "x"}]},
        {"input": [{"type": "function_call", "name": "f"}]},
        {"input": [{"type": "hologram"}]},
        {"input": ["not an object"]},
        {"input": "x", "instructions": 5},
        {"input": [{"type": "reasoning"}]},
    ],
)
def test_bad_inputs_are_client_errors(body: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        responses_messages(body)
