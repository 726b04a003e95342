"""``usage_in_answer``: the usage of a whole JSON answer, read from its ``usage`` object alone where it can,
always equal to parsing the whole answer."""

from __future__ import annotations

import json
import random

import orjson
import pytest

from gateway.openai.sse import TokenUsage, usage_in_answer, usage_of

CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {
        "prompt_tokens": 40,
        "completion_tokens": 2,
        "total_tokens": 42,
        "prompt_tokens_details": {"cached_tokens": 32},
    },
}


PAD = b" " * 2100  # leading whitespace: the same answer, past the size parsed whole


def _both(body: bytes) -> TokenUsage | None:
    """The answer's usage, checked equal whole-parsed, read as a small answer and read as a large one."""
    try:
        whole = usage_of(orjson.loads(body))
    except orjson.JSONDecodeError:
        whole = None
    assert usage_in_answer(body) == whole
    assert usage_in_answer(PAD + body) == whole
    return whole


@pytest.mark.parametrize("dumps", [orjson.dumps, lambda o: json.dumps(o, indent=2).encode()])
def test_a_chat_answer_compact_or_pretty(dumps: object) -> None:
    assert _both(dumps(CHAT)) == TokenUsage(40, 32)  # type: ignore[operator]


def test_usage_before_other_keys_and_the_responses_shape() -> None:
    body = orjson.dumps({"usage": {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 0}}, "x": 1})
    assert _both(body) == TokenUsage(9, 0)


def test_no_usage_a_null_usage_and_a_usage_without_details() -> None:
    assert _both(orjson.dumps({"id": "x", "choices": []})) is None
    assert _both(orjson.dumps({**CHAT, "usage": None})) is None
    assert _both(orjson.dumps({**CHAT, "usage": {"prompt_tokens": 5}})) == TokenUsage(5, None)


def test_usage_named_inside_the_text_is_not_the_answers() -> None:
    text = 'see {"usage": {"prompt_tokens": 1}} and "usage":{ and }}}'
    body = orjson.dumps({**CHAT, "choices": [{"message": {"content": text}}]})
    assert _both(body) == TokenUsage(40, 32)
    body = orjson.dumps({"choices": [{"message": {"content": text}}]})  # no usage of its own
    assert _both(body) is None


def test_usage_nested_deeper_than_its_details_falls_back_to_the_whole_answer() -> None:
    deep = {**CHAT, "usage": {"prompt_tokens": 6, "x": {"y": {"z": 1}}}}
    assert _both(orjson.dumps(deep)) == TokenUsage(6, None)


def test_braces_inside_the_usage_object_fall_back_to_the_whole_answer() -> None:
    odd = {**CHAT, "usage": {"prompt_tokens": 7, "note": "}{", "prompt_tokens_details": {"cached_tokens": 3}}}
    assert _both(orjson.dumps(odd)) == TokenUsage(7, 3)


@pytest.mark.parametrize("body", [b"", b"not json", b'{"usage":', b'{"usage":{"prompt_tokens":1'])
def test_malformed_answers_give_none(body: bytes) -> None:
    assert usage_in_answer(body) is None
    assert usage_in_answer(PAD + body) is None


def test_a_broken_answer_around_a_sound_usage_object_still_gives_its_figures() -> None:
    assert usage_in_answer(PAD + b'"usage":{"prompt_tokens":4}}') == TokenUsage(4, None)


def test_random_answers_agree_with_a_whole_parse() -> None:
    rng = random.Random(7)
    pieces = ["usage", '"usage"', "{", "}", ":", "\\", '"', " ", "x", "\n"]
    for _ in range(300):
        content = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 30)))
        usage: object = rng.choice(
            [None, {"prompt_tokens": rng.randrange(100)}, {"input_tokens": 3, "input_tokens_details": {}}]
        )
        answer = {"choices": [{"message": {"content": content}}], "usage": usage}
        if rng.random() < 0.3:
            answer = {"usage": usage, "choices": answer["choices"], "tail": {"k": content}}
        _both(json.dumps(answer, indent=rng.choice([None, 1])).encode())
