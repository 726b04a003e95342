"""Tokenizers: the ``Tokenizer`` protocol, the Rust ``tokenizers``-backed one and a file-free byte tokenizer.

Chat-template rendering lives in ``chat_template``; loading a tokenizer with its template and special tokens
from a file, a directory or a GGUF model lives in ``bundle``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final, Protocol

import numpy as np
from tokenizers import Tokenizer as RustTokenizer


class Tokenizer(Protocol):
    """Text ↔ token ids for one model.

    Implementations are thread safe and hold no per-request state. Special-token strings that appear in the
    text (``<|im_start|>``…) encode to their single special id, as Hugging Face tokenizers do, so a rendered
    chat template tokenizes the way the engine sees it.
    """

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def bos_token(self) -> str | None: ...

    @property
    def eos_token(self) -> str | None: ...

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the tokenizer's post-processor (e.g. BOS)."""
        ...

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        """``encode`` for several texts (may run in parallel inside the library)."""
        ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; bytes of an incomplete UTF-8 character decode to U+FFFD."""
        ...

    def token_to_id(self, token: str) -> int | None:
        """Id of a token string (special tokens included), or None when it is not in the vocabulary."""
        ...


class HFTokenizer:
    """A Hugging Face ``tokenizers`` (Rust) tokenizer.

    Args:
        tokenizer: the loaded Rust tokenizer.
        bos_token: BOS string (from ``tokenizer_config.json`` or GGUF metadata), if the model has one.
        eos_token: EOS string, if the model has one.
    """

    __slots__ = ("_batch", "_bos", "_eos", "_eos_id", "_tok")

    def __init__(
        self, tokenizer: RustTokenizer, *, bos_token: str | None = None, eos_token: str | None = None
    ):
        self._tok = tokenizer
        # ``encode_batch_fast`` (tokenizers >= 0.20.2) skips the character offsets nothing here reads: the
        # same ids for ~18% less CPU, even for one text (SmolLM2, ~480-token texts: 403 vs 495 µs)
        self._batch = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
        self._bos = bos_token
        self._eos = eos_token
        self._eos_id = tokenizer.token_to_id(eos_token) if eos_token else None

    @classmethod
    def from_file(cls, path: str | Path, **tokens: str | None) -> HFTokenizer:
        """Load a ``tokenizer.json``. Keyword arguments: ``bos_token``, ``eos_token``."""
        return cls(RustTokenizer.from_file(str(path)), **tokens)

    @classmethod
    def from_str(cls, json_text: str, **tokens: str | None) -> HFTokenizer:
        """Load a ``tokenizer.json`` held in a string. Keyword arguments: ``bos_token``, ``eos_token``."""
        return cls(RustTokenizer.from_str(json_text), **tokens)

    @property
    def rust(self) -> RustTokenizer:
        """The wrapped Rust tokenizer."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def eos_token_id(self) -> int | None:
        return self._eos_id

    @property
    def bos_token(self) -> str | None:
        return self._bos

    @property
    def eos_token(self) -> str | None:
        return self._eos

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._batch([text], add_special_tokens=add_special_tokens)[0].ids)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        encodings = self._batch(list(texts), add_special_tokens=add_special_tokens)
        return [list(e.ids) for e in encodings]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        found = self._tok.token_to_id(token)
        return None if found is None else int(found)

    def to_str(self) -> str:
        """The tokenizer as ``tokenizer.json`` text."""
        return str(self._tok.to_str())


BYTE_SPECIAL_TOKENS: Final[tuple[str, ...]] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, then a few special tokens (ChatML's) from id 256; needs no files.

    ``<|endoftext|>`` (256) is EOS; there is no BOS. This is the simulated worker's default tokenizer.
    """

    __slots__ = ("_by_id", "_by_text", "_split")

    def __init__(self, special_tokens: Sequence[str] = BYTE_SPECIAL_TOKENS) -> None:
        if not special_tokens:
            raise ValueError("ByteTokenizer needs at least one special token (its EOS)")
        self._by_text: Mapping[str, int] = {tok: 256 + i for i, tok in enumerate(special_tokens)}
        self._by_id: Mapping[int, str] = {i: tok for tok, i in self._by_text.items()}
        # Longest first, so a special token that prefixes another never shadows it.
        alternatives = sorted(special_tokens, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(t) for t in alternatives) + ")")

    @property
    def special_tokens(self) -> tuple[str, ...]:
        return tuple(self._by_text)

    @property
    def vocab_size(self) -> int:
        return 256 + len(self._by_text)

    @property
    def eos_token_id(self) -> int | None:
        return 256

    @property
    def bos_token(self) -> str | None:
        return None

    @property
    def eos_token(self) -> str | None:
        return self._by_id[256]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.encode_ids(text).tolist()  # type: ignore[no-any-return]  # a list of ints

    def encode_ids(self, text: str) -> np.ndarray:
        """``encode`` as a uint32 array, built by numpy from the text's UTF-8 bytes.

        The gateway's byte analysis encodes every new chat turn (kilobytes): a Python int per byte was ~20 ns,
        and this is ~1.7 ns (3.3 KB: 66 vs 5.6 µs).
        """
        parts = self._split.split(text)
        if len(parts) == 1:
            return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.uint32)
        raw = [segment.encode("utf-8") for segment in parts[0::2]]
        tokens = parts[1::2]
        ids = np.empty(sum(map(len, raw)) + len(tokens), np.uint32)
        at = 0
        for segment, token in zip(raw, tokens, strict=False):  # one more segment than tokens
            end = at + len(segment)
            ids[at:end] = np.frombuffer(segment, np.uint8)
            ids[end] = self._by_text[token]
            at = end + 1
        ids[at:] = np.frombuffer(raw[-1], np.uint8)
        return ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        return [self.encode(t, add_special_tokens) for t in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        parts: list[str] = []
        run = bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            special = self._by_id.get(i)
            if special is None:
                raise ValueError(f"token id {i} is outside the byte tokenizer's vocabulary")
            parts.append(run.decode("utf-8", errors="replace"))
            run.clear()
            if not skip_special_tokens:
                parts.append(special)
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)

    def token_to_id(self, token: str) -> int | None:
        special = self._by_text.get(token)
        if special is not None:
            return special
        raw = token.encode("utf-8")
        return raw[0] if len(raw) == 1 else None
