from __future__ import annotations

from typing import Any

import pytest

from gateway.analyze.analyzer import PromptAnalysis, PromptAnalyzer
from gateway.analyze.prefix_cache import PrefixTokenCache
from gateway.analyze.prompt import TokenizingAnalyzer
from kvgate_core.kvcontract.extra_keys import extra_keys
from kvgate_core.kvcontract.hashing import chain_hashes, root_hash
from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle
from kvgate_core.tokenize.request_prompt import Endpoint

CHAT = {"messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello, how are you today?" * 4}]}  # fmt: skip


@pytest.fixture(params=["bytes", "tiny"])
def bundle(request: pytest.FixtureRequest, tiny: TokenizerBundle) -> TokenizerBundle:
    return byte_bundle() if request.param == "bytes" else tiny


def test_is_a_prompt_analyzer(bundle: TokenizerBundle) -> None:
    analyzer: PromptAnalyzer = TokenizingAnalyzer(bundle)
    assert analyzer.analyze(CHAT, Endpoint.CHAT, "m").num_tokens > 0


@pytest.mark.parametrize("block_size", [4, 16])
def test_chat_hashes_equal_a_direct_computation(bundle: TokenizerBundle, block_size: int) -> None:
    analysis = TokenizingAnalyzer(bundle, block_size=block_size).analyze(CHAT, Endpoint.CHAT, "m")
    text = bundle.chat_template.render(CHAT["messages"])
    ids = bundle.tokenizer.encode(text)
    assert analysis == PromptAnalysis(len(ids), tuple(chain_hashes(ids, root_hash("m"), block_size)))
    assert len(analysis.block_hashes) == len(ids) // block_size


def test_text_completion_uses_the_tokenizer_directly(bundle: TokenizerBundle) -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 3
    analysis = TokenizingAnalyzer(bundle, block_size=4).analyze({"prompt": text}, Endpoint.COMPLETIONS, "m")
    ids = bundle.tokenizer.encode(text, add_special_tokens=True)
    assert analysis == PromptAnalysis(len(ids), tuple(chain_hashes(ids, root_hash("m"), 4)))


def test_token_id_prompts_are_hashed_as_is() -> None:
    ids = list(range(100, 140))
    analyzer = TokenizingAnalyzer(byte_bundle(), block_size=16)
    analysis = analyzer.analyze({"prompt": ids}, Endpoint.COMPLETIONS, "m")
    assert analysis == PromptAnalysis(40, tuple(chain_hashes(ids, root_hash("m"), 16)))
    assert analyzer.analyze({"prompt": [ids, [1, 2]]}, Endpoint.COMPLETIONS, "m") == analysis


def test_chat_and_completion_of_the_same_text_agree() -> None:
    bundle = byte_bundle()
    analyzer = TokenizingAnalyzer(bundle, block_size=4)
    text = bundle.chat_template.render(CHAT["messages"])
    assert analyzer.analyze(CHAT, Endpoint.CHAT, "m") == analyzer.analyze(
        {"prompt": text}, Endpoint.COMPLETIONS, "m"
    )


@pytest.mark.parametrize(
    ("body", "tenant", "keys"),
    [
        ({"lora": "sql"}, None, extra_keys(lora="sql")),
        ({"cache_salt": "s3cret"}, None, extra_keys(cache_salt="s3cret")),
        ({}, "acme", extra_keys(tenant="acme")),
        ({"lora": "sql", "cache_salt": "s"}, "acme", ("lora:sql", "salt:s", "tenant:acme")),
    ],
    ids=["lora", "salt", "tenant", "all"],
)
def test_extra_keys_change_the_root(body: dict[str, Any], tenant: str | None, keys: tuple[str, ...]) -> None:
    analyzer = TokenizingAnalyzer(byte_bundle(), block_size=4, cache=PrefixTokenCache(0))
    plain = analyzer.analyze(CHAT, Endpoint.CHAT, "m")
    keyed = analyzer.analyze({**CHAT, **body}, Endpoint.CHAT, "m", tenant=tenant)
    assert keyed.num_tokens == plain.num_tokens
    assert set(keyed.block_hashes).isdisjoint(plain.block_hashes)
    ids = byte_bundle().tokenizer.encode(byte_bundle().chat_template.render(CHAT["messages"]))
    assert keyed.block_hashes == tuple(chain_hashes(ids, root_hash("m", keys), 4))


