"""The synchronous engine: take requests, step the scheduler and model, turn sampled ids into chunks.

``EngineCore.step`` is the only method that touches the scheduler, block manager and tensors; it runs on
one thread (``engine.TorchEngine`` calls it through ``asyncio.to_thread``). ``submit`` and ``abort`` may
be called from another thread: they only queue work that the next ``step`` picks up.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence as Seq
from dataclasses import dataclass, field

import torch

from kvgate_core.kvcontract.events import KVEvent
from kvgate_core.kvcontract.hashing import root_hash
from workers.engine.detokenizer import Decoder, IncrementalDetokenizer
from workers.engine.model_runner import ModelRunner
from workers.engine.sampler import sample
from workers.engine.scheduler import ScheduledSeq, Scheduler
from workers.engine.sequence import Sequence
from workers.engine_api import FinishReason, GenerationChunk, GenerationRequest


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one step produced: a chunk per request that advanced, and the KV events it caused."""

    chunks: list[tuple[str, GenerationChunk]] = field(default_factory=list)
    events: list[KVEvent] = field(default_factory=list)


class EventBuffer:
    """Collects the block manager's KV events during a step (pass ``append`` as its ``on_event``)."""

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events: list[KVEvent] = []

    def append(self, event: KVEvent) -> None:
        self._events.append(event)

    def drain(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events


@dataclass(slots=True)
class _Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator


class EngineCore:
    """Scheduler + model runner + sampling + detokenization, stepped synchronously.

    Args:
        runner: the model and its KV cache.
        scheduler: the scheduler (owning the block manager, whose events go to ``on_event``).
        decoder: the tokenizer, for output text.
        events: where the scheduler's block manager puts its KV events.
        eos_token_ids: ids that end a sequence unless ``ignore_eos``.
        max_model_len: most tokens one sequence may hold.
        seed: seeds the generators of requests that bring no seed.
    """

    def __init__(
        self,
        runner: ModelRunner,
        scheduler: Scheduler,
        decoder: Decoder,
        events: EventBuffer,
        *,
        eos_token_ids: Seq[int],
        max_model_len: int,
        seed: int = 0,
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self._decoder = decoder
        self._eos = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self._seeds = random.Random(seed)
        self._incoming: deque[GenerationRequest] = deque()
        self._aborts: deque[str] = deque()
        self._requests: dict[str, _Request] = {}
        self._events = events
        self._calls: deque[Callable[[], None]] = deque()
        self.step_hooks: list[Callable[[StepResult], None]] = []
        """Called on the step thread with each step's result (the KV connector pushes from here)."""

    @property
    def has_work(self) -> bool:
        return bool(self._incoming or self._aborts or self._calls or self.scheduler.has_work)

    @property
    def num_pending(self) -> int:
        return len(self._incoming)

    def submit(self, request: GenerationRequest) -> None:
        """Queue a validated request for the next step."""
        self._incoming.append(request)

    def run_in_step(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the step thread at the start of the next step, before admissions."""
        self._calls.append(fn)

    def abort(self, request_id: str) -> None:
        """Drop a request at the next step and free its blocks."""
        self._aborts.append(request_id)

    def step(self) -> StepResult:
        """Admit and abort queued requests, run one batch, and return the chunks and events produced."""
        while self._calls:
            self._calls.popleft()()
        self._drain_queues()
        items = self.scheduler.schedule()
        chunks: list[tuple[str, GenerationChunk]] = []
        if items:
            tables = [self.scheduler.blocks.block_table(item.seq.seq_id) for item in items]
            logits = self.runner.run(items, tables)
            chunks = self._process(items, logits)
        result = StepResult(chunks, self._events.drain())
        for hook in self.step_hooks:
            hook(result)
        return result

    def abort_all(self) -> list[tuple[str, GenerationChunk]]:
        """Finish every request with ``abort`` (shutdown, or recovery after a failed step)."""
        self._incoming.clear()
        self._aborts.clear()
        out = []
        for request_id, req in list(self._requests.items()):
            self.scheduler.finish(req.seq, FinishReason.ABORT)
            out.append((request_id, self._chunk(req, (), final=True)))
        self._requests.clear()
        return out

    # -- internals -------------------------------------------------------------------------------------

    def _drain_queues(self) -> None:
        while self._incoming:
            self._add(self._incoming.popleft())
        while self._aborts:  # after admissions: an abort may target a request submitted just before it
            req = self._requests.pop(self._aborts.popleft(), None)
            if req is not None:
                self.scheduler.finish(req.seq, FinishReason.ABORT)

    def _add(self, request: GenerationRequest) -> None:
        params = request.sampling
        seq = Sequence(
            seq_id=request.request_id,
            token_ids=list(request.prompt_token_ids),
            num_prompt_tokens=len(request.prompt_token_ids),
            sampling=params,
            root=root_hash(request.model, request.extra_keys),
            block_size=self.scheduler.blocks.block_size,
        )
        seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
        detok = IncrementalDetokenizer(self._decoder, request.prompt_token_ids, params.stop)
        self._requests[request.request_id] = _Request(seq, detok, torch.Generator().manual_seed(seed))
        self.scheduler.add(seq)

    def _process(self, items: Seq[ScheduledSeq], logits: torch.Tensor) -> list[tuple[str, GenerationChunk]]:
        reqs = [self._requests[item.seq.seq_id] for item in items]
        params = [r.seq.sampling for r in reqs]
        tokens = sample(logits, params, [r.generator for r in reqs])
        chunks: list[tuple[str, GenerationChunk]] = []
        for item, req, token in zip(items, reqs, tokens, strict=True):
            self.scheduler.advance(item)
            if req.seq.num_uncomputed_tokens > 0:
                continue  # a prefill chunk that did not reach the end of the prompt
            req.seq.append_token(token)
            reason = self._finish_reason(req, token)
            if reason is not None:
                self.scheduler.finish(req.seq, reason)
                del self._requests[req.seq.seq_id]
            chunks.append((req.seq.seq_id, self._chunk(req, (token,), final=reason is not None)))
        return chunks

    def _finish_reason(self, req: _Request, token: int) -> FinishReason | None:
        seq, params = req.seq, req.seq.sampling
        if token in params.stop_token_ids or (token in self._eos and not params.ignore_eos):
            return FinishReason.STOP
        if req.detokenizer.add(token):
            return FinishReason.STOP
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _chunk(self, req: _Request, token_ids: tuple[int, ...], *, final: bool) -> GenerationChunk:
        seq = req.seq
        return GenerationChunk(
            token_ids=token_ids,
            text=req.detokenizer.take(final),
            finish_reason=seq.finish_reason if final else None,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            num_output_tokens=seq.num_output_tokens,
        )
