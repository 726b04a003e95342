"""Build a Hugging Face ``tokenizers`` tokenizer from a GGUF model's ``tokenizer.ggml.*`` metadata.

Only byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``) are supported, with the
pre-tokenizers of the ``tokenizer.ggml.pre`` families listed in ``_PRE_TOKENIZERS`` (the same splits as
llama.cpp's ``llama-vocab.cpp`` and the models' own ``tokenizer.json``). Anything else fails loudly: a
silently different tokenizer would make every prefix hash wrong. The metadata is read by ``gguf_metadata``
(the ``gguf`` package's reader parses every tensor too and takes seconds).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from kvgate_core.tokenize.gguf_metadata import read_gguf_metadata

_T = TypeVar("_T")

_CONTROL: Final = 3
_USER_DEFINED: Final = 4

_LLAMA3_SPLIT: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )


def _split_then_bytes(pattern: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
    def build() -> pre_tokenizers.PreTokenizer:
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
        return pre_tokenizers.Sequence(
            [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )

    return build


_PRE_TOKENIZERS: Final[dict[str, Callable[[], pre_tokenizers.PreTokenizer]]] = {
    "default": _gpt2,
    "gpt-2": _gpt2,
    "gpt2": _gpt2,
    "smollm": _digits_then_gpt2,
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
    "llama-bpe": _split_then_bytes(_LLAMA3_SPLIT),
    "llama3": _split_then_bytes(_LLAMA3_SPLIT),
    "qwen2": _split_then_bytes(_QWEN2_SPLIT),
}
# Families whose tokenizer.json sets BPE ``ignore_merges`` (a whole word in the vocabulary wins).
_IGNORE_MERGES: Final = frozenset({"llama-bpe", "llama3"})


@dataclass(frozen=True, slots=True)
class GGUFTokenizerData:
    """What a GGUF file says about its tokenizer."""

    model_name: str
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    pre: str
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos_token: bool
    chat_template: str | None

    def token(self, token_id: int | None) -> str | None:
        if token_id is None or not 0 <= token_id < len(self.tokens):
            return None
        return self.tokens[token_id]


def read_gguf_tokenizer(path: str | Path) -> GGUFTokenizerData:
    """Read the tokenizer metadata of a GGUF file (the metadata section only, not the tensors).

    Raises:
        ValueError: not a readable GGUF file, or its tokenizer is not a byte-level BPE one.
    """
    try:
        meta = read_gguf_metadata(path)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read GGUF metadata: {exc}") from exc
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"{path}: GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2'); "
            "pass the model's tokenizer.json instead"
        )
    template = meta.get("tokenizer.chat_template")
    return GGUFTokenizerData(
        model_name=str(meta.get("general.name", Path(path).stem)),
        tokens=_typed_tuple(meta.get("tokenizer.ggml.tokens"), str),
        token_types=_typed_tuple(meta.get("tokenizer.ggml.token_type", []), int),
        merges=_typed_tuple(meta.get("tokenizer.ggml.merges", []), str),
        pre=str(meta.get("tokenizer.ggml.pre", "default")),
        bos_token_id=_opt_int(meta.get("tokenizer.ggml.bos_token_id")),
        eos_token_id=_opt_int(meta.get("tokenizer.ggml.eos_token_id")),
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        chat_template=template if isinstance(template, str) else None,
    )


def _typed_tuple(value: object, kind: type[_T]) -> tuple[_T, ...]:
    if not isinstance(value, list) or not all(isinstance(v, kind) for v in value):
        raise ValueError(f"GGUF tokenizer metadata: expected an array of {kind.__name__}")
    return tuple(value)


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) else None


def build_bpe_tokenizer(data: GGUFTokenizerData) -> Tokenizer:
    """A ``tokenizers`` byte-level BPE tokenizer equivalent to the GGUF vocabulary.

    Raises:
        ValueError: the ``tokenizer.ggml.pre`` family is unknown.
    """
    pre = _PRE_TOKENIZERS.get(data.pre)
    if pre is None:
        known = ", ".join(sorted(_PRE_TOKENIZERS))
        raise ValueError(f"GGUF pre-tokenizer {data.pre!r} is not supported (known: {known})")
    vocab = {token: i for i, token in enumerate(data.tokens)}
    merges = [_split_merge(m) for m in data.merges]
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=data.pre in _IGNORE_MERGES))
    tok.pre_tokenizer = pre()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(_added(data, _CONTROL, special=True))
    tok.add_tokens(_added(data, _USER_DEFINED, special=False))
    bos = data.token(data.bos_token_id)
    if data.add_bos_token and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, data.bos_token_id)]
        )
    return tok


def _split_merge(merge: str) -> tuple[str, str]:
    left, sep, right = merge.partition(" ")
    if not sep:
        raise ValueError(f"malformed GGUF merge {merge!r}")
    return left, right


def _added(data: GGUFTokenizerData, token_type: int, *, special: bool) -> list[AddedToken]:
    return [
        AddedToken(token, special=special, normalized=False)
        for token, kind in zip(data.tokens, data.token_types, strict=False)
        if kind == token_type
    ]
