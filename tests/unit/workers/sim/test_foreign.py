"""The ``--foreign`` sim in-process: its word tokenizer, its template and the opaque HTTP surface."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import httpx
import pytest

from kvgate_core.tokenize.request_prompt import ChatPrompt
from workers import cli
from workers.server.app import create_app
from workers.sim.engine import SimConfig, SimEngine
from workers.sim.foreign import FOREIGN_OWNED_BY, WordTokenizer, foreign_bundle, word_id
from workers.sim.scheduler import SimTiming

LONG = " ".join(f"word{i}" for i in range(100))


def test_word_tokenizer_counts_words_and_ids_are_stable() -> None:
    tok = WordTokenizer()
    ids = tok.encode("  the cache\nroutes\tthe  ")
    assert ids == [word_id("the"), word_id("cache"), word_id("routes"), word_id("the")]
    assert word_id("the") == 857228358  # pinned: the same in every process (xxh3, unseeded)
    assert tok.decode(tok.encode("the cache")) == " the cache"
    assert tok.decode([word_id("zzz-unknown")]) == " <unk>"
    assert tok.token_to_id("the") == word_id("the")
    assert tok.token_to_id("two words") is None


def test_template_renders_role_lines_and_the_assistant_cue() -> None:
    bundle = foreign_bundle("m")
    prompt = ChatPrompt([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}])
    assert bundle.render(prompt) == "system: be brief\nuser: hi there\nassistant:"
    assert len(bundle.encode(prompt)) == 7


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    timing = SimTiming(prefill_tps=1e7, decode_tps=1e5)
    engine = SimEngine(SimConfig(model="m", timing=timing, kv_tokens=4096), foreign_bundle("m"))
    await engine.start()
    app = create_app(engine, owned_by=FOREIGN_OWNED_BY, introspection=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as c:
        yield c
    await engine.stop()


async def test_opaque_surface_hides_load_kv_and_tokenizer(client: httpx.AsyncClient) -> None:
    for path in ("/load", "/kv/events", "/kv/blocks", "/tokenizer"):
        reply = await client.get(path)
        assert reply.status_code == 404, path
        assert reply.json()["error"]["code"] == "not_found"
    assert (await client.post("/tokenize", json={"prompt": "x"})).status_code == 404
    card = (await client.get("/v1/models")).json()["data"][0]
    assert card["owned_by"] == FOREIGN_OWNED_BY
    assert (await client.get("/health")).status_code == 200


async def test_usage_is_in_words_and_cached_in_whole_blocks(client: httpx.AsyncClient) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": LONG}], "max_tokens": 4}
    first = (await client.post("/v1/chat/completions", json=body)).json()["usage"]
    second = (await client.post("/v1/chat/completions", json=body)).json()["usage"]
    assert first["prompt_tokens"] == 102  # "user:", 100 words, "assistant:"
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["prompt_tokens_details"]["cached_tokens"] == 101 // 16 * 16


def _cli_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_builds_a_word_tokenizing_sim() -> None:
    engine = cli._build_sim(_cli_args("--sim", "--foreign", "--kv-tokens", "4096"))
    assert isinstance(engine.bundle.tokenizer, WordTokenizer)
    assert engine.load().num_total_blocks == 4096 // 16


@pytest.mark.parametrize(
    ("argv", "says"),
    [(["--foreign"], "needs --sim"), (["--sim", "--foreign", "--tokenizer", "bytes"], "drop")],
)
def test_cli_rejects_foreign_without_sim_or_with_a_tokenizer(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.run(_cli_args(*argv)) == 2
    assert says in capsys.readouterr().err
