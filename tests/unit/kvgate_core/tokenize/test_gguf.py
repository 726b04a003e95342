"""GGUF metadata reading and the BPE tokenizer built from it: against a GGUF written here from the locally
trained tokenizer, and against the real SmolLM2 GGUF (ids checked once against ``transformers``' own GGUF
tokenizer conversion)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from kvgate_core.tokenize.bundle import TokenizerBundle, load_bundle
from kvgate_core.tokenize.gguf_metadata import read_gguf_metadata
from kvgate_core.tokenize.gguf_tokenizer import read_gguf_tokenizer
from kvgate_core.tokenize.request_prompt import ChatPrompt, TextPrompt

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Hello,   how are you today? 12345 héllo",
    "<|im_start|>user\nHi<|im_end|>\n",
]


def _write_gguf(path: Path, tokenizer_json: Path, *, model: str = "gpt2", pre: str = "gpt-2") -> Path:
    doc = json.loads(tokenizer_json.read_text())
    vocab: dict[str, int] = doc["model"]["vocab"]
    specials = {t["content"] for t in doc["added_tokens"] if t["special"]}
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name("tiny-gguf")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab["<|im_start|>"])
    writer.add_eos_token_id(vocab["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_metadata_reader_matches_the_gguf_package(tmp_path: Path, tiny_tokenizer_path: Path) -> None:
    path = _write_gguf(tmp_path / "t.gguf", tiny_tokenizer_path)
    ours = read_gguf_metadata(path)
    theirs = {
        k: f.contents() for k, f in gguf.GGUFReader(str(path)).fields.items() if not k.startswith("GGUF.")
    }
    assert ours == theirs


def test_gguf_built_tokenizer_equals_the_original(
    tmp_path: Path, tiny: TokenizerBundle, tiny_tokenizer_path: Path
) -> None:
    bundle = load_bundle(_write_gguf(tmp_path / "t.gguf", tiny_tokenizer_path))
    assert bundle.model == "tiny-gguf"
    assert bundle.tokenizer.bos_token == "<|im_start|>"
    assert bundle.tokenizer.eos_token == "<|endoftext|>"
    for text in TEXTS:
        assert bundle.tokenizer.encode(text) == tiny.tokenizer.encode(text), text
    assert bundle.render(ChatPrompt([{"role": "user", "content": "x"}])) == "<|im_start|>x<|im_end|>"


@pytest.mark.parametrize(
    ("data", "message"),
    [(b"NOPE" + bytes(20), "bad magic"), (b"GGUF\x03\x00\x00\x00" + bytes(4), "truncated")],
    ids=["magic", "truncated"],
)
def test_bad_files_are_rejected(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=message):
        read_gguf_tokenizer(path)


@pytest.mark.parametrize(("model", "pre"), [("llama", "default"), ("gpt2", "mystery")], ids=["spm", "pre"])
def test_unsupported_tokenizers_fail_loudly(
    tmp_path: Path, tiny_tokenizer_path: Path, model: str, pre: str
) -> None:
    path = _write_gguf(tmp_path / "t.gguf", tiny_tokenizer_path, model=model, pre=pre)
    with pytest.raises(ValueError, match="not supported"):
        load_bundle(path)


# Ids below were produced by transformers.AutoTokenizer.from_pretrained(dir, gguf_file=...) on this file.
SMOLLM2_IDS = {
    "Hello, world! héllo naïve café": [19556, 28, 905, 17, 294, 2756, 31394, 15486, 46494, 37366],
    "def f(x):\n    return x**2\n\n\n": [1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 16506],
    "   lots   of    spaces\t\ttabs\r\n": [256, 5890, 256, 282, 333, 5600, 197, 197, 100, 7366, 2738],
    "12345 and 3.14159": [33, 34, 35, 36, 37, 284, 216, 35, 30, 33, 36, 33, 37, 41],
    "ABC  def\n\nGHI": [35542, 216, 753, 198, 198, 23960, 57],
    "naïve café — 日本語 🎉 x\u00a0y\ttab 12345": [
        3546,
        46494,
        37366,
        1841,
        17097,
        241,
        115,
        40993,
        179,
        120,
        248,
        15107,
        232,
        227,
        1792,
        15442,
        105,
        197,
        15999,
        216,
        33,
        34,
        35,
        36,
        37,
    ],
}


@pytest.mark.parametrize("text", list(SMOLLM2_IDS), ids=range(len(SMOLLM2_IDS)))
def test_smollm2_tokenizes_like_transformers(smollm2: TokenizerBundle, text: str) -> None:
    ids = smollm2.tokenizer.encode(text)
    assert ids == SMOLLM2_IDS[text]
    assert smollm2.tokenizer.decode(ids) == text


def test_smollm2_special_tokens(smollm2: TokenizerBundle) -> None:
    tok = smollm2.tokenizer
    assert (
        tok.token_to_id("<|endoftext|>"),
        tok.token_to_id("<|im_start|>"),
        tok.token_to_id("<|im_end|>"),
    ) == (0, 1, 2)
    assert (tok.bos_token, tok.eos_token, tok.eos_token_id) == ("<|im_start|>", "<|im_end|>", 2)
    assert tok.vocab_size == 49152
    assert tok.encode("<|im_start|>user\nHi<|im_end|>\n") == [1, 4093, 198, 26843, 2, 198]


def test_smollm2_chat_template_from_metadata(smollm2: TokenizerBundle) -> None:
    text = smollm2.render(ChatPrompt([{"role": "user", "content": "hi"}]))
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    # No BOS post-processing (tokenizer.ggml.add_bos_token is false): text prompts get no extra token.
    assert smollm2.encode(TextPrompt("hi")) == smollm2.tokenizer.encode("hi")
