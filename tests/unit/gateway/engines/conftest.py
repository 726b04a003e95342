"""The tokenizer fixtures of the shared floor's tests (the parity probe compares with the same bundles)."""

from tests.unit.kvgate_core.tokenize.conftest import smollm2, smollm2_gguf, tiny

__all__ = ["smollm2", "smollm2_gguf", "tiny"]
