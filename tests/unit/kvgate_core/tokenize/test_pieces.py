"""The piece cache never changes a result: ``PieceEncoder.encode`` == the tokenizer's own ``encode``, on texts
built to break space cuts (runs of spaces, whitespace before a space, Unicode spaces, special tokens, digits),
for every pre-tokenizer it accepts; the tokenizers where a space cut is not provably exact get no encoder."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, normalizers, pre_tokenizers

from kvgate_core.tokenize.bundle import TokenizerBundle
from kvgate_core.tokenize.gguf_tokenizer import GGUFTokenizerData, build_bpe_tokenizer
from kvgate_core.tokenize.pieces import PieceEncoder
from kvgate_core.tokenize.tokenizer import ByteTokenizer, HFTokenizer

UNICODE = ["the", " quick", "  ", " ", "\n", "\n\n", "\t", "brown", "fox", "123", "4", "héllo", "日本", "🎉", ".",
           "!", "'s", " 's", "\u00a0", "\u2028", "\u3000", "\u200b", "\x1c", "\r\n", "<|im_end|>", "<|im_start|>",
           "<|im_", "|>", "<", " <|endoftext|> ", "x", "  \n", " 1 2", " b", "?!", "—", "e\u0301", "\u0301"]  # fmt: skip
ASCII = [p for p in UNICODE if p.isascii()]


def _texts(pieces: list[str], seed: int, count: int, max_pieces: int = 40) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, max_pieces))) for _ in range(count)]


def _assert_exact(tokenizer: HFTokenizer, texts: list[str], max_pieces: int) -> PieceEncoder:
    encoder = PieceEncoder.for_tokenizer(tokenizer, max_pieces)
    assert encoder is not None
    for text in texts * 2:  # the second pass reads what the first one cached
        assert encoder.encode(text).tolist() == tokenizer.encode(text), repr(text)
    return encoder


@pytest.mark.parametrize("pieces", [UNICODE, ASCII], ids=["unicode", "ascii"])
def test_smollm2_pieces_equal_full_encoding(smollm2: TokenizerBundle, pieces: list[str]) -> None:
    assert isinstance(smollm2.tokenizer, HFTokenizer)
    encoder = _assert_exact(smollm2.tokenizer, _texts(pieces, 0, 1500), max_pieces=1 << 16)
    assert len(encoder) > 100
    # a small cache is emptied again and again and stays exact
    small = _assert_exact(smollm2.tokenizer, _texts(pieces, 1, 800), max_pieces=40)
    assert len(small) <= 40


def _family(tiny_tokenizer_path: Path, pre: str) -> HFTokenizer:
    """The tiny tokenizer's vocabulary behind a GGUF family's pre-tokenizer (``gguf_tokenizer``)."""
    doc = json.loads(tiny_tokenizer_path.read_text())
    vocab: dict[str, int] = doc["model"]["vocab"]
    specials = {t["content"] for t in doc["added_tokens"]}
    tokens = tuple(sorted(vocab, key=vocab.__getitem__))
    data = GGUFTokenizerData(
        model_name="tiny",
        tokens=tokens,
        token_types=tuple(3 if t in specials else 1 for t in tokens),
        merges=tuple(m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]),
        pre=pre,
        bos_token_id=None,
        eos_token_id=vocab["<|endoftext|>"],
        add_bos_token=False,
        chat_template=None,
    )
    return HFTokenizer(build_bpe_tokenizer(data))


@pytest.mark.parametrize("pre", ["gpt2", "smollm", "llama-bpe", "qwen2"])
def test_every_accepted_pre_tokenizer_is_exact(tiny_tokenizer_path: Path, pre: str) -> None:
    _assert_exact(_family(tiny_tokenizer_path, pre), _texts(UNICODE, 2, 800), max_pieces=64)


def _altered(tiny_tokenizer_path: Path, change: Callable[[Tokenizer], None]) -> HFTokenizer:
    tokenizer = Tokenizer.from_file(str(tiny_tokenizer_path))
    change(tokenizer)
    return HFTokenizer(tokenizer)


@pytest.mark.parametrize(
    "change",
    [
        lambda t: setattr(t, "normalizer", normalizers.NFC()),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Metaspace()),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=True)),
        lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.WhitespaceSplit()),
        lambda t: t.add_special_tokens([AddedToken("<eot>", special=True, rstrip=True)]),
        lambda t: t.add_tokens([AddedToken("new line", special=False)]),
        lambda t: t.enable_truncation(64),
    ],
    ids=[
        "normalizer",
        "metaspace",
        "prefix-space",
        "whitespace-split",
        "rstrip",
        "spaced-token",
        "truncation",
    ],
)
def test_no_encoder_where_a_space_cut_is_not_provably_exact(
    tiny_tokenizer_path: Path, change: Callable[[Tokenizer], None]
) -> None:
    assert PieceEncoder.for_tokenizer(_altered(tiny_tokenizer_path, change)) is None


def test_no_encoder_for_the_byte_tokenizer_or_a_zero_budget(tiny_tokenizer_path: Path) -> None:
    assert PieceEncoder.for_tokenizer(ByteTokenizer()) is None
    assert PieceEncoder.for_tokenizer(HFTokenizer.from_file(tiny_tokenizer_path), max_pieces=0) is None


def test_a_text_of_known_pieces_costs_no_tokenizer_call(smollm2: TokenizerBundle) -> None:
    assert isinstance(smollm2.tokenizer, HFTokenizer)
    encoder = PieceEncoder.for_tokenizer(smollm2.tokenizer)
    assert encoder is not None
    calls = []
    encode = smollm2.tokenizer.rust.encode

    def counted(text: str, add_special_tokens: bool) -> object:
        calls.append(text)
        return encode(text, add_special_tokens=add_special_tokens)

    encoder._encode_offsets = counted  # type: ignore[assignment]
    first = "<|im_start|>user\nthe quick brown fox, the lazy dog<|im_end|>"
    again = "<|im_start|>user\nthe lazy fox, the quick brown dog<|im_end|>"
    encoder.encode(first)
    assert len(calls) == 1
    assert encoder.encode(again).tolist() == smollm2.tokenizer.encode(again)
    assert len(calls) == 1
