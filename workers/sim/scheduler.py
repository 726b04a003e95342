"""The simulated worker's scheduler: admission, a prefix-cached KV pool and a timing model, with no I/O.

Time is passed in (``now``), so the accounting can be tested with a fake clock; ``SimEngine`` drives it
from one asyncio loop. The model, per step:

* Admission is FIFO into ``max_running`` batch slots. A sequence is admitted only when the KV pool can hold
  its prompt and its whole output (blocks are reserved on admission instead of preempting later).
* Prefill is one FIFO server of ``prefill_tps`` uncached prompt tokens per second shared by all requests
  (batched prefill keeps the aggregate rate); cached leading blocks cost nothing. The first token comes out
  when a sequence's prefill ends. A prompt's full blocks enter the prefix cache on admission.
* Tier pulls (with a ``SimTier``): leading blocks missing locally but present in the shared tier are
  pulled when ``workers.kvtier.planner.plan_pull`` says pulling beats recomputing; the pull overlaps the
  wait for the prefill server and counts as cached tokens. ``on_prefilled`` is told when a prompt's KV is
  complete (the engine pushes its blocks then).
* Decode gives every running sequence ``decode_tps`` tokens per second, independent of the batch size.
  A late step emits all tokens that fell due, so the rate holds under load.
"""

from __future__ import annotations

import array
import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from kvgate_core.kvcontract.hashing import chain_hashes, root_hash
from workers.engine.block_manager import BlockManager
from workers.engine_api import ContextTooLongError, FinishReason, GenerationChunk, GenerationRequest
from workers.kvtier.planner import PullRates, PullRequest, plan_pull
from workers.sim.text import TextStream, WordBook

if TYPE_CHECKING:
    from workers.sim.tier import PullCost

Deliver = Callable[[GenerationChunk], None]


@dataclass(frozen=True, slots=True)
class SimTiming:
    """The timing model's rates and limits."""

    prefill_tps: float = 20_000.0
    decode_tps: float = 50.0
    max_running: int = 256
    max_model_len: int = 32_768

    def __post_init__(self) -> None:
        if self.prefill_tps <= 0 or self.decode_tps <= 0 or self.max_running < 1 or self.max_model_len < 2:
            raise ValueError(
                "prefill_tps and decode_tps must be positive, max_running and max_model_len >= 1"
            )


class _Phase(Enum):
    WAITING = 0
    PREFILL = 1
    DECODE = 2
    DONE = 3


class SimSequence:
    """One request inside the simulator."""

    __slots__ = (
        "deliver",
        "hashes",
        "num_cached_tokens",
        "num_output",
        "phase",
        "request",
        "reserved",
        "root",
        "seq_id",
        "stops",
        "target",
        "target_reason",
        "text",
        "text_held",
        "tier_blocks",
        "tokens",
    )

    def __init__(
        self, seq_id: str, request: GenerationRequest, root: int, text: TextStream, deliver: Deliver
    ):
        self.seq_id = seq_id
        self.root = root
        self.request = request
        self.hashes: list[int] = []
        self.text = text
        self.deliver = deliver
        self.tokens = list(request.prompt_token_ids)
        self.phase = _Phase.WAITING
        self.num_cached_tokens = 0
        self.tier_blocks = 0  # leading prompt blocks the shared tier held when the request arrived
        self.num_output = 0
        self.reserved = 0
        sampling = request.sampling
        natural = sampling.max_tokens if sampling.ignore_eos else text.natural_length
        self.target = min(sampling.max_tokens, natural)
        self.target_reason = FinishReason.LENGTH if self.target == sampling.max_tokens else FinishReason.STOP
        self.stops = sampling.stop
        self.text_held = ""  # output text not yet delivered (held back while it may begin a stop string)

    @property
    def is_done(self) -> bool:
        return self.phase is _Phase.DONE


