"""``kvgate worker`` flags and engine construction (without serving)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvgate_core.tokenize.tokenizer import HFTokenizer
from workers import cli
from workers.engine_api import GenerationRequest, SamplingParams


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_sim_defaults():
    engine = cli._build_sim(_args("--sim", "--port", "9100"))
    assert engine.model_id == "kvgate-sim"
    assert engine.worker_id == "127.0.0.1:9100"
    assert engine.block_size == 16
    assert engine.load().num_total_blocks == 1_048_576 // 16


async def test_sim_with_a_tokenizer_file_speaks_its_vocabulary(tiny_tokenizer_path: Path):
    args = _args("--sim", "--tokenizer", str(tiny_tokenizer_path), "--model-name", "m", "--kv-tokens", "1024",
                 "--decode-tps", "100000", "--prefill-tps", "1000000", "--max-model-len", "512")  # fmt: skip
    engine = cli._build_sim(args)
    assert isinstance(engine.bundle.tokenizer, HFTokenizer)
    assert engine.max_model_len == 512
    await engine.start()
    try:
        prompt = tuple(engine.bundle.tokenizer.encode("The quick brown fox"))
        stream = engine.generate(
            GenerationRequest("r", prompt, SamplingParams(max_tokens=12, ignore_eos=True))
        )
        chunks = [c async for c in stream]
    finally:
        await engine.stop()
    ids = [t for c in chunks for t in c.token_ids]
    assert len(ids) == 12
    assert "".join(c.text for c in chunks) == engine.bundle.tokenizer.decode(ids)


def test_bad_tokenizer_path_is_a_clear_startup_error(capsys: pytest.CaptureFixture[str]):
    assert cli.run(_args("--sim", "--tokenizer", "/no/such/tokenizer.json")) == 2
    assert "no such file" in capsys.readouterr().err


def test_missing_real_engine_is_a_clear_startup_error(monkeypatch: pytest.MonkeyPatch, capsys):
    def missing(name: str) -> object:
        raise ModuleNotFoundError(f"No module named {name!r}", name="torch")

    monkeypatch.setattr(cli.importlib, "import_module", missing)
    assert cli.run(_args("--model", "tiny")) == 2
    assert "kvgate[worker]" in capsys.readouterr().err
