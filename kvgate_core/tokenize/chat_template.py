"""Sandboxed rendering of a model's Jinja chat template, the way Hugging Face ``apply_chat_template`` does.

The environment mirrors ``transformers``: ``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` extension,
a ``{% generation %}`` block that renders its body, ``raise_exception``, ``strftime_now`` and a ``tojson``
filter that does not HTML-escape. It is an ``ImmutableSandboxedEnvironment`` (attribute verdicts memoised): a
template cannot reach Python internals or mutate its inputs. Loading templates from files or GGUF metadata
lives in ``bundle``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, NoReturn

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvgate_core.kvcontract.media import TEXT_PART_TYPES, media_kind, media_marker

DEFAULT_CHAT_TEMPLATE: Final = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] + '\\n\\n' }}"
    "{%- endif %}"
    "{{- '# Tools\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{%- if message.get('tool_calls') %}{{- '\\n' + (message['tool_calls'] | tojson) }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML, used for tokenizers that ship no template (the byte tokenizer's special tokens are ChatML's)."""


class ChatTemplateError(ValueError):
    """The template cannot render these messages; the message is safe to show to the client."""


class _GenerationBlock(Extension):
    """``{% generation %}…{% endgeneration %}`` (transformers' assistant-mask marker): renders its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja's Extension API declares it as a class attribute)

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, its attribute verdicts memoised per (type of the object, attribute name).

    jinja's verdict reads nothing else: ``isinstance`` tests of the object's type against builtin types and
    the mutable-collection ABCs, and the attribute's name. A template asks for the same few attributes of
    every message (``loop.first``, ``message.get``), where each verdict costs a dozen ``isinstance`` checks:
    a fifth of the render time of a long chat.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._verdicts: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._verdicts[key] = super().is_safe_attribute(obj, attr, value)
        return verdict


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class ChatTemplate:
    """A compiled chat template.

    Args:
        source: the Jinja source (``tokenizer_config.json``'s ``chat_template`` or GGUF
            ``tokenizer.chat_template``); ``None`` means ``DEFAULT_CHAT_TEMPLATE``.
        special_tokens: variables such as ``bos_token``/``eos_token`` that templates read.
        now: clock behind ``strftime_now`` (injected for tests).

    Raises:
        ChatTemplateError: the source does not compile.
    """

    __slots__ = ("_now", "_source", "_special", "_template")

    def __init__(
        self,
        source: str | None = None,
        *,
        special_tokens: Mapping[str, str] | None = None,
        now: Callable[[], datetime] = datetime.now,
    ) -> None:
        self._source = source if source is not None else DEFAULT_CHAT_TEMPLATE
        self._special = dict(special_tokens or {})
        self._now = now
        env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = self._strftime_now
        try:
            self._template = env.from_string(self._source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc

    @property
    def source(self) -> str:
        return self._source

    def _strftime_now(self, fmt: str) -> str:
        return self._now().strftime(fmt)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """Render a conversation to the prompt text the engine tokenizes.

        Args:
            messages: chat messages, already normalised (``normalize_messages``).
            tools: OpenAI tool definitions, or None.
            add_generation_prompt: end with the assistant turn's opening.
            extra: further template variables (a request's ``chat_template_kwargs``); they cannot override
                ``messages``, ``tools`` or ``add_generation_prompt``.

        Raises:
            ChatTemplateError: the template rejects the messages (``raise_exception``, a type error, a
                sandbox violation).
        """
        variables: dict[str, Any] = {**self._special, **(extra or {})}
        variables.update(messages=messages, tools=tools or None, add_generation_prompt=add_generation_prompt)
        try:
            return self._template.render(**variables)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template error: {exc}") from exc
        except (TypeError, KeyError, IndexError, AttributeError, ValueError) as exc:
            raise ChatTemplateError(f"chat template cannot render these messages: {exc!r}") from exc


def normalize_messages(messages: object) -> list[dict[str, Any]]:
    """Validate OpenAI chat messages and flatten text content parts into one string per message.

    A list of ``{"type": "text", "text": ...}`` parts becomes the texts joined by newlines (as vLLM does);
    a media part (image, audio, video, file) becomes the marker of its identity where it stands
    (``kvgate_core.kvcontract.media``), so the prompt's hashes diverge from that part on;
    ``None`` content stays ``None`` (an assistant turn with only tool calls). Other keys are kept.

    Raises:
        ChatTemplateError: not a non-empty list of messages with a string ``role``, or a part of an unknown
            type or a media part with nothing to identify it by.
    """
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("'messages' must be a non-empty array")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ChatTemplateError(f"messages[{i}] must be an object with a string 'role'")
        content = message.get("content")
        if isinstance(content, list):
            message = {**message, "content": _join_text_parts(content, i)}
        elif content is not None and not isinstance(content, str):
            raise ChatTemplateError(f"messages[{i}].content must be a string, an array of parts or null")
        out.append(message)
    return out


def _join_text_parts(parts: list[Any], index: int) -> str:
    texts: list[str] = []
    for part in parts:
        if not isinstance(part, dict):
            raise ChatTemplateError(f"messages[{index}].content: every part must be an object")
        kind = part.get("type")
        if kind in TEXT_PART_TYPES and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif media_kind(part) is not None:
            try:
                texts.append(media_marker(part))
            except ValueError as exc:
                raise ChatTemplateError(f"messages[{index}].content: {exc}") from None
        else:
            raise ChatTemplateError(f"messages[{index}].content: unsupported content part {kind!r}")
    return "\n".join(texts)
