"""The ``--foreign`` sim's tokenizer and template: an engine whose tokens a kvgate gateway cannot reproduce.

A foreign simulated worker looks like a generic OpenAI-compatible engine: it publishes no KV events and
serves no tokenizer, and it counts its prompt in its own units. Here each whitespace-separated word is one
token, its id a stable hash of the word (the same in every process, so two workers tokenize a text alike),
and chat messages render as ``role: content`` lines ending with ``assistant:``. The scheduler, block pool and
timing are the ordinary sim's; only the tokenizer differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import xxhash

from kvgate_core.tokenize.bundle import TokenizerBundle
from kvgate_core.tokenize.chat_template import ChatTemplate
from workers.sim.text import WORDS

#: ``owned_by`` of the foreign sim's model card: no engine signature, so a gateway sees a generic server
FOREIGN_OWNED_BY: Final = "foreign-sim"

#: word ids are hashes modulo this (they fit the sim's uint32 token arrays)
WORD_VOCAB_SIZE: Final = 2**31 - 1

FOREIGN_CHAT_TEMPLATE: Final = (
    "{%- for message in messages %}"
    "{{- message['role'] + ': ' + (message['content'] or '') + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'assistant:' }}{%- endif %}"
)
"""One ``role: content`` line per message, then ``assistant:``: a prompt of ``1 + words(content)`` tokens per
message, plus one."""


def word_id(word: str) -> int:
    """The token id of one word (deterministic across processes)."""
    return int(xxhash.xxh3_64_intdigest(word.encode("utf-8")) % WORD_VOCAB_SIZE)


class WordTokenizer:
    """Whitespace words as tokens; implements ``kvgate_core.tokenize.tokenizer.Tokenizer``.

    Decoding knows only the words it was built with (the sim's output vocabulary); any other id decodes to
    ``<unk>``. Each token decodes to its word after one space, as a BPE word token carries its leading
    space, so a stream of output tokens reads as words. There is no BOS or EOS.

    Args:
        known_words: the words ``decode`` can spell.
    """

    __slots__ = ("_by_id",)

    def __init__(self, known_words: Iterable[str] = WORDS) -> None:
        self._by_id = {word_id(w): w for w in known_words}

    @property
    def vocab_size(self) -> int:
        return WORD_VOCAB_SIZE

    @property
    def eos_token_id(self) -> int | None:
        return None

    @property
    def bos_token(self) -> str | None:
        return None

    @property
    def eos_token(self) -> str | None:
        return None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [word_id(w) for w in text.split()]

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        by_id = self._by_id
        return "".join(" " + by_id.get(i, "<unk>") for i in ids)

    def token_to_id(self, token: str) -> int | None:
        return word_id(token) if token and token.split() == [token] else None


def foreign_bundle(model: str) -> TokenizerBundle:
    """The foreign sim's tokenizer with its ``role: content`` template."""
    return TokenizerBundle(model, WordTokenizer(), ChatTemplate(FOREIGN_CHAT_TEMPLATE))
