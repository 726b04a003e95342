"""Golden vectors of the KV contract (``kvgate_core/kvcontract/golden.json``); the worker tests check them too."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvgate_core.kvcontract.hashing import Xxh3ChainScheme, chain_hashes, root_hash
from kvgate_core.tokenize.bundle import byte_bundle
from kvgate_core.tokenize.request_prompt import ChatPrompt
from tests.unit.kvgate_core.kvcontract.golden_cases import GOLDEN, build, reference_hashes, reference_root

CASES: list[dict[str, Any]] = json.loads(GOLDEN.read_text(encoding="utf-8"))["cases"]


def test_golden_file_has_the_promised_coverage() -> None:
    sizes = {c["block_size"] for c in CASES}
    assert {4, 16} <= sizes
    assert any(c["extra_keys"] for c in CASES)
    assert any(len(c["tokens"]) % c["block_size"] for c in CASES if c["hashes"])  # a partial last block
    assert any(c.get("tokenizer") for c in CASES)


def test_golden_file_agrees_with_the_independent_reference() -> None:
    """Guards against regenerating the file from a broken implementation."""
    assert build()["cases"] == CASES


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_hashing_reproduces_golden_vectors(case: dict[str, Any]) -> None:
    root = root_hash(case["model"], case["extra_keys"])
    assert root == case["root"]
    assert chain_hashes(case["tokens"], root, case["block_size"]) == case["hashes"]
    assert Xxh3ChainScheme(case["block_size"]).block_hashes(case["tokens"], root) == case["hashes"]


@pytest.mark.parametrize("case", [c for c in CASES if c.get("tokenizer") == "bytes"], ids=lambda c: c["name"])
def test_byte_tokenizer_chat_vectors(case: dict[str, Any]) -> None:
    bundle = byte_bundle()
    prompt = ChatPrompt(case["messages"])
    assert bundle.render(prompt) == case["text"]
    assert bundle.encode(prompt) == case["tokens"]


def test_reference_helpers_match_the_contract_on_a_fresh_input() -> None:
    tokens = list(range(1000, 1037))
    root = reference_root("m", ["lora:x"])
    assert root == root_hash("m", ["lora:x"])
    assert reference_hashes(tokens, root, 8) == chain_hashes(tokens, root, 8)
