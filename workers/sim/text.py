"""Deterministic output for the simulated worker: words drawn from an RNG keyed by the prompt and seed.

Each word is pre-encoded once with the served tokenizer, so emitting a token costs no tokenizer call: the
word's text is released with its last token. The same prompt and seed always give the same text and the
same natural length (where the "model" would emit EOS).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import xxhash

from gateway.kvcontract.hashing import as_token_array

_WORDS: Final = (
    "the cache routes every request to a worker that already holds its prefix so the prompt is not "
    "computed again and tokens stream back quickly while blocks move between tiers when memory runs low "
    "a gateway reads events from each worker and keeps an index of hashes per block with load and queue "
    "depth for policies that balance hits against waiting time"
)


@dataclass(frozen=True, slots=True)
class WordPiece:
    token_ids: tuple[int, ...]
    text: str


class WordBook:
    """The sim's vocabulary of words, each with its token ids under the served tokenizer.

    Args:
        encode: the served tokenizer's ``encode``.
    """

    __slots__ = ("pieces",)

    def __init__(self, encode: Callable[[str], list[int]]) -> None:
        pieces = [WordPiece(tuple(encode(" " + w)), " " + w) for w in _WORDS.split()]
        self.pieces: tuple[WordPiece, ...] = tuple(p for p in pieces if p.token_ids)
        if not self.pieces:
            raise ValueError("the tokenizer encodes none of the sim's words")


class TextStream:
    """Tokens of one sequence's deterministic output, one at a time.

    Args:
        book: the word vocabulary.
        prompt_token_ids: the prompt (keys the RNG).
        seed: the request's seed, or None.
        min_length: least natural output length in tokens.
        max_length: most natural output length in tokens.
    """

    __slots__ = ("_book", "_piece", "_pos", "_rng", "natural_length")

    def __init__(
        self,
        book: WordBook,
        prompt_token_ids: Sequence[int],
        seed: int | None,
        min_length: int = 16,
        max_length: int = 256,
    ) -> None:
        key = xxhash.xxh3_64_intdigest(as_token_array(prompt_token_ids).tobytes(), seed or 0)
        self._rng = random.Random(key)
        self._book = book
        self._piece = book.pieces[0]
        self._pos = len(self._piece.token_ids)
        self.natural_length = self._rng.randrange(min_length, max_length + 1)

    def next_token(self) -> tuple[int, str]:
        """The next token id and the text it completes ("" inside a multi-token word)."""
        if self._pos >= len(self._piece.token_ids):
            self._piece = self._rng.choice(self._book.pieces)
            self._pos = 0
        piece = self._piece
        token = piece.token_ids[self._pos]
        self._pos += 1
        return token, piece.text if self._pos == len(piece.token_ids) else ""
