"""Deterministic output for the simulated worker: words drawn by hashing under a key of the prompt and seed.

Each word is pre-encoded once with the served tokenizer, with the text each of its tokens adds, so emitting
a token costs no tokenizer call. The same prompt and seed always give the same text and the
same natural length (where the "model" would emit EOS).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import xxhash

_TEXT: Final = (
    "the cache routes every request to a worker that already holds its prefix so the prompt is not "
    "computed again and tokens stream back quickly while blocks move between tiers when memory runs low "
    "a gateway reads events from each worker and keeps an index of hashes per block with load and queue "
    "depth for policies that balance hits against waiting time"
)
#: the distinct words the sim's output is drawn from
WORDS: Final = tuple(dict.fromkeys(_TEXT.split()))


@dataclass(frozen=True, slots=True)
class WordPiece:
    """A word's token ids and the text each token adds (decoded prefix differences)."""

    token_ids: tuple[int, ...]
    texts: tuple[str, ...]


def _piece(text: str, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str]) -> WordPiece:
    ids = encode(text)
    prefixes = [decode(ids[: k + 1]) for k in range(len(ids))]
    texts = [b[len(a) :] if b.startswith(a) else b for a, b in zip(["", *prefixes], prefixes, strict=False)]
    return WordPiece(tuple(ids), tuple(texts))


class WordBook:
    """The sim's vocabulary of words, each with its token ids under the served tokenizer.

    Args:
        encode: the served tokenizer's ``encode``.
        decode: the served tokenizer's ``decode``.
    """

    __slots__ = ("pieces",)

    def __init__(self, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str]) -> None:
        pieces = [_piece(" " + w, encode, decode) for w in WORDS]
        self.pieces: tuple[WordPiece, ...] = tuple(p for p in pieces if p.token_ids)
        if not self.pieces:
            raise ValueError("the tokenizer encodes none of the sim's words")


class TextStream:
    """Tokens of one sequence's deterministic output, one at a time.

    Args:
        book: the word vocabulary.
        prompt_bytes: the prompt's token ids as bytes (they key the draw).
        seed: the request's seed, or None.
        min_length: least natural output length in tokens.
        max_length: most natural output length in tokens.
    """

    __slots__ = ("_book", "_key", "_num_words", "_piece", "_pos", "natural_length")

    def __init__(
        self,
        book: WordBook,
        prompt_bytes: bytes,
        seed: int | None,
        min_length: int = 16,
        max_length: int = 256,
    ) -> None:
        # Words are drawn by hashing a counter under a key of the prompt and seed: cheaper to start than a
        # seeded ``random.Random`` (tens of microseconds per request) and just as deterministic.
        self._key = xxhash.xxh3_64_intdigest(prompt_bytes, seed or 0)
        self._book = book
        self._num_words = 0
        self._piece = book.pieces[0]
        self._pos = len(self._piece.token_ids)
        self.natural_length = min_length + self._key % (max_length - min_length + 1)

    def next_token(self) -> tuple[int, str]:
        """The next token id and the text it adds."""
        if self._pos >= len(self._piece.token_ids):
            pieces = self._book.pieces
            self._num_words += 1
            self._piece = pieces[
                xxhash.xxh3_64_intdigest(self._num_words.to_bytes(8, "little"), self._key) % len(pieces)
            ]
            self._pos = 0
        piece = self._piece
        pos = self._pos
        self._pos = pos + 1
        return piece.token_ids[pos], piece.texts[pos]
