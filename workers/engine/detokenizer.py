"""Incremental detokenization with stop strings.

Decoding only the newest tokens (with a few tokens of left context) keeps the cost per token constant;
text is withheld while the bytes of a character are incomplete (U+FFFD) and, when stop strings are set,
while the tail could still be the start of one, so a stop string is never streamed before it is cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

_CONTEXT_TOKENS: Final = 6
_INCOMPLETE: Final = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


class IncrementalDetokenizer:
    """Turns a request's generated ids into streamed text deltas, cutting at the first stop string.

    Args:
        decoder: the model's tokenizer.
        prompt_ids: the prompt (its last few ids give the first output tokens their context).
        stop: stop strings; the text ends before the earliest one found.
    """

    __slots__ = ("_decoder", "_hold", "_ids", "_prefix_offset", "_read_offset", "_sent", "_stop", "text")

    def __init__(self, decoder: Decoder, prompt_ids: Sequence[int], stop: Sequence[str] = ()) -> None:
        self._decoder = decoder
        self._ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._sent = 0
        self.text = ""

    def add(self, token_id: int) -> bool:
        """Append a generated id; True when the text now contains a stop string (the text is cut there)."""
        self._ids.append(token_id)
        decode = self._decoder.decode
        prefix = decode(self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=True)
        full = decode(self._ids[self._prefix_offset :], skip_special_tokens=True)
        if len(full) <= len(prefix) or full.endswith(_INCOMPLETE):
            return False
        search_from = max(0, len(self.text) - self._hold)
        self.text += full[len(prefix) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return self._cut_at_stop(search_from)

    def take(self, final: bool) -> str:
        """Text not yet returned; unless ``final``, the tail that may begin a stop string is kept back."""
        end = len(self.text) if final else max(self._sent, len(self.text) - self._hold)
        delta = self.text[self._sent : end]
        self._sent = end
        return delta

    def _cut_at_stop(self, search_from: int) -> bool:
        found = [i for i in (self.text.find(s, search_from) for s in self._stop) if i >= 0]
        if not found:
            return False
        self.text = self.text[: min(found)]
        return True
