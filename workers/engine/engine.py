"""``TorchEngine``: the ``Engine`` protocol over ``EngineCore``, stepped by one asyncio task.

The step (model forward, sampling) runs in a worker thread through ``asyncio.to_thread`` so the HTTP
loop keeps serving while the CPU or GPU computes; everything else (queues, events, the cached-hash
snapshot) stays on the event loop. Each request's ``generate`` waits only on its own queue of chunks.

With a ``KVConnector`` (a shared tier), a request first pulls the prefix blocks the tier holds and only
then reaches the scheduler; a one-token request (a PD prefill) answers once its blocks are in the tier.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvgate_core.kvcontract.events import EventType
from kvgate_core.tokenize.bundle import TokenizerBundle
from workers.engine.core import EngineCore, StepResult
from workers.engine.embedding import pooled_embeddings
from workers.engine.kv_connector import KVConnector
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

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineIdentity:
    """What the engine serves: the model id (KV hash root), the worker id on its events, the vocab size."""

    model_id: str
    worker_id: str
    vocab_size: int


class TorchEngine:
    """A real model behind continuous batching and a prefix-cached paged KV cache.

    Args:
        core: the synchronous engine (model runner, scheduler, block manager).
        bundle: the tokenizer and chat template the served token ids belong to.
        identity: model id, worker id and vocabulary size.
        connector: the shared KV tier's connector (None: no tier).
    """

    def __init__(
        self,
        core: EngineCore,
        bundle: TokenizerBundle,
        identity: EngineIdentity,
        connector: KVConnector | None = None,
    ) -> None:
        self._core = core
        self._connector = connector
        self._pulls: set[asyncio.Task[None]] = set()
        self._bundle = bundle
        self._identity = identity
        self._hub = EventHub()
        self._cached: dict[int, None] = {}
        self._queues: dict[str, asyncio.Queue[GenerationChunk]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # Serializes the step thread with embedding forwards: one model computation at a time.
        self._model_lock = threading.Lock()

    @property
    def model_id(self) -> str:
        return self._identity.model_id

    @property
    def worker_id(self) -> str:
        return self._identity.worker_id

    @property
    def block_size(self) -> int:
        return self._core.scheduler.blocks.block_size

    @property
    def max_model_len(self) -> int:
        return self._core.max_model_len

    @property
    def bundle(self) -> TokenizerBundle:
        return self._bundle

    @property
    def core(self) -> EngineCore:
        return self._core

    @property
    def connector(self) -> KVConnector | None:
        """The shared KV tier's connector, if one is configured."""
        return self._connector

    def generate(self, request: GenerationRequest) -> TorchStream:
        """Validate and queue ``request`` (raises at once on bad input); returns its chunk stream."""
        self._validate(request)
        queue: asyncio.Queue[GenerationChunk] = asyncio.Queue()
        self._queues[request.request_id] = queue
        if self._connector is None:
            self._core.submit(request)
            self._wake.set()
            return TorchStream(self, request.request_id, queue)
        task = asyncio.get_running_loop().create_task(self._pull_then_submit(self._connector, request))
        self._pulls.add(task)
        task.add_done_callback(self._pulls.discard)
        durable = self._connector if request.sampling.max_tokens == 1 else None
        return TorchStream(self, request.request_id, queue, durable)

    async def _pull_then_submit(self, connector: KVConnector, request: GenerationRequest) -> None:
        try:
            await connector.pull(request)
        except Exception:  # a failed pull is a miss: compute the prompt
            logger.exception("KV tier pull failed for %s", request.request_id)
        if request.request_id in self._queues:  # not aborted meanwhile
            self._core.submit(request)
            self._wake.set()

    async def embed(self, inputs: Sequence[Sequence[int]]) -> Embeddings:
        """Mean-pooled final hidden states (``workers.engine.embedding``), computed between steps."""
        vocab, limit = self._identity.vocab_size, self.max_model_len
        for i, ids in enumerate(inputs):
            if not ids or min(ids) < 0 or max(ids) >= vocab:
                raise InvalidRequestError(
                    f"input[{i}]: token ids must be in [0, {vocab}) and not empty", "input"
                )
            if len(ids) > limit:
                raise ContextTooLongError(
                    f"input[{i}] has {len(ids)} tokens; this model's maximum context length is {limit}",
                    "input",
                )
        return await asyncio.to_thread(self._embed_locked, inputs)

    def _embed_locked(self, inputs: Sequence[Sequence[int]]) -> Embeddings:
        with self._model_lock:
            return pooled_embeddings(self._core.runner.model, inputs, block_size=self.block_size)

    def _step_locked(self) -> StepResult:
        with self._model_lock:
            return self._core.step()

    def abort(self, request_id: str) -> None:
        """Abort a request in flight (its stream ends without a final chunk); no-op once it finished."""
        if self._queues.pop(request_id, None) is not None:
            self._core.abort(request_id)
            self._wake.set()

    def load(self) -> LoadInfo:
        sched = self._core.scheduler
        blocks = sched.blocks
        return LoadInfo(
            running=len(sched.running),
            waiting=len(sched.waiting) + self._core.num_pending + len(self._pulls),
            kv_usage=blocks.usage,
            num_cached_blocks=len(self._cached),
            num_total_blocks=blocks.num_total_blocks,
            max_running=sched.config.max_num_seqs,
        )

    def cached_block_hashes(self) -> Mapping[str, Sequence[int]]:
        return {"gpu": list(self._cached)}

    def subscribe(self) -> EventSubscription:
        return self._hub.subscribe()

    async def start(self) -> None:
        if self._connector is not None:
            await self._connector.start(self._hub.publish)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kvgate-engine-loop")

    async def stop(self) -> None:
        if self._task is not None:
            # Let a step running in its thread finish: the core must not be touched from two threads.
            self._stopping = True
            self._wake.set()
            await self._task
            self._task = None
        for task in list(self._pulls):
            task.cancel()
        await asyncio.gather(*self._pulls, return_exceptions=True)
        self._deliver(StepResult(chunks=self._core.abort_all()))
        if self._connector is not None:
            await self._connector.aclose()
        self._hub.close()

    # -- internals -------------------------------------------------------------------------------------

    def _validate(self, request: GenerationRequest) -> None:
        prompt = request.prompt_token_ids
        if request.has_media:
            raise InvalidRequestError(
                f"the model '{self.model_id}' accepts text only: remove the image, audio and file parts",
                "messages",
            )
        if not prompt:
            raise InvalidRequestError("the prompt must contain at least one token", "prompt")
        if request.request_id in self._queues:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in flight")
        vocab = self._identity.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})", "prompt")
        limit = self.max_model_len
        if len(prompt) + request.sampling.max_tokens > limit:
            raise ContextTooLongError(
                f"this model's maximum context length is {limit} tokens; the prompt has {len(prompt)} "
                f"and max_tokens is {request.sampling.max_tokens}: shorten the prompt or lower max_tokens",
                "max_tokens",
            )

    async def _run(self) -> None:
        while not self._stopping:
            if not self._core.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                result = await asyncio.to_thread(self._step_locked)
            except Exception:  # a failed step must not take the worker down: abort what was in flight
                logger.exception("engine step failed; aborting %d requests", len(self._queues))
                result = StepResult(chunks=self._core.abort_all())
            self._deliver(result)

    def _deliver(self, result: StepResult) -> None:
        for event in result.events:
            if event.type is EventType.STORED:
                self._cached.update(dict.fromkeys(event.hashes))
            elif event.type is EventType.REMOVED:
                for h in event.hashes:
                    self._cached.pop(h, None)
            self._hub.publish(event)
        for request_id, chunk in result.chunks:
            queue = self._queues.get(request_id)
            if queue is not None:
                queue.put_nowait(chunk)
                if chunk.finish_reason is not None:
                    del self._queues[request_id]


class TorchStream:
    """One request's chunks; ``aclose`` aborts the sequence (freeing its blocks) unless it finished."""

    __slots__ = ("_durable", "_engine", "_finished", "_queue", "_request_id")

    def __init__(
        self,
        engine: TorchEngine,
        request_id: str,
        queue: asyncio.Queue[GenerationChunk],
        durable: KVConnector | None = None,
    ) -> None:
        self._engine = engine
        self._request_id = request_id
        self._queue = queue
        self._durable = durable  # settle its pushes before the last chunk (a PD prefill answer)
        self._finished = False

    def __aiter__(self) -> TorchStream:
        return self

    async def __anext__(self) -> GenerationChunk:
        if self._finished:
            raise StopAsyncIteration
        chunk = await self._queue.get()
        if chunk.finish_reason is not None:
            self._finished = True
            if self._durable is not None:
                await self._durable.settle()
        return chunk

    async def aclose(self) -> None:
        if not self._finished:
            self._finished = True
            self._engine.abort(self._request_id)
