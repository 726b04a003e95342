"""Continuous batching with chunked prefill and recompute preemption; pure Python, no torch.

Every step gets a token budget. Sequences that are decoding go first (one token each), then running
sequences still in prefill (a chunk each), then waiting ones are admitted in arrival order while blocks
and budget last. A long prompt is therefore prefilled a chunk per step beside the decodes instead of
stalling them. When a running sequence needs a block and none is free, the most recently admitted
sequence is preempted: its blocks are freed (its full blocks stay in the prefix cache) and it goes back
to the front of the queue, to be recomputed later.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from workers.engine.block_manager import BlockManager
from workers.engine.sequence import Sequence, SequenceStatus
from workers.engine_api import FinishReason


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Step limits: tokens computed per step (the prefill chunk) and sequences running at once."""

    max_num_batched_tokens: int = 512
    max_num_seqs: int = 32

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be positive")


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """A sequence and how many of its uncomputed tokens this step computes."""

    seq: Sequence
    num_new_tokens: int


class Scheduler:
    """Decides each step's batch; owns the waiting queue, the running list and the block manager's use.

    Not thread safe: one thread (the engine's step loop) calls every method.
    """

    def __init__(self, blocks: BlockManager, config: SchedulerConfig) -> None:
        self.blocks = blocks
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def schedule(self) -> list[ScheduledSeq]:
        """This step's batch (empty when there is nothing to do)."""
        budget = self.config.max_num_batched_tokens
        preemptions_before = self.num_preemptions
        batch: list[ScheduledSeq] = []
        decoding = [s for s in self.running if s.num_uncomputed_tokens == 1]
        prefilling = [s for s in self.running if s.num_uncomputed_tokens > 1]
        for seq in decoding + prefilling:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self._reserve(seq, seq.num_computed_tokens + num_new):
                continue
            batch.append(ScheduledSeq(seq, num_new))
            budget -= num_new
        if self.num_preemptions == preemptions_before:
            self._admit(batch, budget)  # no admissions in a step that had to preempt
        return [item for item in batch if item.seq.status is SequenceStatus.RUNNING]

    def advance(self, item: ScheduledSeq) -> None:
        """Record that ``item``'s tokens now have KV; register the blocks they completed."""
        seq = item.seq
        before = seq.num_computed_tokens
        seq.num_computed_tokens += item.num_new_tokens
        if seq.num_computed_tokens // seq.block_size > before // seq.block_size:
            self.blocks.commit(seq.seq_id, seq.token_ids[: seq.num_computed_tokens])

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Remove a finished or aborted sequence and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.blocks.free(seq.seq_id)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    # -- internals -------------------------------------------------------------------------------------

    def _reserve(self, seq: Sequence, num_tokens: int) -> bool:
        """Blocks for ``num_tokens`` tokens of a running ``seq``, preempting newer sequences if needed."""
        while not self.blocks.append_slots(seq.seq_id, num_tokens):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq.seq_id)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _admit(self, batch: list[ScheduledSeq], budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if not self.blocks.can_allocate(seq.num_tokens, seq.block_hashes):
                break
            num_hit = self.blocks.allocate(seq.seq_id, seq.num_tokens, seq.block_hashes, seq.root)
            self.waiting.popleft()
            seq.num_computed_tokens = num_hit * seq.block_size
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = seq.num_computed_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            num_new = min(seq.num_uncomputed_tokens, budget)
            batch.append(ScheduledSeq(seq, num_new))
            budget -= num_new
