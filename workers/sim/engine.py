"""``SimEngine``: the ``Engine`` protocol over ``SimScheduler``, stepped by one asyncio loop.

One background task steps every sequence; each request's stream only waits on its own queue of
chunks, so thousands of concurrent streams cost one wake-up per chunk each and no task per token.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gateway.kvcontract.events import KVEvent
from gateway.kvcontract.hashing import DEFAULT_BLOCK_SIZE
from gateway.tokenize.bundle import TokenizerBundle
from workers.engine.block_manager import BlockManager
from workers.engine_api import EventHub, EventSubscription, GenerationChunk, GenerationRequest, LoadInfo
from workers.sim.scheduler import SimScheduler, SimSequence, SimTiming
from workers.sim.text import WordBook

DEFAULT_MODEL: Final = "kvgate-sim"


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What a simulated worker serves and how fast.

    ``min_step_s`` is the shortest pause between scheduler steps: tokens falling due within it are emitted
    together, which bounds the loop's wake-ups under heavy load without changing the rates.
    """

    model: str = DEFAULT_MODEL
    worker_id: str = "sim"
    block_size: int = DEFAULT_BLOCK_SIZE
    kv_tokens: int = 1_048_576
    timing: SimTiming = field(default_factory=SimTiming)
    min_step_s: float = 0.001

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.kv_tokens < self.block_size:
            raise ValueError("block_size must be positive and kv_tokens at least one block")


class SimEngine:
    """A simulated engine with faithful prefix-cache accounting (see ``workers.sim.scheduler``).

    Args:
        config: model name, KV pool and timing.
        bundle: the served tokenizer and template (output words are encoded with its tokenizer).
        clock: monotonic seconds for the timing model.
        wall_clock: epoch seconds for KV event timestamps.
    """

    def __init__(
        self,
        config: SimConfig,
        bundle: TokenizerBundle,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._bundle = bundle
        self._clock = clock
        self._hub = EventHub()
        blocks = BlockManager(
            config.kv_tokens // config.block_size,
            config.block_size,
            on_event=self._hub.publish,
            worker_id=config.worker_id,
            clock=wall_clock,
        )
        book = WordBook(bundle.tokenizer.encode, bundle.tokenizer.decode)
        self._scheduler = SimScheduler(blocks, config.timing, book, config.model)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def model_id(self) -> str:
        return self._config.model

    @property
    def worker_id(self) -> str:
        return self._config.worker_id

    @property
    def block_size(self) -> int:
        return self._config.block_size

    @property
    def max_model_len(self) -> int:
        return self._config.timing.max_model_len

    @property
    def bundle(self) -> TokenizerBundle:
        return self._bundle

    def generate(self, request: GenerationRequest) -> SimStream:
        """Queue a request (raises ``ContextTooLongError`` at once) and return its chunk stream."""
        queue: asyncio.Queue[GenerationChunk] = asyncio.Queue()
        seq = self._scheduler.submit(request, queue.put_nowait)
        self._wake.set()
        return SimStream(self._scheduler, seq, queue, self._wake)

    def load(self) -> LoadInfo:
        s = self._scheduler
        return LoadInfo(
            running=s.num_running,
            waiting=s.num_waiting,
            kv_usage=s.blocks.usage,
            num_cached_blocks=s.blocks.num_cached_blocks,
            num_total_blocks=s.blocks.num_total_blocks,
        )

    def cached_block_hashes(self) -> Mapping[str, Sequence[int]]:
        return {"gpu": self._scheduler.blocks.cached_hashes()}

    def subscribe(self) -> EventSubscription:
        return self._hub.subscribe()

    def publish(self, event: KVEvent) -> None:
        """Publish an event of another origin (a tier client) to this engine's subscribers."""
        self._hub.publish(event)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="sim-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._scheduler.abort_all()
        self._hub.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        wake, clock, min_step = self._wake, self._clock, self._config.min_step_s
        while True:
            wake.clear()
            due = self._scheduler.step(clock())
            if due is None:
                await wake.wait()
                continue
            handle = loop.call_later(max(due - clock(), min_step), wake.set)
            await wake.wait()
            handle.cancel()


class SimStream:
    """One request's chunks; ``aclose`` aborts the sequence unless it finished."""

    __slots__ = ("_finished", "_queue", "_scheduler", "_seq", "_wake")

    def __init__(
        self,
        scheduler: SimScheduler,
        seq: SimSequence,
        queue: asyncio.Queue[GenerationChunk],
        wake: asyncio.Event,
    ) -> None:
        self._scheduler = scheduler
        self._seq = seq
        self._queue = queue
        self._wake = wake
        self._finished = False

    def __aiter__(self) -> SimStream:
        return self

    async def __anext__(self) -> GenerationChunk:
        if self._finished:
            raise StopAsyncIteration
        chunk = await self._queue.get()
        if chunk.finish_reason is not None:
            self._finished = True
        return chunk

    async def aclose(self) -> None:
        self._finished = True
        if not self._seq.is_done:
            self._scheduler.abort(self._seq)
            self._wake.set()
