"""The shared core of the engine fakes: a tiny deterministic "model" behind a real scheduler.

Tokens: kvgate's byte tokenizer (``kvgate_core.tokenize.bundle.byte_bundle``). A chat prompt is rendered
with its default ChatML template and every UTF-8 byte of the rendered text is one token (ids 0-255);
``<|endoftext|>`` (256), ``<|im_start|>`` (257) and ``<|im_end|>`` (258) are single tokens. A text prompt is
its UTF-8 bytes. So a gateway tokenizing with ``--tokenizer bytes`` (what ``auto`` falls back to in front of
these engines, which expose no tokenizer a gateway can load) sees exactly the fakes' prompt tokens.
``BOS_ID`` (256) is prepended only where an engine's route adds special tokens to a text (TGI's
``/tokenize``, LMDeploy's ``/v1/encode`` with ``add_bos``), which is what a BOS model does there.

Output: deterministic words (``workers.sim.text``) keyed by the prompt and ``seed``; a sequence stops at
its natural length (``finish_reason`` "stop") or at ``max_tokens`` ("length").

Scheduling: at most ``max_running`` sequences run; the others wait in FIFO order, so running and waiting
figures are real. A running sequence matches its prompt against the prefix cache (``cache.PrefixCache``,
in the engine's block size), sleeps ``prefill_ms_per_token`` per *uncached* prompt token, stores its
prompt's blocks (listeners turn that into the engine's KV events), then emits a token every
``decode_ms_per_token``. Both delays are multiplied by ``slow_factor`` (one slow worker in a fleet).
Only prompt blocks are cached (not generated ones). Faults (``Faults``) make generations fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvgate_core.tokenize.bundle import TokenizerBundle, byte_bundle
from tests.support.engines.cache import Block, PrefixCache, namespace_root
from workers.sim.text import TextStream, WordBook

BOS_ID = 256


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How the fake engine behaves (delays in milliseconds per token, before ``slow_factor``)."""

    model: str
    block_size: int
    kv_tokens: int = 65_536
    max_running: int = 8
    prefill_ms_per_token: float = 0.05
    decode_ms_per_token: float = 5.0
    slow_factor: float = 1.0
    prefix_caching: bool = True
    partial_blocks: bool = False


@dataclass(slots=True)
class Faults:
    """Injected failures: the next ``count`` generations fail after ``fail_after_tokens`` tokens;
    ``broken``: every generation fails before its first token (the engine is broken, /health may not say);
    ``unhealthy``: ``/health`` answers as the engine does when it is unhealthy (MII's never does)."""

    fail_after_tokens: int = 0
    count: int = 0
    broken: bool = False
    unhealthy: bool = False


@dataclass(frozen=True, slots=True)
class GenRequest:
    prompt_ids: Sequence[int]
    max_tokens: int
    seed: int | None = None
    salt: str | None = None
    lora: str | None = None


@dataclass(frozen=True, slots=True)
class TokenOut:
    """One generated token; the last one carries the finish reason."""

    id: int
    text: str
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Done:
    finish_reason: str


class EngineFailureError(Exception):
    """A generation failed inside the engine (injected)."""


class CacheListener(Protocol):
    """Told about every change of the prefix cache, in order (KV event publishers)."""

    def on_cache_events(self, stored: Sequence[Block], removed: Sequence[Block], cleared: bool) -> None: ...


