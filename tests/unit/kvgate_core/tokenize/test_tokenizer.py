from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

from kvgate_core.tokenize.tokenizer import ByteTokenizer, HFTokenizer


def test_byte_tokenizer_encodes_utf8_bytes_and_special_tokens() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("<|im_start|>hé<|im_end|>")
    assert ids == [257, ord("h"), 0xC3, 0xA9, 258]
    assert tok.decode(ids) == "<|im_start|>hé<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "hé"


def _bytes_one_by_one(tok: ByteTokenizer, text: str) -> list[int]:
    """The byte tokenizer's definition, a Python int per byte (what ``encode_ids`` computes with numpy)."""
    out: list[int] = []
    for i, piece in enumerate(re.split("(<\\|im_start\\|>|<\\|im_end\\|>|<\\|endoftext\\|>)", text)):
        if i % 2:
            out.append(tok.token_to_id(piece) or -1)
        else:
            out.extend(piece.encode("utf-8"))
    return out


def test_byte_tokenizer_ids_equal_a_byte_by_byte_encode() -> None:
    tok = ByteTokenizer()
    rng = random.Random(7)
    alphabet = ["a", " ", "\n", "é", "中", "🙂", "<", "|", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    texts = ["", "plain", "<|im_end|>", "<|im_start|><|im_end|>", "<|im_start|>user\nhi<|im_end|>\n"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40))) for _ in range(500)]
    for text in texts:
        ids = tok.encode_ids(text)
        assert ids.dtype == np.uint32
        assert ids.tolist() == tok.encode(text) == _bytes_one_by_one(tok, text), text
        assert all(type(i) is int for i in tok.encode(text))


def test_byte_tokenizer_vocabulary() -> None:
    tok = ByteTokenizer()
    assert tok.vocab_size == 259
    assert tok.eos_token == "<|endoftext|>"
    assert tok.eos_token_id == 256
    assert tok.bos_token is None
    assert tok.token_to_id("<|im_end|>") == 258
    assert tok.token_to_id("a") == 97
    assert tok.token_to_id("é") is None  # two bytes: not one token


def test_byte_tokenizer_decodes_partial_utf8_as_replacement() -> None:
    assert ByteTokenizer().decode([0xC3]) == "\ufffd"


def test_byte_tokenizer_rejects_unknown_ids() -> None:
    with pytest.raises(ValueError, match="outside"):
        ByteTokenizer().decode([999])


def test_byte_tokenizer_prefers_the_longest_special_token() -> None:
    tok = ByteTokenizer(("<a>", "<a><b>"))
    assert tok.encode("<a><b><a>") == [257, 256]


def test_byte_tokenizer_batch_equals_single() -> None:
    tok = ByteTokenizer()
    texts = ["a", "", "<|endoftext|>x"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_hf_tokenizer_round_trip(tiny_tokenizer_path: Path) -> None:
    tok = HFTokenizer.from_file(tiny_tokenizer_path, eos_token="<|endoftext|>")
    text = "The quick brown fox jumps over the lazy dog."
    ids = tok.encode(text)
    assert len(ids) < len(text)  # merges learned from the corpus apply
    assert tok.decode(ids) == text
    assert tok.encode_batch([text, "Hello"]) == [ids, tok.encode("Hello")]
    assert tok.eos_token_id == tok.token_to_id("<|endoftext|>")
    assert tok.vocab_size == tok.rust.get_vocab_size(with_added_tokens=True) > 259


def test_hf_tokenizer_encodes_special_tokens_in_text_as_single_ids(tiny_tokenizer_path: Path) -> None:
    tok = HFTokenizer.from_file(tiny_tokenizer_path)
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    ids = tok.encode("<|im_start|>Hello<|im_end|>")
    assert ids[0] == start
    assert ids[-1] == end
    assert tok.decode(ids, skip_special_tokens=True) == "Hello"


def test_hf_tokenizer_survives_json_round_trip(tiny_tokenizer_path: Path) -> None:
    tok = HFTokenizer.from_file(tiny_tokenizer_path)
    copy = HFTokenizer.from_str(tok.to_str())
    text = "def add(a, b):\n    return a + b\n"
    assert copy.encode(text) == tok.encode(text)
    assert copy.token_to_id("missing-token") is None


@pytest.mark.parametrize("special", [False, True])
def test_hf_tokenizer_ids_equal_the_libraries_full_encode(tiny_tokenizer_path: Path, special: bool) -> None:
    # ``encode`` takes the library's offset-free batch path; the ids must be the full ``encode``'s
    tok = HFTokenizer.from_file(tiny_tokenizer_path)
    texts = [
        "<|im_start|>user\nThe quick brown fox<|im_end|>\n<|im_start|>assistant\n",
        "  leading spaces, tabs\tand\nnewlines\n\n",
        "unicode: naïve café, 日本語, emoji 🙂",
        "",
    ]
    for text in texts:
        assert (
            tok.encode(text, add_special_tokens=special)
            == tok.rust.encode(text, add_special_tokens=special).ids
        )
    assert tok.encode_batch(texts, add_special_tokens=special) == [
        tok.rust.encode(t, add_special_tokens=special).ids for t in texts
    ]


def test_hf_tokenizer_without_the_fast_batch_path_falls_back(tiny_tokenizer_path: Path) -> None:
    rust = HFTokenizer.from_file(tiny_tokenizer_path).rust

    class Older:  # a tokenizers release without encode_batch_fast
        encode_batch = rust.encode_batch
        token_to_id = rust.token_to_id

    tok = HFTokenizer(Older())  # type: ignore[arg-type]
    assert tok.encode("Hello world") == rust.encode("Hello world", add_special_tokens=False).ids