def test_model_and_hash_model_select_the_root() -> None:
    bundle = byte_bundle()
    a = TokenizingAnalyzer(bundle).analyze(CHAT, Endpoint.CHAT, "a")
    b = TokenizingAnalyzer(bundle).analyze(CHAT, Endpoint.CHAT, "b")
    pinned = TokenizingAnalyzer(bundle, hash_model="a").analyze(CHAT, Endpoint.CHAT, "alias")
    assert a.block_hashes != b.block_hashes
    assert pinned == a


@pytest.mark.parametrize(
    ("body", "endpoint"),
    [
        ({"messages": []}, Endpoint.CHAT),
        ({"messages": [{"role": "user", "content": "x"}], "lora": 3}, Endpoint.CHAT),
        ({"prompt": None}, Endpoint.COMPLETIONS),
    ],
    ids=["no-messages", "bad-lora", "no-prompt"],
)
def test_bad_bodies_raise_value_error(body: dict[str, Any], endpoint: Endpoint) -> None:
    with pytest.raises(ValueError):
        TokenizingAnalyzer(byte_bundle()).analyze(body, endpoint, "m")


def test_template_errors_raise_value_error(tiny: TokenizerBundle) -> None:
    from kvgate_core.tokenize.chat_template import ChatTemplate

    strict = TokenizerBundle("m", tiny.tokenizer, ChatTemplate("{{ raise_exception('no tools here') }}"))
    with pytest.raises(ValueError, match="no tools here"):
        TokenizingAnalyzer(strict).analyze(CHAT, Endpoint.CHAT, "m")


def test_tokenize_returns_the_engine_ids(tiny: TokenizerBundle) -> None:
    analyzer = TokenizingAnalyzer(tiny)
    assert analyzer.tokenize(CHAT, Endpoint.CHAT) == tiny.tokenizer.encode(
        tiny.chat_template.render(CHAT["messages"])
    )
    assert analyzer.tokenize({"prompt": [1, 2]}, Endpoint.COMPLETIONS) == [1, 2]


def _vision(url: str, question: str = "what is in this picture, in detail?") -> dict[str, Any]:
    parts = [
        {"type": "text", "text": "You are looking at a photograph. " * 4},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": question * 4},
    ]
    return {"messages": [{"role": "user", "content": parts}]}


def test_an_image_is_folded_into_the_hashes_from_its_position_on() -> None:
    analyzer = TokenizingAnalyzer(byte_bundle(), block_size=16, cache=PrefixTokenCache(0))
    cat = analyzer.analyze(_vision("https://img/cat.png"), Endpoint.CHAT, "m").block_hashes
    dog = analyzer.analyze(_vision("https://img/dog.png"), Endpoint.CHAT, "m").block_hashes
    again = analyzer.analyze(_vision("https://img/cat.png"), Endpoint.CHAT, "m").block_hashes
    assert cat == again  # the same image in the same place: the same blocks
    shared = next(i for i, (a, b) in enumerate(zip(cat, dog, strict=True)) if a != b)
    text_before = len("<|im_start|>user\n" + "You are looking at a photograph. " * 4) // 16
    assert shared >= text_before - 1  # the text before the image is shared ...
    assert all(a != b for a, b in zip(cat[shared:], dog[shared:], strict=True))  # ... nothing after it


def test_a_responses_request_hashes_like_the_chat_it_stands_for() -> None:
    analyzer = TokenizingAnalyzer(byte_bundle(), block_size=16, cache=PrefixTokenCache(0))
    responses = {
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi " * 20}]}
        ],
    }
    chat = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi " * 20}]}
    a = analyzer.analyze(responses, Endpoint.RESPONSES, "m")
    b = analyzer.analyze(chat, Endpoint.CHAT, "m")
    assert a == b and a.block_hashes
