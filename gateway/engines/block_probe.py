"""The byte fallback's block size, learned at start: one engine KV block, in bytes.

When no exact tokenizer is found the gateway hashes the prompt's bytes, and a block of ``n`` bytes should hold
about what one engine block holds: finer costs hashing for hits the engine cannot give (it reuses whole
blocks), coarser loses hits. So, once at start, each worker (the first ``MAX_PROBED``) is asked twice with a
fixed English text, a short and a long prompt, ``max_tokens: 1``, on ``/v1/completions`` (else on
``/v1/chat/completions``). The difference of the two prompts' bytes over the difference of the
``usage.prompt_tokens`` the engine reports is its bytes per token, free of what it adds to every prompt (a
BOS token, a chat template). Times the engine's block in tokens (what detection reads from the engine, else
its profile's default; never under 16 tokens, since a page of one token is reused at any length anyway),
that is one block in bytes. The workers' median, rounded to a multiple of 8 and held within [16, 256], is
the byte block size; no answer leaves the default.

Everything is bounded by one deadline (``PROBE_BUDGET_S``, all workers at once); a worker that fails,
reports no usage or answers nonsense is left out. The median bytes per token is also the capacity learner's
starting ratio (``gateway.kvindex.capacity``).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import httpx
import orjson

from gateway.engines.detect import detect_engine
from gateway.engines.probe import Get
from gateway.engines.profiles import EngineFacts, EngineKind
from gateway.settings import BYTE_BLOCK_SIZE, WorkerSpec

logger = logging.getLogger(__name__)

#: the whole probe's deadline, every worker asked at once
PROBE_BUDGET_S: Final = 2.0
#: workers asked at most (the first ones listed): a median of a few is enough, and a large fleet is spared
MAX_PROBED: Final = 8
MIN_BYTE_BLOCK: Final = 16
MAX_BYTE_BLOCK: Final = 256
#: the engine block, in tokens, is taken as at least this (SGLang's and TGI's page of one token)
MIN_ENGINE_BLOCK_TOKENS: Final = 16
#: bytes per token outside this range are a server that does not count tokens (a fixed usage, say)
_PLAUSIBLE: Final = (1.0, 32.0)
ROUTES: Final = ("/v1/completions", "/v1/chat/completions")

PROBE_TEXT: Final = (
    "The morning train was late again, so the small station filled with people who had nowhere else to be. "
    "A woman in a green coat read the timetable twice, as if the numbers might change when she looked away. "
    "Two students shared a bag of oranges and argued about a film they had both forgotten the ending of. "
    "Near the stairs an old man fed the pigeons from a paper cup, talking to them quietly about the weather, "
    "the price of bread and the way the town had changed since the factory closed. When the announcement "
    "finally came, it said only that the service would resume shortly, which nobody believed. Outside, the "
    "rain turned to a fine mist that hung over the tracks and made the signals look softer than they were. "
    "A boy counted the carriages of a freight train passing slowly through, losing track somewhere after "
    "forty and starting again from the beginning. The cafe by the entrance sold out of coffee within the "
    "hour, and its owner wrote a polite apology on the chalkboard in careful capital letters. Somebody "
    "opened a window in the waiting room, and the smell of wet leaves and diesel drifted in with the cold. "
    "By noon the crowd had thinned, most travellers having given up and gone home or found a bus instead, "
    "and the ones who remained had settled into a patient silence, reading, dozing, or watching the empty "
    "line where the train would eventually appear. When it did arrive, nearly two hours behind schedule, "
    "there was a small cheer, and the conductor stepped down to apologise to each passenger in turn."
)


def probe_prompts() -> tuple[str, str]:
    """The short and the long prompt: the first half of ``PROBE_TEXT``'s words, and all of them."""
    words = PROBE_TEXT.split(" ")
    return " ".join(words[: len(words) // 2]), PROBE_TEXT


@dataclass(frozen=True, slots=True)
class WorkerAnswer:
    """What one worker told: its bytes per token (on ``route``) and its KV block in tokens."""

    worker: str
    bytes_per_token: float
    block_tokens: int
    route: str

    @property
    def block_bytes(self) -> float:
        return self.bytes_per_token * self.block_tokens


@dataclass(frozen=True, slots=True)
class ByteBlock:
    """The probe's outcome: the byte block size, the median bytes per token (None: nothing learned), the
    answers it rests on, and how many workers were asked."""

    size: int
    bytes_per_token: float | None
    answers: tuple[WorkerAnswer, ...]
    asked: int

    def describe(self) -> str:
        """What was learned and chosen, for the start-up log line."""
        if not self.answers:
            return (
                f"no worker of {self.asked} asked reported usage.prompt_tokens for the probe: "
                f"the default {self.size} bytes"
            )
        tokens = "/".join(map(str, sorted({a.block_tokens for a in self.answers})))
        routes = "/".join(sorted({a.route for a in self.answers}))
        return (
            f"learned {self.bytes_per_token:.2f} bytes per engine token ({routes} usage of "
            f"{len(self.answers)} of {self.asked} workers) x {tokens}-token engine blocks: {self.size} bytes"
        )


def byte_block_size(block_bytes: Sequence[float], default: int = BYTE_BLOCK_SIZE) -> int:
    """The median of one engine block in bytes per worker, rounded to a multiple of 8 and held within
    [``MIN_BYTE_BLOCK``, ``MAX_BYTE_BLOCK``]; ``default`` when there is none."""
    if not block_bytes:
        return default
    rounded = int(statistics.median(block_bytes) / 8 + 0.5) * 8
    return min(MAX_BYTE_BLOCK, max(MIN_BYTE_BLOCK, rounded))


def engine_block_tokens(facts: EngineFacts) -> int:
    """The engine's KV block in tokens: what it said, else its profile's default; at least 16."""
    block = facts.block_size if facts.block_size is not None else facts.profile.default_block_size
    return max(MIN_ENGINE_BLOCK_TOKENS, block)


def bytes_per_token(short: tuple[int, int], long: tuple[int, int]) -> float | None:
    """Bytes per token from two (bytes, prompt tokens) pairs: the difference, so what the engine adds to
    every prompt cancels; None when the answer is not plausible."""
    tokens = long[1] - short[1]
    if tokens <= 0:
        return None
    ratio = (long[0] - short[0]) / tokens
    return ratio if _PLAUSIBLE[0] <= ratio <= _PLAUSIBLE[1] else None


async def probe_byte_block(
    workers: Sequence[WorkerSpec],
    client: httpx.AsyncClient,
    *,
    budget_s: float = PROBE_BUDGET_S,
    default: int = BYTE_BLOCK_SIZE,
) -> ByteBlock:
    """Ask the workers (see the module docstring) and choose the byte block size. Never raises for a
    failing worker; returns within about ``budget_s``."""
    asked = list(workers[:MAX_PROBED])
    tasks = [asyncio.create_task(_ask(spec, client, budget_s)) for spec in asked]
    if tasks:
        _done, pending = await asyncio.wait(tasks, timeout=budget_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    answers = tuple(a for a in map(_answer, tasks) if a is not None)
    size = byte_block_size([a.block_bytes for a in answers], default)
    ratio = statistics.median(a.bytes_per_token for a in answers) if answers else None
    return ByteBlock(size, ratio, answers, len(asked))


def _answer(task: asyncio.Task[WorkerAnswer | None]) -> WorkerAnswer | None:
    if not task.done() or task.cancelled():
        return None
    if task.exception() is not None:
        logger.debug("byte block probe failed: %r", task.exception())
        return None
    return task.result()


async def _ask(spec: WorkerSpec, client: httpx.AsyncClient, timeout_s: float) -> WorkerAnswer | None:
    try:
        facts = await detect_engine(_getter(client, timeout_s), spec.url, configured=EngineKind(spec.engine))
        reuse = spec.prefix_cache if spec.prefix_cache is not None else facts.prefix_reuse
        if facts.profile.prefix_reuse == "no" or reuse is False:
            return None  # its cache is never reused: its block does not matter
        model = facts.served_model or spec.model
        for route in ROUTES:
            ratio = await _measure(client, spec.url + route, model, timeout_s)
            if ratio is not None:
                return WorkerAnswer(spec.id, ratio, engine_block_tokens(facts), route)
    except (httpx.HTTPError, OSError, ValueError) as exc:
        logger.debug("byte block probe of %s failed: %r", spec.url, exc)
    return None


async def _measure(client: httpx.AsyncClient, url: str, model: str | None, timeout_s: float) -> float | None:
    short, long = probe_prompts()
    counts = await asyncio.gather(*(_prompt_tokens(client, url, model, p, timeout_s) for p in (short, long)))
    if counts[0] is None or counts[1] is None:
        return None
    return bytes_per_token((len(short.encode()), counts[0]), (len(long.encode()), counts[1]))


async def _prompt_tokens(
    client: httpx.AsyncClient, url: str, model: str | None, prompt: str, timeout_s: float
) -> int | None:
    body: dict[str, object] = {"max_tokens": 1, "stream": False}
    if url.endswith("/chat/completions"):
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if model is not None:
        body["model"] = model
    headers = {"content-type": "application/json"}
    reply = await client.post(url, content=orjson.dumps(body), headers=headers, timeout=timeout_s)
    if reply.status_code != 200:
        return None
    try:
        usage = orjson.loads(reply.content).get("usage")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else None


def _getter(client: httpx.AsyncClient, timeout_s: float) -> Get:
    """Detection's GET over ``client``, failing with the ``OSError``/``TimeoutError`` detection expects."""

    async def get(base_url: str, path: str) -> tuple[int, bytes]:
        try:
            reply = await client.get(base_url + path, timeout=timeout_s)
        except httpx.TimeoutException as exc:
            raise TimeoutError(str(exc)) from exc
        except httpx.HTTPError as exc:
            raise OSError(str(exc)) from exc
        return reply.status_code, reply.content

    return get
