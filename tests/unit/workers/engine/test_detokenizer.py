"""Incremental detokenization: multi-byte characters, stop strings cut and never streamed early."""

from __future__ import annotations

import pytest

from kvgate_core.tokenize.tokenizer import ByteTokenizer
from workers.engine.detokenizer import IncrementalDetokenizer


def _stream(text: str, stop: tuple[str, ...] = ()) -> tuple[list[str], str, bool]:
    detok = IncrementalDetokenizer(ByteTokenizer(), [104, 105], stop)
    deltas = []
    stopped = False
    for byte in text.encode("utf-8"):
        stopped = detok.add(byte)
        deltas.append(detok.take(final=stopped))
        if stopped:
            break
    if not stopped:
        deltas.append(detok.take(final=True))
    return deltas, "".join(deltas), stopped


def test_multibyte_characters_are_emitted_whole() -> None:
    deltas, text, stopped = _stream("héllo €!")
    assert text == "héllo €!"
    assert not stopped
    assert all("\ufffd" not in d for d in deltas)


@pytest.mark.parametrize(
    ("text", "stop", "expected"),
    [
        ("hello world. more", ("world",), "hello "),
        ("abc STOP def", ("STOP", "c S"), "ab"),
        ("no stop here", ("zzz",), "no stop here"),
        ("ends with st", ("stop",), "ends with st"),
    ],
    ids=["cut-at-stop", "earliest-of-two", "absent", "partial-at-end-is-flushed"],
)
def test_stop_strings_are_trimmed(text: str, stop: tuple[str, ...], expected: str) -> None:
    _, out, stopped = _stream(text, stop)
    assert out == expected
    assert stopped == (expected != text)


def test_a_stop_string_is_never_streamed_before_it_is_cut() -> None:
    deltas, _, _ = _stream("xx<END>yy", ("<END>",))
    streamed = ""
    for delta in deltas:
        streamed += delta
        assert "<" not in streamed
