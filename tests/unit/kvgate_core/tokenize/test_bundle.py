from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle, load_bundle
from kvgate_core.tokenize.chat_template import DEFAULT_CHAT_TEMPLATE
from kvgate_core.tokenize.request_prompt import ChatPrompt, TextPrompt, TokenPrompt
from kvgate_core.tokenize.tokenizer import ByteTokenizer, HFTokenizer

CHAT = ChatPrompt(
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, how are you?"}]
)
TEMPLATE = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}"


def _hf_dir(tmp_path: Path, tokenizer_json: Path, config: Mapping[str, object]) -> Path:
    directory = tmp_path / "my-model"
    directory.mkdir()
    shutil.copy(tokenizer_json, directory / "tokenizer.json")
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_tokenizer_json_alone_gets_the_default_template(tiny: TokenizerBundle) -> None:
    assert isinstance(tiny.tokenizer, HFTokenizer)
    assert tiny.chat_template.source == DEFAULT_CHAT_TEMPLATE
    assert tiny.tokenizer.decode(tiny.encode(CHAT)) == tiny.render(CHAT)


def test_hf_directory_with_template_and_special_tokens(tmp_path: Path, tiny_tokenizer_path: Path) -> None:
    config = {
        "chat_template": TEMPLATE,
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|endoftext|>"},
    }
    bundle = load_bundle(_hf_dir(tmp_path, tiny_tokenizer_path, config))
    assert bundle.model == "my-model"
    assert bundle.tokenizer.eos_token_id == bundle.tokenizer.token_to_id("<|endoftext|>")
    assert (
        bundle.render(CHAT)
        == "<|im_start|>[system]Be brief.<|endoftext|>[user]Hello, how are you?<|endoftext|>"
    )


def test_hf_directory_named_templates_and_jinja_file(tmp_path: Path, tiny_tokenizer_path: Path) -> None:
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    directory = _hf_dir(tmp_path, tiny_tokenizer_path, {"chat_template": named})
    assert load_bundle(directory).render(CHAT) == "D"
    (directory / "chat_template.jinja").write_text("J")
    assert load_bundle(directory, model="m").render(CHAT) == "J"


def test_bytes_spec() -> None:
    bundle = load_bundle("bytes")
    assert isinstance(bundle.tokenizer, ByteTokenizer)
    assert bundle.encode(TextPrompt("ab")) == [97, 98]


@pytest.mark.parametrize("make", ["tiny", "bytes"])
def test_json_round_trip_tokenizes_identically(make: str, tiny: TokenizerBundle) -> None:
    bundle = tiny if make == "tiny" else byte_bundle("sim")
    copy = TokenizerBundle.from_json(bundle.to_json())
    assert copy.model == bundle.model
    assert copy.chat_template.source == bundle.chat_template.source
    assert (copy.tokenizer.bos_token, copy.tokenizer.eos_token) == (
        bundle.tokenizer.bos_token,
        bundle.tokenizer.eos_token,
    )
    for prompt in (CHAT, TextPrompt("The quick brown fox, 123!")):
        assert copy.encode(prompt) == bundle.encode(prompt)


def test_smollm2_json_round_trip(smollm2: TokenizerBundle) -> None:
    copy = TokenizerBundle.from_json(smollm2.to_json())
    assert copy.encode(CHAT) == smollm2.encode(CHAT)


def test_token_prompts_are_used_as_is(tiny: TokenizerBundle) -> None:
    assert tiny.encode(TokenPrompt((5, 6, 7))) == [5, 6, 7]


@pytest.mark.parametrize(
    "doc",
    [
        b"{}",
        b'{"format": "kvgate-tokenizer/1", "kind": "sentencepiece"}',
        b"[1]",
        b"{not json",
        b'{"format": "kvgate-tokenizer/1", "kind": "hf"}',
        b'{"format": "kvgate-tokenizer/1", "kind": "hf", "tokenizer": "{}"}',
        b'{"format": "kvgate-tokenizer/1", "kind": "bytes", "chat_template": 3}',
        b'{"format": "kvgate-tokenizer/1", "kind": "bytes", "special_tokens": []}',
    ],
    ids=[
        "no-format",
        "bad-kind",
        "not-object",
        "not-json",
        "no-tokenizer",
        "bad-tokenizer",
        "template",
        "no-eos",
    ],
)
def test_from_json_rejects_bad_documents(doc: bytes) -> None:
    with pytest.raises(ValueError):
        TokenizerBundle.from_json(doc)


def test_missing_paths_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        load_bundle(tmp_path / "nope.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"tokenizer\.json"):
        load_bundle(tmp_path / "empty")
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"not a valid tokenizer\.json"):
        load_bundle(tmp_path / "garbage.json")
