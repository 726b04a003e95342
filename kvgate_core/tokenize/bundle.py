"""``TokenizerBundle``: a model's tokenizer, chat template and special tokens, loaded and serialised together.

Sources: a ``tokenizer.json`` file, a Hugging Face model directory, a GGUF model file, or ``bytes`` (the
file-free ``ByteTokenizer``). ``to_json``/``from_json`` carry a bundle over a worker's ``GET /tokenizer`` so
a gateway started with ``--tokenizer auto`` tokenizes exactly as its workers do.

Both the gateway and the workers tokenize through ``encode``: chat prompts are rendered with the template and
encoded *without* the tokenizer's post-processor (the template places BOS itself, as ``apply_chat_template``
does); text completion prompts are encoded *with* it (as vLLM does); token-id prompts are used as-is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from kvgate_core.tokenize.chat_template import ChatTemplate
from kvgate_core.tokenize.gguf_tokenizer import build_bpe_tokenizer, read_gguf_tokenizer
from kvgate_core.tokenize.request_prompt import ChatPrompt, Prompt, TextPrompt
from kvgate_core.tokenize.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

BUNDLE_FORMAT: Final = "kvgate-tokenizer/1"
BYTES_SPEC: Final = "bytes"


@dataclass(frozen=True, slots=True)
class TokenizerBundle:
    """Everything needed to turn a request into the token ids an engine sees.

    Attributes:
        model: the model's name (informational; routing hashes under the served model id).
        tokenizer: the tokenizer.
        chat_template: the compiled chat template (``DEFAULT_CHAT_TEMPLATE`` when the model ships none).
    """

    model: str
    tokenizer: Tokenizer
    chat_template: ChatTemplate

    def render(self, prompt: ChatPrompt) -> str:
        """The text a chat prompt renders to. Raises ``ChatTemplateError`` (a ``ValueError``)."""
        return self.chat_template.render(
            prompt.messages,
            tools=prompt.tools,
            add_generation_prompt=prompt.add_generation_prompt,
            extra=prompt.template_kwargs,
        )

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a parsed prompt (``request_prompt.parse_prompt``), as the engine sees them."""
        if isinstance(prompt, ChatPrompt):
            return self.tokenizer.encode(self.render(prompt), add_special_tokens=False)
        if isinstance(prompt, TextPrompt):
            return self.tokenizer.encode(prompt.text, add_special_tokens=True)
        return list(prompt.token_ids)

    def to_json(self) -> bytes:
        """The bundle as JSON (what a worker serves on ``GET /tokenizer``)."""
        doc: dict[str, Any] = {
            "format": BUNDLE_FORMAT,
            "model": self.model,
            "chat_template": self.chat_template.source,
            "bos_token": self.tokenizer.bos_token,
            "eos_token": self.tokenizer.eos_token,
        }
        if isinstance(self.tokenizer, HFTokenizer):
            doc.update(kind="hf", tokenizer=self.tokenizer.to_str())
        elif isinstance(self.tokenizer, ByteTokenizer):
            doc.update(kind="bytes", special_tokens=list(self.tokenizer.special_tokens))
        else:
            raise TypeError(f"cannot serialise a {type(self.tokenizer).__name__}")
        return orjson.dumps(doc)

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> TokenizerBundle:
        """Rebuild a bundle from ``to_json`` output.

        Raises:
            ValueError: malformed document or unknown format/kind.
        """
        doc = orjson.loads(data) if isinstance(data, bytes | str) else data
        if not isinstance(doc, Mapping) or doc.get("format") != BUNDLE_FORMAT:
            raise ValueError(f"not a {BUNDLE_FORMAT} document")
        template = doc.get("chat_template")
        if template is not None and not isinstance(template, str):
            raise ValueError("'chat_template' must be a string")
        return _assemble(str(doc.get("model") or ""), _tokenizer_from_doc(doc), template)


