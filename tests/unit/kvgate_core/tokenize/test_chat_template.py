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


def test_a_media_part_becomes_the_marker_of_its_identity_where_it_stands() -> None:
    def content(url: str) -> list[dict[str, object]]:
        return [
            {"type": "text", "text": "look:"},
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "what is it?"},
        ]

    (a,) = normalize_messages([{"role": "user", "content": content("https://x/cat.png")}])
    (b,) = normalize_messages([{"role": "user", "content": content("https://x/dog.png")}])
    (a2,) = normalize_messages([{"role": "user", "content": content("https://x/cat.png")}])
    assert a["content"].startswith("look:\n<|media:image:") and a["content"].endswith("|>\nwhat is it?")
    assert a == a2
    assert a["content"] != b["content"]
    assert a["content"].split("<|media")[0] == b["content"].split("<|media")[0]


def test_responses_api_parts_and_inline_data_are_accepted() -> None:
    parts = [
        {"type": "input_text", "text": "a"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "input_file", "file_id": "file-1"},
    ]
    (msg,) = normalize_messages([{"role": "user", "content": parts}])
    lines = msg["content"].split("\n")
    assert lines[0] == "a"
    assert [line.split(":")[1] for line in lines[1:]] == ["image", "audio", "file"]


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hi",
        [{"content": "no role"}],
        [{"role": "user", "content": 3}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
        [{"role": "user", "content": [{"type": "hologram", "hologram": "x"}]}],
        [{"role": "user", "content": ["a string part"]}],
    ],
    ids=["empty", "not-a-list", "no-role", "bad-content", "image-without-url", "unknown-part", "not-object"],
)
def test_normalize_rejects_bad_messages(messages: object) -> None:
    with pytest.raises(ChatTemplateError):
        normalize_messages(messages)


def test_remembered_sandbox_verdicts_block_again_on_every_render() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    tmpl = ChatTemplate(
        "{{ messages[0].get('role') }}{% if mutate %}{{ messages[0].update({'role': 'x'}) }}{% endif %}"
    )
    for _ in range(3):
        assert tmpl.render(messages, extra={"mutate": False}) == "user"
        with pytest.raises(ChatTemplateError):
            tmpl.render(messages, extra={"mutate": True})
    assert messages == [{"role": "user", "content": "Hi"}]
