"""Train a tiny byte-level BPE tokenizer locally so tests never download one."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "You are a helpful assistant. Answer the user's questions concisely.",
    "KV cache aware routing sends each request to the worker holding its prefix.",
    "Hello, how are you today? I am fine, thank you for asking!",
    "def add(a, b):\n    return a + b\n",
] * 20


def train_tiny_tokenizer(directory: Path, vocab_size: int = 512) -> Path:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    path = directory / "tokenizer.json"
    tok.save(str(path))
    return path