def _tokenizer_from_doc(doc: Mapping[str, Any]) -> Tokenizer:
    kind = doc.get("kind")
    if kind == "bytes":
        return ByteTokenizer(tuple(doc.get("special_tokens") or ()))
    if kind != "hf":
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    bos, eos = doc.get("bos_token"), doc.get("eos_token")
    if not isinstance(doc.get("tokenizer"), str) or not all(
        t is None or isinstance(t, str) for t in (bos, eos)
    ):
        raise ValueError("'tokenizer', 'bos_token' and 'eos_token' must be strings")
    try:
        return HFTokenizer.from_str(doc["tokenizer"], bos_token=bos, eos_token=eos)
    except Exception as exc:  # the Rust library raises plain Exception on a bad tokenizer.json
        raise ValueError(f"not a valid tokenizer.json: {exc}") from exc


def _assemble(model: str, tokenizer: Tokenizer, template: str | None) -> TokenizerBundle:
    special = {k: v for k, v in (("bos_token", tokenizer.bos_token), ("eos_token", tokenizer.eos_token)) if v}
    return TokenizerBundle(model, tokenizer, ChatTemplate(template, special_tokens=special))


def byte_bundle(model: str = "bytes") -> TokenizerBundle:
    """The file-free ``ByteTokenizer`` with the default ChatML template."""
    return _assemble(model, ByteTokenizer(), None)


def load_bundle(spec: str | Path, *, model: str | None = None) -> TokenizerBundle:
    """Load a bundle from ``bytes``, a ``tokenizer.json``, a Hugging Face directory or a ``.gguf`` file.

    Args:
        spec: where to load from.
        model: the bundle's model name; defaults to the directory name or the GGUF ``general.name``.

    Raises:
        ValueError: the source does not exist or cannot be loaded (the message says which and why).
    """
    if str(spec) == BYTES_SPEC:
        return byte_bundle(model or BYTES_SPEC)
    path = Path(spec)
    if path.is_dir():
        return _load_hf(path / "tokenizer.json", model or path.name)
    if path.suffix == ".gguf" and path.is_file():
        return load_gguf_bundle(path, model=model)
    if path.is_file():
        return _load_hf(path, model or path.parent.name)
    raise ValueError(f"tokenizer {str(spec)!r}: no such file or directory (expected bytes, a tokenizer.json, "
                     "a Hugging Face model directory or a .gguf file)")  # fmt: skip


def load_gguf_bundle(path: str | Path, *, model: str | None = None) -> TokenizerBundle:
    """Build the tokenizer and template of a GGUF model from its metadata (see ``gguf_tokenizer``)."""
    data = read_gguf_tokenizer(path)
    tokenizer = HFTokenizer(
        build_bpe_tokenizer(data),
        bos_token=data.token(data.bos_token_id),
        eos_token=data.token(data.eos_token_id),
    )
    return _assemble(model or data.model_name, tokenizer, data.chat_template)


def _load_hf(tokenizer_json: Path, model: str) -> TokenizerBundle:
    if not tokenizer_json.is_file():
        raise ValueError(
            f"{tokenizer_json}: missing (a Hugging Face tokenizer directory needs tokenizer.json)"
        )
    config = _read_config(tokenizer_json.parent)
    try:
        tokenizer = HFTokenizer.from_file(
            tokenizer_json,
            bos_token=_token_text(config.get("bos_token")),
            eos_token=_token_text(config.get("eos_token")),
        )
    except Exception as exc:  # the Rust library raises plain Exception
        raise ValueError(f"{tokenizer_json}: not a valid tokenizer.json: {exc}") from exc
    return _assemble(model, tokenizer, _chat_template(tokenizer_json.parent, config))


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from exc
    return config if isinstance(config, dict) else {}


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(directory: Path, config: Mapping[str, Any]) -> str | None:
    """``chat_template.jinja``, then ``chat_template.json``, then ``tokenizer_config.json``'s template."""
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    json_file = directory / "chat_template.json"
    template: object = config.get("chat_template")
    if json_file.is_file():
        template = json.loads(json_file.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None