class SimScheduler:
    """Admission, KV accounting and timing for simulated sequences.

    Args:
        blocks: the KV block pool.
        timing: rates and limits.
        book: the output vocabulary.
        model: the model id (hash root).
        pull_cost: the shared tier's modelled pull cost (None: no tier).
        on_prefilled: called when a sequence's prompt KV is complete.
    """

    def __init__(
        self,
        blocks: BlockManager,
        timing: SimTiming,
        book: WordBook,
        model: str,
        *,
        pull_cost: PullCost | None = None,
        on_prefilled: Callable[[SimSequence], None] | None = None,
    ) -> None:
        self.blocks = blocks
        self._pull_cost = pull_cost
        self._on_prefilled = on_prefilled
        self.timing = timing
        self._book = book
        self._model = model
        self._waiting: deque[SimSequence] = deque()
        self._num_waiting = 0
        self._num_running = 0
        self._reserved = 0  # free blocks promised to running sequences' future output
        self._prefill_free_at = 0.0
        self._events: list[tuple[float, int, SimSequence]] = []
        self._counter = itertools.count()
        self._live: dict[str, SimSequence] = {}

    @property
    def num_running(self) -> int:
        return self._num_running

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    def submit(self, request: GenerationRequest, deliver: Deliver, *, hold: bool = False) -> SimSequence:
        """Validate and queue a request (``hold``: count it as waiting, admit it only after ``release``).

        Raises:
            ContextTooLongError: prompt plus output exceed the context or the whole KV pool.
        """
        n = len(request.prompt_token_ids)
        if n == 0:
            raise ContextTooLongError("the prompt is empty", "prompt")
        total = n + request.sampling.max_tokens
        if total > self.timing.max_model_len:
            raise ContextTooLongError(
                f"this model's maximum context length is {self.timing.max_model_len} tokens; the request "
                f"asks for {total} ({n} in the prompt, {request.sampling.max_tokens} to generate)",
                "max_tokens",
            )
        root = root_hash(request.model or self._model, request.extra_keys)
        # One uint32 copy of the prompt serves both the hash chain and the output's key.
        tokens = np.frombuffer(array.array("I", request.prompt_token_ids), dtype=np.uint32).astype(
            "<u4", copy=False
        )
        text = TextStream(self._book, tokens.tobytes(), request.sampling.seed)
        seq = SimSequence(f"sim-{next(self._counter)}", request, root, text, deliver)
        seq.hashes = chain_hashes(tokens, root, self.blocks.block_size)
        if self.blocks.blocks_for(n + seq.target) > self.blocks.num_total_blocks:
            raise ContextTooLongError(f"the request needs more KV than this worker holds ({total} tokens)")
        if not hold:
            self._waiting.append(seq)
        self._num_waiting += 1
        self._live[seq.seq_id] = seq
        return seq

    def release(self, seq: SimSequence, tier_blocks: int) -> None:
        """Queue a held sequence, knowing that the tier holds its first ``tier_blocks`` blocks."""
        if not seq.is_done:
            seq.tier_blocks = tier_blocks
            self._waiting.append(seq)

    def abort(self, seq: SimSequence) -> None:
        """Drop a sequence wherever it is; its blocks are freed (cached ones stay findable)."""
        if seq.phase is _Phase.WAITING:
            self._num_waiting -= 1  # removed lazily from the deque
        elif seq.phase is not _Phase.DONE:
            self._release(seq)
        seq.phase = _Phase.DONE
        self._live.pop(seq.seq_id, None)

    def abort_all(self) -> None:
        """Abort every live sequence, delivering a final ``abort`` chunk to each (engine shutdown)."""
        for seq in list(self._live.values()):
            self.abort(seq)
            prompt_len = len(seq.request.prompt_token_ids)
            seq.deliver(
                GenerationChunk((), "", FinishReason.ABORT, prompt_len, seq.num_cached_tokens, seq.num_output)
            )

    def step(self, now: float) -> float | None:
        """Advance to ``now``: deliver due tokens, finish sequences, admit waiting ones.

        Returns:
            When the next token or prefill completion falls due, or None when idle.
        """
        events = self._events
        while events and events[0][0] <= now:
            due, _, seq = heapq.heappop(events)
            if seq.phase is _Phase.PREFILL:
                self._finish_prefill(seq, due, now)
            elif seq.phase is _Phase.DECODE:
                self._decode(seq, due, now)
        self._admit(now)
        while events and events[0][2].is_done:
            heapq.heappop(events)
        return events[0][0] if events else None

    # -- admission and prefill ---------------------------------------------------------------------------

    def _admit(self, now: float) -> None:
        blocks, waiting = self.blocks, self._waiting
        while waiting and self._num_running < self.timing.max_running:
            seq = waiting[0]
            if seq.is_done:
                waiting.popleft()
                continue
            n = len(seq.tokens)
            growth = blocks.blocks_for(n + seq.target) - blocks.blocks_for(n)
            if blocks.blocks_needed(n, seq.hashes) + growth > blocks.num_free_blocks - self._reserved:
                return  # head-of-line: wait for running sequences to free blocks
            waiting.popleft()
            self._num_waiting -= 1
            self._num_running += 1
            seq.reserved = growth
            self._reserved += growth
            hit = blocks.allocate(seq.seq_id, n, seq.hashes, seq.root)
            # Cached (and ``stored``) when scheduled, as vLLM does: a later request that hits these blocks
            # finishes its own prefill after this one, since the prefill server is FIFO.
            blocks.commit(seq.seq_id, seq.tokens)
            pulled, pull_s = self._plan_pull(seq, hit)
            seq.num_cached_tokens = (hit + pulled) * blocks.block_size
            start = max(now, self._prefill_free_at)
            self._prefill_free_at = start + (n - seq.num_cached_tokens) / self.timing.prefill_tps
            seq.phase = _Phase.PREFILL
            due = max(self._prefill_free_at, now + pull_s)  # the pull overlaps the wait for the server
            heapq.heappush(self._events, (due, next(self._counter), seq))

    def _plan_pull(self, seq: SimSequence, local_hit: int) -> tuple[int, float]:
        """(blocks pulled from the tier after the local hit, seconds the pull takes)."""
        cost = self._pull_cost
        if cost is None or seq.tier_blocks <= local_hit:
            return 0, 0.0
        bs = self.blocks.block_size
        req = PullRequest(len(seq.tokens), bs, local_hit, seq.tier_blocks - local_hit, cost.block_bytes)
        plan = plan_pull(req, PullRates(cost.bytes_per_s, cost.latency_s, self.timing.prefill_tps))
        return plan.num_blocks, cost.seconds(plan.num_blocks)

    def _finish_prefill(self, seq: SimSequence, due: float, now: float) -> None:
        self.blocks.commit(seq.seq_id, seq.tokens)
        seq.phase = _Phase.DECODE
        if self._on_prefilled is not None:
            self._on_prefilled(seq)
        self._emit(seq, 1)
        if not seq.is_done:
            self._schedule_decode(seq, due, now)

    # -- decode ------------------------------------------------------------------------------------------

    def _decode(self, seq: SimSequence, due: float, now: float) -> None:
        self._emit(seq, 1 + int((now - due) * self.timing.decode_tps))
        if not seq.is_done:
            self._schedule_decode(seq, due, now)

    def _schedule_decode(self, seq: SimSequence, due: float, now: float) -> None:
        interval = 1.0 / self.timing.decode_tps
        behind = max(0, int((now - due) * self.timing.decode_tps))
        heapq.heappush(self._events, (due + (behind + 1) * interval, next(self._counter), seq))

    def _emit(self, seq: SimSequence, count: int) -> None:
        """Generate up to ``count`` tokens and deliver them as one chunk."""
        ids, text = self._next_tokens(seq, min(count, seq.target - seq.num_output))
        finish = seq.target_reason if seq.num_output >= seq.target else None
        delta, stopped = self._apply_stops(seq, text, final=finish is not None)
        if stopped:
            finish = FinishReason.STOP
        prompt_len = len(seq.request.prompt_token_ids)
        seq.deliver(
            GenerationChunk(tuple(ids), delta, finish, prompt_len, seq.num_cached_tokens, seq.num_output)
        )
        if finish is not None:
            self._release(seq)
            seq.phase = _Phase.DONE
            del self._live[seq.seq_id]

    def _next_tokens(self, seq: SimSequence, count: int) -> tuple[list[int], str]:
        """Append ``count`` output tokens, growing (from the reservation) and committing KV blocks."""
        blocks, seq_id, block_size = self.blocks, seq.seq_id, self.blocks.block_size
        ids: list[int] = []
        texts: list[str] = []
        for _ in range(count):
            token, text = seq.text.next_token()
            seq.tokens.append(token)
            ids.append(token)
            texts.append(text)
            if (len(seq.tokens) - 1) % block_size == 0:  # the new token opens a block
                if not blocks.append_slots(seq_id, len(seq.tokens)):
                    raise AssertionError("a reserved block was missing: reservation accounting is broken")
                seq.reserved -= 1
                self._reserved -= 1
                # The newest token's KV is computed on the next step; the full block before it is done.
                blocks.commit(seq_id, seq.tokens[:-1])
        seq.num_output += count
        return ids, "".join(texts)

    @staticmethod
    def _apply_stops(seq: SimSequence, new_text: str, *, final: bool) -> tuple[str, bool]:
        """(text to deliver now, whether a stop string ended the output)."""
        if not seq.stops:
            return new_text, False
        held = seq.text_held + new_text
        cut = min((i for i in (held.find(s) for s in seq.stops) if i >= 0), default=-1)
        if cut >= 0:
            seq.text_held = ""
            return held[:cut], True
        keep = 0 if final else max(len(s) for s in seq.stops) - 1
        seq.text_held = held[len(held) - keep :] if keep else ""
        return held[: len(held) - keep], False

    def _release(self, seq: SimSequence) -> None:
        self.blocks.free(seq.seq_id)
        self._reserved -= seq.reserved
        seq.reserved = 0
        self._num_running -= 1
