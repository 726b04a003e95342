"""An OpenAI Responses API request (``POST /v1/responses``) as the chat conversation an engine renders.

The engines that serve the Responses API (vLLM, SGLang, TensorRT-LLM, LMDeploy) turn ``instructions`` and
``input`` into chat messages and render them with the model's chat template; the gateway does the same to
hash the prompt for cache-aware routing, and kvgate's workers do it to answer. The mapping:

- ``instructions`` → a leading ``system`` message;
- ``input`` as a string → one ``user`` message;
- ``input`` items: messages (``{"role", "content"}``, with or without ``"type": "message"``; ``developer``
  is rendered as ``system``, which is what chat templates know), ``function_call`` → an assistant turn with
  ``tool_calls``, ``function_call_output`` → a ``tool`` message; ``reasoning`` and ``item_reference`` items
  add nothing (the engine that stored them renders them; their text is not in the request);
- content parts: ``input_text`` / ``output_text`` / ``refusal`` text, media parts (``input_image``,
  ``input_file``, ``input_audio``) as identity markers (``kvgate_core.kvcontract.media``);
- ``tools``: function tools (flat in the Responses API) become chat's ``{"type": "function", "function":
  {...}}``; built-in tools (web search, file search …) are not rendered.

A request continuing a stored response (``previous_response_id``) renders only its new items here: the
history lives with the engine that stored it, which is where the gateway sends such a request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

_ROLES: Final = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_SILENT_ITEMS: Final = frozenset({"reasoning", "item_reference"})


def _message(item: Mapping[str, Any], index: int) -> dict[str, Any]:
    role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise ValueError(f"input[{index}].role must be one of 'user', 'assistant', 'system', 'developer'")
    content = item.get("content")
    if not isinstance(content, str | list):
        raise ValueError(f"input[{index}].content must be a string or an array of content parts")
    return {"role": role, "content": content}


def _function_call(item: Mapping[str, Any], index: int) -> dict[str, Any]:
    name, arguments = item.get("name"), item.get("arguments")
    if not isinstance(name, str) or not isinstance(arguments, str):
        raise ValueError(f"input[{index}]: a function_call needs a string 'name' and 'arguments'")
    call_id = item.get("call_id") or item.get("id") or f"call_{index}"
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _function_output(item: Mapping[str, Any], index: int) -> dict[str, Any]:
    output = item.get("output")
    if not isinstance(output, str | list):
        raise ValueError(f"input[{index}]: a function_call_output needs an 'output'")
    return {"role": "tool", "tool_call_id": item.get("call_id"), "content": output}


def _item(item: object, index: int) -> dict[str, Any] | None:
    if not isinstance(item, Mapping):
        raise ValueError(f"input[{index}] must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        return _message(item, index)
    if kind == "function_call":
        return _function_call(item, index)
    if kind == "function_call_output":
        return _function_output(item, index)
    if kind in _SILENT_ITEMS:
        return None
    raise ValueError(f"input[{index}]: unsupported item type {kind!r}")


def responses_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a Responses API request body (see the module docstring).

    Raises:
        ValueError: ``input`` or ``instructions`` has the wrong shape, or nothing is left to render
            (client-facing message).
    """
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ValueError("'instructions' must be a string")
        if instructions:
            messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for i, item in enumerate(items):
            message = _item(item, i)
            if message is not None:
                messages.append(message)
    elif items is not None:
        raise ValueError("'input' must be a string or an array of input items")
    if not messages:
        raise ValueError("'input' must hold at least one message")
    return messages


def responses_tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The request's function tools in chat's shape; None when it has none.

    Raises:
        ValueError: ``tools`` is not an array of objects.
    """
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
        raise ValueError("'tools' must be an array of objects")
    out = []
    for tool in tools:
        if tool.get("type") != "function":
            continue  # built-in tools are the engine's business
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        out.append({"type": "function", "function": function})
    return out or None
