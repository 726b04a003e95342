"""The protocol every worker engine implements (the simulated one and the real torch one).

The HTTP server (``workers.server``) speaks OpenAI on one side and only this module on the other: it
tokenizes, builds a ``GenerationRequest``, iterates ``Engine.generate`` and formats chunks. Engines own
scheduling, the KV cache and KV events; they never see HTTP. ``EventHub`` is the shared fan-out that an
engine uses to implement ``Engine.subscribe`` with one bounded queue per subscriber.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Final, Protocol

import numpy as np
import numpy.typing as npt

from kvgate_core.kvcontract.events import KVEvent

if TYPE_CHECKING:
    from kvgate_core.tokenize.bundle import TokenizerBundle

DEFAULT_EVENT_QUEUE: Final = 65_536

#: ``[inputs, dimension]`` float32 rows, each of unit L2 norm (``Engine.embed``)
Embeddings = npt.NDArray[np.float32]


class FinishReason(StrEnum):
    STOP = "stop"  # EOS token, stop token id or stop string
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"  # cancelled (client disconnect) or engine shutdown


class EngineError(Exception):
    """Base of the errors an engine raises for a request (the server maps them to OpenAI errors)."""


class InvalidRequestError(EngineError):
    """The request's parameters are unacceptable (400 ``invalid_request_error``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextTooLongError(InvalidRequestError):
    """Prompt plus ``max_tokens`` exceed the model's context, or the prompt alone exceeds the KV pool."""


