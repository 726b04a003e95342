"""The byte fallback's block size probe: the computation, and the probe against in-process fake engines
(``httpx.MockTransport``), bounded in time and deaf to servers that report no usage."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import orjson
import pytest

from gateway.engines.block_probe import (
    MAX_PROBED,
    byte_block_size,
    bytes_per_token,
    engine_block_tokens,
    probe_byte_block,
    probe_prompts,
)
from gateway.engines.profiles import EngineFacts, EngineKind
from gateway.settings import BYTE_BLOCK_SIZE, WorkerSpec, parse_worker

pytestmark = pytest.mark.timeout(30)


def words(text: str) -> int:
    return len(text.split())


@dataclass
class Engine:
    """One fake server: counts prompt tokens with ``tokens`` (None: reports no usage), on ``routes``."""

    tokens: Callable[[str], int] | None = words
    routes: tuple[str, ...] = ("/v1/completions", "/v1/chat/completions")
    overhead: int = 0  # tokens added to every prompt (a BOS, a chat template)
    owned_by: str = "someone"
    delay_s: float = 0.0
    gets: dict[str, object] = field(default_factory=dict)
    posts: list[str] = field(default_factory=list)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(self.delay_s)
        path = request.url.path
        if request.method == "GET" and path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "owned_by": self.owned_by}]})
        if request.method == "GET" and path in self.gets:
            return httpx.Response(200, json=self.gets[path])
        if request.method != "POST" or path not in self.routes:
            return httpx.Response(404, json={"error": "not found"})
        self.posts.append(path)
        body = orjson.loads(request.content)
        assert body["max_tokens"] == 1 and body["model"] == "m"
        prompt = body["prompt"] if "prompt" in body else body["messages"][-1]["content"]
        reply: dict[str, object] = {"choices": [{"text": "x"}]}
        if self.tokens is not None:
            overhead = self.overhead + (7 if path.endswith("/chat/completions") else 0)
            reply["usage"] = {"prompt_tokens": self.tokens(prompt) + overhead, "completion_tokens": 1}
        return httpx.Response(200, json=reply)


def fleet(engines: dict[str, Engine]) -> httpx.AsyncClient:
    async def handler(request: httpx.Request) -> httpx.Response:
        return await engines[request.url.host](request)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def specs(*fragments: str, hosts: tuple[str, ...] = ()) -> list[WorkerSpec]:
    return [
        parse_worker(f"http://{h}:8000{('#' + f) if f else ''}")
        for h, f in zip(hosts, fragments, strict=True)
    ]


def _round8(x: float) -> int:
    return int(x / 8 + 0.5) * 8


def _words_block() -> int:
    short, long = probe_prompts()
    ratio = (len(long) - len(short)) / (words(long) - words(short))
    return _round8(ratio * 16)


# --- the computation --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("block_bytes", "expected"),
    [
        ([], BYTE_BLOCK_SIZE),
        ([89.2], 88),
        ([92.1], 96),
        ([30.0, 60.0, 95.0], 64),  # the median, not the mean
        ([60.0, 100.0], 80),  # an even count: the middle two's mean
        ([3.5], 16),  # held at the least
        ([4.0 * 128], 256),  # and at the most
    ],
)
def test_the_size_is_the_rounded_clamped_median(block_bytes: list[float], expected: int) -> None:
    assert byte_block_size(block_bytes) == expected


def test_bytes_per_token_is_the_difference_so_fixed_overhead_cancels() -> None:
    assert bytes_per_token((100, 20 + 7), (600, 120 + 7)) == 5.0
    assert bytes_per_token((100, 1), (600, 1)) is None  # a server that counts nothing
    assert bytes_per_token((100, 50), (600, 30)) is None
    assert bytes_per_token((100, 10), (6000, 11)) is None  # not a tokenizer anyone runs


@pytest.mark.parametrize(
    ("kind", "said", "expected"),
    [
        (EngineKind.VLLM, None, 16),
        (EngineKind.VLLM, 32, 32),
        (EngineKind.SGLANG, None, 16),  # a page of one token: reused at any length, hashed as 16
        (EngineKind.SGLANG, 64, 64),
        (EngineKind.TGI, None, 16),
        (EngineKind.LMDEPLOY, None, 64),
        (EngineKind.OPENAI, None, 16),
        (EngineKind.AUTO, None, 16),
    ],
)
def test_the_engine_block_in_tokens(kind: EngineKind, said: int | None, expected: int) -> None:
    assert engine_block_tokens(EngineFacts(kind=kind, block_size=said)) == expected


def test_the_probe_prompts_are_a_word_prefix_of_about_a_kilobyte_and_a_half() -> None:
    short, long = probe_prompts()
    assert long.startswith(short + " ") and 1024 <= len(long.encode()) <= 2048
    assert 0.4 < len(short) / len(long) < 0.6


# --- against fake engines ---------------------------------------------------------------------------------


async def test_word_engines_on_completions_give_sixteen_words_in_bytes() -> None:
    engines = {"a": Engine(overhead=1), "b": Engine()}
    async with fleet(engines) as client:
        learned = await probe_byte_block(specs("", "", hosts=("a", "b")), client)
    assert learned.size == _words_block() == 96  # 5.76 bytes per word x 16 = 92.2
    assert learned.bytes_per_token is not None and 5.0 < learned.bytes_per_token < 6.0
    assert [a.route for a in learned.answers] == ["/v1/completions"] * 2
    assert engines["a"].posts == ["/v1/completions"] * 2  # a short and a long prompt, nothing more
    assert "learned 5.76 bytes per engine token" in learned.describe() and "96 bytes" in learned.describe()


async def test_a_chat_only_engine_is_asked_on_chat_and_its_template_cancels() -> None:
    engines = {"a": Engine(routes=("/v1/chat/completions",))}
    async with fleet(engines) as client:
        learned = await probe_byte_block(specs("", hosts=("a",)), client)
    assert learned.size == _words_block()
    assert [a.route for a in learned.answers] == ["/v1/chat/completions"]


@pytest.mark.parametrize(
    "engine",
    [
        Engine(tokens=None),  # no usage at all
        Engine(tokens=lambda _p: 1),  # a fixed usage, as a bare echo server
        Engine(routes=()),  # serves no generation route
    ],
)
async def test_no_usable_answer_keeps_the_default(engine: Engine) -> None:
    async with fleet({"a": engine}) as client:
        learned = await probe_byte_block(specs("", hosts=("a",)), client)
    assert learned.size == BYTE_BLOCK_SIZE and learned.bytes_per_token is None and learned.answers == ()
    assert "no worker of 1" in learned.describe()


async def test_an_unreachable_worker_keeps_the_default() -> None:
    async with httpx.AsyncClient() as client:
        spec = parse_worker("http://127.0.0.1:9")
        learned = await probe_byte_block([spec], client, budget_s=1.0)
    assert learned.size == BYTE_BLOCK_SIZE and learned.answers == ()


async def test_a_hanging_worker_costs_no_more_than_the_budget_and_the_others_count() -> None:
    engines = {"slow": Engine(delay_s=20.0), "fast": Engine()}
    async with fleet(engines) as client:
        started = time.monotonic()
        learned = await probe_byte_block(specs("", "", hosts=("slow", "fast")), client, budget_s=0.3)
        elapsed = time.monotonic() - started
    assert elapsed < 1.0
    assert [a.worker for a in learned.answers] == ["fast:8000"] and learned.size == _words_block()


async def test_the_median_of_workers_that_disagree() -> None:
    def per(k: int) -> Callable[[str], int]:
        return lambda p: math.ceil(len(p.encode()) / k)

    engines = {"a": Engine(tokens=per(2)), "b": Engine(tokens=per(4)), "c": Engine(tokens=per(7))}
    async with fleet(engines) as client:
        learned = await probe_byte_block(specs("", "", "", hosts=("a", "b", "c")), client)
    assert len(learned.answers) == 3
    assert learned.size == 64  # 32, 64 and 112 bytes per 16-token block
    assert learned.bytes_per_token == pytest.approx(4.0, abs=0.05)


async def test_the_size_is_clamped_and_follows_the_engines_block() -> None:
    engines = {
        "lmd": Engine(owned_by="lmdeploy"),  # 64-token blocks of ~5.6-byte words: 357 bytes
        "sgl": Engine(tokens=lambda p: len(p.encode()), gets={"/server_info": {"page_size": 1}}),
    }
    async with fleet(engines) as client:
        lmd = await probe_byte_block(specs("prefix_cache=on", hosts=("lmd",)), client)
        sgl = await probe_byte_block(specs("", hosts=("sgl",)), client)
    assert lmd.answers[0].block_tokens == 64 and lmd.size == 256
    assert sgl.answers[0].block_tokens == 16 and sgl.size == 16  # a byte per token, page of one: 16


async def test_an_engine_that_reuses_no_prefix_is_not_asked() -> None:
    engines = {"mii": Engine(owned_by="deepspeed-mii"), "off": Engine(), "on": Engine()}
    async with fleet(engines) as client:
        learned = await probe_byte_block(
            specs("", "prefix_cache=off", "", hosts=("mii", "off", "on")),
            client,
        )
    assert [a.worker for a in learned.answers] == ["on:8000"]
    assert engines["mii"].posts == engines["off"].posts == []


async def test_at_most_the_first_few_workers_are_asked() -> None:
    hosts = tuple(f"w{i}" for i in range(MAX_PROBED + 3))
    engines = {h: Engine() for h in hosts}
    async with fleet(engines) as client:
        learned = await probe_byte_block(specs(*([""] * len(hosts)), hosts=hosts), client)
    assert learned.asked == MAX_PROBED == len(learned.answers)
    assert all(not engines[h].posts for h in hosts[MAX_PROBED:])
