"""``build_engine`` from ``kvgate worker`` flags (parsed by ``workers.cli``'s own parser)."""

from __future__ import annotations

import argparse

import pytest
import torch

from workers.cli import add_arguments
from workers.engine.config import ModelConfigError
from workers.engine.serve import build_engine


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_tiny_engine_from_cli_flags() -> None:
    engine = build_engine(_args("--model", "tiny", "--kv-tokens", "512", "--block-size", "8",
                                "--max-model-len", "100", "--port", "9123"))  # fmt: skip
    assert engine.model_id == "kvgate-tiny"
    assert engine.worker_id == "127.0.0.1:9123"
    assert engine.block_size == 8
    assert engine.max_model_len == 100
    assert engine.load().num_total_blocks == 64
    assert engine.bundle.tokenizer.vocab_size == 259


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--model", "/nonexistent/model"), "not 'tiny'"),
        (("--model", "tiny", "--kv-tokens", "4"), "less than one block"),
        (("--model", "tiny", "--block-size", "0"), "block-size"),
    ],
    ids=["missing-model", "kv-budget-below-a-block", "bad-block-size"],
)
def test_bad_flags_fail_with_a_message(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises((ValueError, ModelConfigError), match=message):
        build_engine(_args(*argv))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_device_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no CUDA device"):
        build_engine(_args("--model", "tiny", "--device", "cuda"))
