from __future__ import annotations

from datetime import datetime

import pytest

from kvgate_core.tokenize.chat_template import ChatTemplate, ChatTemplateError, normalize_messages

USER = [{"role": "user", "content": "Hi"}]


def test_default_template_is_chatml() -> None:
    text = ChatTemplate().render([{"role": "system", "content": "S"}, *USER])
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_default_template_without_generation_prompt() -> None:
    assert ChatTemplate().render(USER, add_generation_prompt=False) == "<|im_start|>user\nHi<|im_end|>\n"


def test_default_template_renders_tools_in_the_system_turn() -> None:
    tool = {"type": "function", "function": {"name": "f", "description": "café"}}
    text = ChatTemplate().render([{"role": "system", "content": "S"}, *USER], tools=[tool])
    assert text.startswith(
        '<|im_start|>system\nS\n\n# Tools\n{"type": "function", "function": {"name": "f", '
    )
    assert '"description": "café"' in text  # tojson does not escape non-ASCII or HTML characters
    assert text.count("<|im_start|>system") == 1


def test_default_template_renders_tool_calls_and_null_content() -> None:
    call = [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    text = ChatTemplate().render([*USER, {"role": "assistant", "content": None, "tool_calls": call}])
    assert '<|im_start|>assistant\n\n[{"id": "1"' in text


def test_template_variables_special_tokens_and_kwargs() -> None:
    src = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}{{ flavour }}"
    tmpl = ChatTemplate(src, special_tokens={"bos_token": "<s>", "eos_token": "</s>"})
    assert tmpl.render(USER, extra={"flavour": "!"}) == "<s>Hi</s>!"


def test_extra_kwargs_cannot_override_messages() -> None:
    tmpl = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert tmpl.render(USER, extra={"messages": [{"role": "user", "content": "evil"}]}) == "Hi"


def test_raise_exception_becomes_a_client_error() -> None:
    tmpl = ChatTemplate(
        "{% if messages[0].role != 'system' %}{{ raise_exception('system first!') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="system first!"):
        tmpl.render(USER)


def test_sandbox_blocks_python_internals() -> None:
    tmpl = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        tmpl.render(USER)


def test_immutable_sandbox_blocks_mutating_inputs() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    tmpl = ChatTemplate("{{ messages.append({'role': 'x'}) }}")
    with pytest.raises(ChatTemplateError):
        tmpl.render(messages)
    assert messages == [{"role": "user", "content": "Hi"}]


def test_type_errors_become_client_errors() -> None:
    tmpl = ChatTemplate("{{ 'a' + messages[0].content }}")
    with pytest.raises(ChatTemplateError):
        tmpl.render([{"role": "assistant", "content": None}])


def test_strftime_now_uses_the_injected_clock() -> None:
    tmpl = ChatTemplate("{{ strftime_now('%d %b %Y') }}", now=lambda: datetime(2026, 1, 2))
    assert tmpl.render(USER) == "02 Jan 2026"


def test_loop_controls_and_generation_block() -> None:
    src = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    assert ChatTemplate(src).render([*USER, {"role": "user", "content": "no"}]) == "Hi"


def test_template_that_does_not_compile_fails_at_load() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")


def test_normalize_joins_text_parts() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert normalize_messages([{"role": "user", "content": parts}]) == [{"role": "user", "content": "a\nb"}]


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hi",
        [{"content": "no role"}],
        [{"role": "user", "content": 3}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    ],
    ids=["empty", "not-a-list", "no-role", "bad-content", "image-part"],
)
def test_normalize_rejects_bad_messages(messages: object) -> None:
    with pytest.raises(ChatTemplateError):
        normalize_messages(messages)
