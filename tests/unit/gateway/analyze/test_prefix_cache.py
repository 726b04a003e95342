"""The prefix-token cache never changes a result: cached analysis == full tokenization, on many conversations."""

from __future__ import annotations

import random
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from gateway.analyze.analyzer import PromptAnalysis
from gateway.analyze.incremental import IncrementalEncoder
from gateway.analyze.prefix_cache import BoundaryFinder, PrefixTokenCache
from gateway.analyze.prompt import TokenizingAnalyzer
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash
from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle
from kvgate_core.tokenize.chat_template import ChatTemplate
from kvgate_core.tokenize.request_prompt import Endpoint
from kvgate_core.tokenize.tokenizer import ByteTokenizer, HFTokenizer

PIECES = ["the", " quick", "  ", "\n", "\n\n", "\t", "brown", "fox", "123", "4", "héllo", "日本", "🎉", ".", "!",
          "<|im_end|>", "<|im_start|>", "<|im_", "|>", "<", " <|endoftext|> ", "<|endoftext|>", "x"]  # fmt: skip


def _text(rng: random.Random, max_pieces: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, max_pieces)))


def _conversation(rng: random.Random, turns: int, max_pieces: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = (
        [{"role": "system", "content": _text(rng, 10)}] if rng.random() < 0.7 else []
    )
    for _ in range(turns):
        messages.append({"role": "user", "content": _text(rng, max_pieces)})
        messages.append({"role": "assistant", "content": _text(rng, max_pieces)})
    return messages


def _check_conversations(
    bundle: TokenizerBundle, *, seeds: range, turns: int, max_pieces: int, block_size: int
) -> int:
    cached = TokenizingAnalyzer(bundle, block_size=block_size)
    for seed in seeds:
        rng = random.Random(seed)
        messages = _conversation(rng, turns, max_pieces)
        for end in range(1, len(messages) + 1):
            generation_prompt = rng.random() < 0.8
            body = {"messages": messages[:end], "add_generation_prompt": generation_prompt}
            got = cached.analyze(body, Endpoint.CHAT, "m")
            assert got == _full(bundle, messages[:end], block_size, generation_prompt), (seed, end)
    return cached.cache.hits


def _full(
    bundle: TokenizerBundle, messages: list[dict[str, Any]], block_size: int, generation_prompt: bool = True
) -> PromptAnalysis:
    ids = bundle.tokenizer.encode(
        bundle.chat_template.render(messages, add_generation_prompt=generation_prompt)
    )
    return PromptAnalysis(len(ids), tuple(chain_hashes(ids, root_hash("m"), block_size)))


def test_byte_tokenizer_conversations() -> None:
    hits = _check_conversations(byte_bundle(), seeds=range(40), turns=6, max_pieces=30, block_size=4)
    assert hits > 100


def test_tiny_bpe_conversations(tiny: TokenizerBundle) -> None:
    hits = _check_conversations(tiny, seeds=range(25), turns=6, max_pieces=30, block_size=16)
    assert hits > 100


def test_smollm2_conversations(smollm2: TokenizerBundle) -> None:
    hits = _check_conversations(smollm2, seeds=range(12), turns=8, max_pieces=60, block_size=16)
    assert hits > 50


def _trained(pre: pre_tokenizers.PreTokenizer, decoder: decoders.Decoder, special: AddedToken) -> HFTokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre
    tok.decoder = decoder
    corpus = [" ".join(PIECES[:15]) * 3, "the quick brown fox jumps over the lazy dog"] * 5
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"]))
    tok.add_special_tokens([special, AddedToken("<|im_start|>", special=True, normalized=False)])
    return HFTokenizer(tok)


@pytest.mark.parametrize(
    "flavour",
    ["metaspace-first", "rstrip-lstrip"],
)
def test_position_dependent_tokenizers(flavour: str) -> None:
    """Split points stay exact with a SentencePiece-style ``prepend_scheme="first"`` and with special tokens
    that swallow the whitespace around them."""
    pre: pre_tokenizers.PreTokenizer
    dec: decoders.Decoder
    if flavour == "metaspace-first":
        pre, dec = (
            pre_tokenizers.Metaspace(prepend_scheme="first"),
            decoders.Metaspace(prepend_scheme="first"),
        )
        end = AddedToken("<|im_end|>", special=True, normalized=False)
    else:
        pre, dec = pre_tokenizers.ByteLevel(add_prefix_space=True), decoders.ByteLevel()
        end = AddedToken("<|im_end|>", special=True, normalized=False, rstrip=True, lstrip=True)
    tokenizer = _trained(pre, dec, end)
    template = "{% for m in messages %}<|im_start|>{{ m.role }} {{ m.content }} <|im_end|>  {% endfor %}"
    bundle = TokenizerBundle("m", tokenizer, ChatTemplate(template))
    hits = _check_conversations(bundle, seeds=range(20), turns=5, max_pieces=20, block_size=4)
    assert hits > 50


def test_edited_history_is_recomputed() -> None:
    bundle = byte_bundle()
    analyzer = TokenizingAnalyzer(bundle, block_size=4)
    messages = [{"role": "user", "content": f"turn {i} " * 5} for i in range(6)]
    analyzer.analyze({"messages": messages}, Endpoint.CHAT, "m")
    edited = [dict(messages[0], content="changed"), *messages[1:]]
    assert analyzer.analyze({"messages": edited}, Endpoint.CHAT, "m") == _full(bundle, edited, 4)


def test_roots_do_not_share_entries_but_stay_correct() -> None:
    bundle = byte_bundle()
    analyzer = TokenizingAnalyzer(bundle, block_size=4)
    body = {"messages": [{"role": "user", "content": "hello there"}]}
    plain = analyzer.analyze(body, Endpoint.CHAT, "m")
    salted = analyzer.analyze({**body, "cache_salt": "x"}, Endpoint.CHAT, "m")
    assert analyzer.cache.hits == 0
    assert len(analyzer.cache) == 2
    assert salted.num_tokens == plain.num_tokens
    assert salted.block_hashes != plain.block_hashes


def test_a_cache_shared_across_block_sizes_stays_correct() -> None:
    bundle, cache = byte_bundle(), PrefixTokenCache()
    body = {"messages": [{"role": "user", "content": "hello there, general kenobi"}]}
    for block_size in (4, 16, 4, 16):
        got = TokenizingAnalyzer(bundle, block_size=block_size, cache=cache).analyze(body, Endpoint.CHAT, "m")
        assert got == _full(bundle, body["messages"], block_size)
    assert cache.hits == 2


def test_cache_is_bounded_by_tokens() -> None:
    cache = PrefixTokenCache(max_tokens=500)
    analyzer = TokenizingAnalyzer(byte_bundle(), cache=cache)
    for i in range(50):
        analyzer.analyze(
            {"messages": [{"role": "user", "content": f"conversation {i} " * 8}]}, Endpoint.CHAT, "m"
        )
        assert cache.num_tokens <= 500
    assert 0 < len(cache) < 50


def test_disabled_cache_stores_nothing() -> None:
    analyzer = TokenizingAnalyzer(byte_bundle(), cache=PrefixTokenCache(0))
    analyzer.analyze({"messages": [{"role": "user", "content": "hi"}]}, Endpoint.CHAT, "m")
    assert len(analyzer.cache) == 0
    assert not analyzer.cache.enabled


class _LyingTokenizer(ByteTokenizer):
    """Claims ``<|im_start|>`` has another id than the one it encodes to: splits must not be trusted."""

    def token_to_id(self, token: str) -> int | None:
        return 0 if token == "<|im_start|>" else super().token_to_id(token)


def test_unverifiable_split_falls_back_to_full_tokenization() -> None:
    tokenizer = _LyingTokenizer()
    encoder = IncrementalEncoder(tokenizer, PrefixTokenCache(), block_size=4)
    text = ChatTemplate().render([{"role": "user", "content": "hello"}])
    ids, hashes = encoder.encode(text, root=7)
    assert list(ids) == tokenizer.encode(text)
    assert hashes == tuple(chain_hashes(tokenizer.encode(text), 7, 4))
    assert len(encoder.cache) == 0


def test_boundary_finder_matches_leftmost_longest_like_the_library() -> None:
    finder = BoundaryFinder(["<a>", "<a><b>", "b>x"], ["<a>", "<a><b>"])
    found = finder.find("<a><b>x<a>", root=1, block_size=4)
    assert (found.ends, found.tokens) == ([6, 10], ["<a><b>", "<a>"])
    assert not BoundaryFinder([], []).find("<a>", root=1, block_size=4)


def test_an_added_token_that_is_no_boundary_ends_none_but_stays_in_the_keys() -> None:
    finder = BoundaryFinder(["<a>", "<n>"], ["<a>"])
    found = finder.find("x<n>y<a>z<a>", root=1, block_size=4)
    assert (found.ends, found.tokens) == ([8, 12], ["<a>", "<a>"])
    other = finder.find("x<n>w<a>z<a>", root=1, block_size=4)  # differs before the first boundary only
    assert all(a != b for a, b in zip(found.keys, other.keys, strict=True))


def test_a_prefix_key_depends_on_the_text_up_to_its_boundary_only() -> None:
    finder = BoundaryFinder(["<s>", "<e>"], ["<s>", "<e>"])
    short = finder.find("<s>user one<e><s>", root=3, block_size=16)
    longer = finder.find("<s>user one<e><s>answer<e><s>", root=3, block_size=16)
    assert longer.keys[: len(short)] == short.keys
    # the same segments in another order, same length: other keys
    swapped = finder.find("<s>one user<e><s>", root=3, block_size=16)
    reordered = finder.find("<s>b<e>a<e><s>", root=3, block_size=16)
    assert finder.find("<s>a<e>b<e><s>", root=3, block_size=16).keys[-1] != reordered.keys[-1]
    assert swapped.keys[-1] != short.keys[-1]
    # root and block size are part of every key (the cached hashes depend on them)
    assert finder.find("<s>user one<e><s>", root=4, block_size=16).keys[-1] != short.keys[-1]
    assert finder.find("<s>user one<e><s>", root=3, block_size=32).keys[-1] != short.keys[-1]


def test_prefix_keys_over_many_boundaries_match_one_by_one_computation() -> None:
    finder = BoundaryFinder(["<t>"], ["<t>"])
    text = "".join(f"m{i}<t>" for i in range(700))  # past the multiplier's precomputed powers
    found = finder.find(text, root=5, block_size=8)
    assert len(found) == 700 and len(set(found.keys)) == 700
    assert found.keys[:300] == finder.find(text[: found.ends[299]], root=5, block_size=8).keys