@dataclass(slots=True)
class Generation:
    """One request inside the engine; outputs arrive on ``queue`` (tokens, then ``Done`` or a failure)."""

    request: GenRequest
    queue: asyncio.Queue[TokenOut | Done | EngineFailureError] = field(default_factory=asyncio.Queue)
    cached_tokens: int = 0
    completion_tokens: int = 0
    held_tokens: int = 0
    task: asyncio.Task[None] | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.request.prompt_ids)

    async def next(self, wait_s: float | None = None) -> TokenOut | Done | None:
        """The next output; None when ``wait_s`` passes first. Raises ``EngineFailureError``."""
        try:
            item = await asyncio.wait_for(self.queue.get(), wait_s)
        except TimeoutError:
            return None
        if isinstance(item, EngineFailureError):
            raise item
        return item

    async def collect(self) -> tuple[str, str]:
        """All of the text and the finish reason. Raises ``EngineFailureError``."""
        parts: list[str] = []
        while True:
            item = await self.next()
            if isinstance(item, Done):
                return "".join(parts), item.finish_reason
            if item is not None:
                parts.append(item.text)

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's load and cache (``kv_used_tokens``: cached blocks + tokens held by running
    sequences outside them, at most ``kv_tokens``)."""

    running: int
    waiting: int
    waiting_tokens: int
    reserved_tokens: int
    cached_blocks: int
    kv_used_tokens: int
    kv_tokens: int
    block_size: int
    max_running: int
    prompt_tokens_total: int
    cached_tokens_total: int
    generation_tokens_total: int
    finished_total: int
    gen_throughput: float

    @property
    def kv_usage(self) -> float:
        return self.kv_used_tokens / self.kv_tokens if self.kv_tokens else 0.0

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens_total / self.prompt_tokens_total if self.prompt_tokens_total else 0.0


class FakeEngine:
    """The scheduler and model shared by every fake; engines format what it produces."""

    def __init__(self, config: EngineConfig, listeners: Sequence[CacheListener] = ()) -> None:
        self.config = config
        self.bundle: TokenizerBundle = byte_bundle(config.model)
        self.faults = Faults()
        self.listeners = list(listeners)
        self.cache = PrefixCache(
            config.block_size, max(1, config.kv_tokens // config.block_size),
            enabled=config.prefix_caching, partial_blocks=config.partial_blocks,
        )  # fmt: skip
        self._book = WordBook(self.bundle.tokenizer.encode, self.bundle.tokenizer.decode)
        self._running: list[Generation] = []
        self._waiting: deque[tuple[Generation, asyncio.Future[None]]] = deque()
        self._recent: deque[float] = deque()
        self._totals = [0, 0, 0, 0]  # prompt, cached, generated tokens, finished requests

    def submit(self, request: GenRequest) -> Generation:
        """Start a generation (from inside the event loop); read its outputs from ``Generation.queue``."""
        gen = Generation(request)
        gen.task = asyncio.get_running_loop().create_task(self._run(gen))
        return gen

    def stats(self) -> EngineStats:
        now = time.monotonic()
        while self._recent and self._recent[0] < now - 5.0:
            self._recent.popleft()
        cfg = self.config
        held = sum(g.held_tokens for g in self._running)
        return EngineStats(
            running=len(self._running), waiting=len(self._waiting),
            waiting_tokens=sum(g.prompt_tokens for g, _ in self._waiting),
            reserved_tokens=sum(g.prompt_tokens + g.request.max_tokens for g in self._running),
            cached_blocks=len(self.cache),
            kv_used_tokens=min(cfg.kv_tokens, len(self.cache) * cfg.block_size + held),
            kv_tokens=cfg.kv_tokens, block_size=cfg.block_size, max_running=cfg.max_running,
            prompt_tokens_total=self._totals[0], cached_tokens_total=self._totals[1],
            generation_tokens_total=self._totals[2], finished_total=self._totals[3],
            gen_throughput=len(self._recent) / 5.0,
        )  # fmt: skip

    def reset(self) -> None:
        """Empty the prefix cache (listeners hear ``cleared``) and zero the counters."""
        dropped = self.cache.clear()
        self._totals = [0, 0, 0, 0]
        for listener in self.listeners:
            listener.on_cache_events((), dropped, True)

    async def _run(self, gen: Generation) -> None:
        try:
            await self._acquire(gen)
        except asyncio.CancelledError:
            return
        try:
            await self._generate(gen)
        except EngineFailureError as exc:
            gen.queue.put_nowait(exc)
        except asyncio.CancelledError:
            pass
        finally:
            self._release(gen)

    async def _generate(self, gen: Generation) -> None:
        cfg, req = self.config, gen.request
        if self.faults.broken:
            raise EngineFailureError("the engine is broken")
        fail_at = self._take_fault()
        root = namespace_root(req.salt, req.lora)
        gen.cached_tokens = self.cache.match(req.prompt_ids, root)
        gen.held_tokens = gen.prompt_tokens - gen.cached_tokens
        self._totals[0] += gen.prompt_tokens
        self._totals[1] += gen.cached_tokens
        await asyncio.sleep(gen.held_tokens * cfg.prefill_ms_per_token * cfg.slow_factor / 1000)
        stored, evicted = self.cache.insert(req.prompt_ids, root, salt=req.salt, lora=req.lora)
        if stored or evicted:
            for listener in self.listeners:
                listener.on_cache_events(stored, evicted, False)
        gen.held_tokens = gen.prompt_tokens % cfg.block_size
        stream = TextStream(self._book, bytes(min(i, 255) for i in req.prompt_ids), req.seed)
        count = min(stream.natural_length, req.max_tokens)
        reason = "stop" if stream.natural_length <= req.max_tokens else "length"
        for i in range(count):
            if fail_at is not None and i >= fail_at:
                raise EngineFailureError("injected engine failure")
            if i:
                await asyncio.sleep(cfg.decode_ms_per_token * cfg.slow_factor / 1000)
            tok, text = stream.next_token()
            gen.completion_tokens += 1
            gen.held_tokens += 1
            self._totals[2] += 1
            self._recent.append(time.monotonic())
            gen.queue.put_nowait(TokenOut(tok, text, reason if i == count - 1 else None))
        self._totals[3] += 1
        gen.queue.put_nowait(Done(reason))

    def _take_fault(self) -> int | None:
        if self.faults.count <= 0:
            return None
        self.faults.count -= 1
        return self.faults.fail_after_tokens

    async def _acquire(self, gen: Generation) -> None:
        if len(self._running) < self.config.max_running and not self._waiting:
            self._running.append(gen)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (gen, fut)
        self._waiting.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if entry in self._waiting:
                self._waiting.remove(entry)
            elif gen in self._running:  # admitted just as it was cancelled: hand the slot on
                self._release(gen)
            raise

    def _release(self, gen: Generation) -> None:
        with contextlib.suppress(ValueError):
            self._running.remove(gen)
        while self._waiting and len(self._running) < self.config.max_running:
            nxt, fut = self._waiting.popleft()
            if not fut.done():
                self._running.append(nxt)
                fut.set_result(None)