class EngineOverloadedError(EngineError):
    """The engine cannot accept more work now (503)."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens. ``top_k <= 0`` and ``top_p == 1`` disable those filters; temperature 0 = greedy."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be at least 1", "max_tokens")
        if self.temperature < 0:
            raise InvalidRequestError("temperature must be non-negative", "temperature")
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p must be in (0, 1]", "top_p")


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One sequence to generate.

    ``extra_keys`` (LoRA name, cache salt, tenant) are folded into the KV hash chain's root together with
    ``model`` (``kvgate_core.kvcontract.hashing.root_hash``), so prompts under different keys never share
    blocks. ``has_media``: the prompt holds media parts (rendered as identity markers,
    ``kvgate_core.kvcontract.media``); an engine without vision refuses it with ``InvalidRequestError``.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    model: str = ""
    extra_keys: tuple[str, ...] = ()
    has_media: bool = False


@dataclass(frozen=True, slots=True)
class GenerationChunk:
    """New output since the previous chunk of the same request.

    ``text`` is the detokenized delta (it may lag the tokens by a few ids while a multi-byte character is
    incomplete, and stop strings are already cut off). The last chunk has ``finish_reason`` set.
    ``num_prompt_tokens`` and ``num_cached_tokens`` (leading prompt tokens served from the prefix cache,
    a multiple of the block size) are the same on every chunk of a request.
    """

    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int


@dataclass(frozen=True, slots=True)
class LoadInfo:
    """What ``GET /load`` serves and a gateway's policies read."""

    running: int
    waiting: int
    kv_usage: float  # referenced blocks / all blocks, in [0, 1]
    num_cached_blocks: int  # blocks holding a registered prefix hash (referenced or not)
    num_total_blocks: int
    #: requests the engine runs at once (its batch slots); a gateway sizes its connections to the worker by
    #: it. 0: not known (left out of ``/load``).
    max_running: int = 0

    def to_dict(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {
            "running": self.running,
            "waiting": self.waiting,
            "kv_usage": self.kv_usage,
            "num_cached_blocks": self.num_cached_blocks,
            "num_total_blocks": self.num_total_blocks,
        }
        if self.max_running > 0:
            out["max_running"] = self.max_running
        return out


class GenerationStream(Protocol):
    """The chunks of one request, ending with the chunk that carries ``finish_reason``.

    ``aclose`` aborts the sequence (if not finished) and frees its blocks; it is idempotent and safe to call
    whether or not iteration began. Cancelling a task blocked in ``__anext__`` does not abort by itself: the
    consumer calls ``aclose`` in a ``finally`` (the server always does).
    """

    def __aiter__(self) -> GenerationStream: ...

    async def __anext__(self) -> GenerationChunk: ...

    async def aclose(self) -> None: ...


class Engine(Protocol):
    """A model behind a scheduler and a paged, prefix-cached KV store.

    All methods run on the server's single event loop. ``generate`` must never block the loop for long;
    CPU/GPU work goes to the engine's own step loop.
    """

    @property
    def model_id(self) -> str:
        """The served model name (``/v1/models``; the KV hash root)."""
        ...

    @property
    def worker_id(self) -> str:
        """The id stamped on this worker's KV events."""
        ...

    @property
    def block_size(self) -> int: ...

    @property
    def max_model_len(self) -> int:
        """Most tokens (prompt + output) one sequence may hold."""
        ...

    @property
    def bundle(self) -> TokenizerBundle:
        """The tokenizer, chat template and special tokens the engine's token ids belong to.

        The server renders and tokenizes with it and serves it on ``GET /tokenizer``.
        """
        ...

    def generate(self, request: GenerationRequest) -> GenerationStream:
        """Validate and queue a request; returns the stream of its output.

        Raises (synchronously, before anything is queued):
            InvalidRequestError: bad parameters.
            ContextTooLongError: the prompt plus ``max_tokens`` do not fit.
            EngineOverloadedError: the engine refuses new work now.
        """
        ...

    async def embed(self, inputs: Sequence[Sequence[int]]) -> Embeddings:
        """One L2-normalised embedding row per input (each a non-empty list of token ids).

        Runs outside the scheduler's batches and never touches the KV cache.

        Raises:
            InvalidRequestError: a token id outside the vocabulary, or an input longer than the context.
        """
        ...

    def load(self) -> LoadInfo: ...

    def cached_block_hashes(self) -> Mapping[str, Sequence[int]]:
        """Hashes of every block findable in the prefix cache, per tier name (``"gpu"``, ``"dram"``…)."""
        ...

    def subscribe(self) -> EventSubscription:
        """KV events from now on, through a bounded queue.

        Registered when called (not on first iteration). A subscriber that falls a full queue behind is
        dropped: its iterator ends, and it resyncs from ``cached_block_hashes``. ``aclose`` unsubscribes.
        Engines implement it with ``EventHub.subscribe``.
        """
        ...

    async def start(self) -> None:
        """Start background loops (called once, inside the server's event loop)."""
        ...

    async def stop(self) -> None:
        """Abort everything in flight and stop background loops."""
        ...


_CLOSED: Final = None


class EventSubscription:
    """One subscriber's bounded queue; an async iterator of events, registered from construction on."""

    __slots__ = ("_ended", "_hub", "_queue")

    def __init__(self, hub: EventHub, queue: asyncio.Queue[KVEvent | None]) -> None:
        self._hub = hub
        self._queue = queue
        self._ended = False

    def __aiter__(self) -> EventSubscription:
        return self

    async def __anext__(self) -> KVEvent:
        if self._ended:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None:
            self._ended = True
            raise StopAsyncIteration
        return event

    def drain(self) -> list[KVEvent]:
        """Events already queued, without waiting (lets a consumer batch its writes)."""
        out: list[KVEvent] = []
        queue = self._queue
        while not self._ended and not queue.empty():
            event = queue.get_nowait()
            if event is None:
                self._ended = True
            else:
                out.append(event)
        return out

    async def aclose(self) -> None:
        """Unsubscribe."""
        self._hub.discard(self._queue)


class EventHub:
    """Fan-out of KV events to subscribers, each with its own bounded queue.

    ``publish`` is synchronous and never blocks: the engine calls it from its step loop. A subscriber
    whose queue is full is dropped (its iterator ends) rather than slowing the engine.
    """

    __slots__ = ("_max_queue", "_queues")

    def __init__(self, max_queue: int = DEFAULT_EVENT_QUEUE) -> None:
        if max_queue < 2:
            raise ValueError("max_queue must be at least 2")
        self._max_queue = max_queue
        self._queues: set[asyncio.Queue[KVEvent | None]] = set()

    @property
    def num_subscribers(self) -> int:
        return len(self._queues)

    def publish(self, event: KVEvent) -> None:
        for queue in list(self._queues):
            if queue.qsize() >= self._max_queue - 1:
                # The last slot is kept for the end marker: the subscriber must resync from a snapshot.
                self._queues.discard(queue)
                queue.put_nowait(_CLOSED)
            else:
                queue.put_nowait(event)

    def close(self) -> None:
        """End every subscription (engine shutdown)."""
        for queue in self._queues:
            queue.put_nowait(_CLOSED)
        self._queues.clear()

    def subscribe(self) -> EventSubscription:
        """Register a subscriber now; events published from here on reach it."""
        queue: asyncio.Queue[KVEvent | None] = asyncio.Queue(self._max_queue)
        self._queues.add(queue)
        return EventSubscription(self, queue)

    def discard(self, queue: asyncio.Queue[KVEvent | None]) -> None:
        self._queues.discard(queue)
