"""``SimEngine``: the ``Engine`` protocol over ``SimScheduler``, stepped by one asyncio loop.

One background task steps every sequence; each request's stream only waits on its own queue of
chunks, so thousands of concurrent streams cost one wake-up per chunk each and no task per token.

With a shared tier (``workers.sim.tier.SimTier``, from ``--kv-tier``): a request is held until the tier
said how many of its leading blocks it holds (one Redis round trip), then queued; when its prefill ends,
the prompt's full blocks the tier lacked are pushed and published as ``stored`` events with
``tier=dram``. A request's last chunk is delivered only after that push is acknowledged, so a PD prefill
request (``max_tokens: 1``) answers once its blocks are findable by the decode worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from kvgate_core.kvcontract.events import EventType, KVEvent, Tier
from kvgate_core.kvcontract.hashing import DEFAULT_BLOCK_SIZE
from kvgate_core.tokenize.bundle import TokenizerBundle
from workers.engine.block_manager import BlockManager
from workers.engine_api import (
    ContextTooLongError,
    Embeddings,
    EventHub,
    EventSubscription,
    GenerationChunk,
    GenerationRequest,
    InvalidRequestError,
    LoadInfo,
)
from workers.sim.embedding import SIM_EMBEDDING_DIM, sim_embeddings
from workers.sim.scheduler import SimScheduler, SimSequence, SimTiming
from workers.sim.text import WordBook
from workers.sim.tier import SimTier

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
    embedding_dim: int = SIM_EMBEDDING_DIM

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
        tier: the shared KV tier (None: none).
    """

    def __init__(
        self,
        config: SimConfig,
        bundle: TokenizerBundle,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        tier: SimTier | None = None,
    ) -> None:
        self._config = config
        self._wall_clock = wall_clock
        self._tier = tier
        self._tasks: set[asyncio.Task[None]] = set()
        self._pushes: dict[str, asyncio.Task[None]] = {}
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
        self._scheduler = SimScheduler(
            blocks,
            config.timing,
            book,
            config.model,
            pull_cost=tier.cost if tier is not None else None,
            on_prefilled=self._push if tier is not None else None,
        )
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
        seq = self._scheduler.submit(request, queue.put_nowait, hold=self._tier is not None)
        if self._tier is not None:
            self._spawn(self._lookup(self._tier, seq))
        else:
            self._wake.set()
        return SimStream(self._scheduler, seq, queue, self._wake, self._pushes)

    async def embed(self, inputs: Sequence[Sequence[int]]) -> Embeddings:
        """Deterministic bag-of-tokens vectors (``workers.sim.embedding``); no time is simulated."""
        limit = self.max_model_len
        for i, ids in enumerate(inputs):
            if len(ids) > limit:
                raise ContextTooLongError(
                    f"input[{i}] has {len(ids)} tokens; this model's maximum context length is {limit}",
                    "input",
                )
        try:
            return sim_embeddings(inputs, self._config.embedding_dim)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), "input") from None

    def _spawn(self, coro: Coroutine[None, None, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _lookup(self, tier: SimTier, seq: SimSequence) -> None:
        self._scheduler.release(seq, await tier.prefix(seq.hashes))
        self._wake.set()

    def _push(self, seq: SimSequence) -> None:
        """Push the prompt blocks the tier lacked (called by the scheduler when the prompt's KV is done)."""
        new = seq.hashes[seq.tier_blocks :]
        if new and self._tier is not None:
            self._pushes[seq.seq_id] = self._spawn(self._push_blocks(self._tier, tuple(new)))

    async def _push_blocks(self, tier: SimTier, hashes: tuple[int, ...]) -> None:
        if await tier.push(hashes):
            self._hub.publish(
                KVEvent(self._config.worker_id, EventType.STORED, Tier.DRAM, hashes, self._wall_clock())
            )

    def load(self) -> LoadInfo:
        s = self._scheduler
        return LoadInfo(
            running=s.num_running,
            waiting=s.num_waiting,
            kv_usage=s.blocks.usage,
            num_cached_blocks=s.blocks.num_cached_blocks,
            num_total_blocks=s.blocks.num_total_blocks,
            max_running=self._config.timing.max_running,
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
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._hub.close()
        if self._tier is not None:
            await self._tier.aclose()

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

    __slots__ = ("_finished", "_pushes", "_queue", "_scheduler", "_seq", "_wake")

    def __init__(
        self,
        scheduler: SimScheduler,
        seq: SimSequence,
        queue: asyncio.Queue[GenerationChunk],
        wake: asyncio.Event,
        pushes: dict[str, asyncio.Task[None]] | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._seq = seq
        self._queue = queue
        self._wake = wake
        self._pushes = pushes
        self._finished = False

    def __aiter__(self) -> SimStream:
        return self

    async def __anext__(self) -> GenerationChunk:
        if self._finished:
            raise StopAsyncIteration
        chunk = await self._queue.get()
        if chunk.finish_reason is not None:
            self._finished = True
            push = self._pushes.pop(self._seq.seq_id, None) if self._pushes is not None else None
            if push is not None:
                await asyncio.wait((push,))  # the answer means "your KV is in the tier"
        return chunk

    async def aclose(self) -> None:
        self._finished = True
        if self._pushes is not None:
            self._pushes.pop(self._seq.seq_id, None)
        if not self._seq.is_done:
            self._scheduler.abort(self._seq)
            self._wake.set()
