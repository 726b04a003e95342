"""A sequence's state while it is scheduled: its tokens, how many have KV, its prefix hashes.

Block hashes are computed once per full block (kvcontract's chain) and extended as tokens are appended;
the scheduler hands them to the block manager instead of rehashing the prompt on every admission.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto

from kvgate_core.kvcontract.hashing import chain_hashes
from workers.engine_api import FinishReason, SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass(slots=True)
class Sequence:
    """One request being generated (mutable; owned by the scheduler's thread).

    Attributes:
        seq_id: the request id.
        token_ids: prompt then generated tokens.
        num_prompt_tokens: prompt length.
        sampling: the request's sampling parameters.
        root: the hash chain's root (model id and extra keys).
        block_size: tokens per KV block.
        num_computed_tokens: leading tokens whose KV is in the cache (0 again after a preemption).
        num_cached_tokens: prompt tokens served from the prefix cache at first admission.
        block_hashes: chain hashes of the full blocks of ``token_ids``.
    """

    seq_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling: SamplingParams
    root: int
    block_size: int
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    block_hashes: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.block_hashes = chain_hashes(self.token_ids, self.root, self.block_size)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    def append_token(self, token_id: int) -> None:
        """Add a generated token; hash the block it completes, if any."""
        self.token_ids.append(token_id)
        if len(self.token_ids) % self.block_size == 0:
            parent = self.block_hashes[-1] if self.block_hashes else self.root
            start = len(self.token_ids) - self.block_size
            self.block_hashes.extend(chain_hashes(self.token_ids[start:], parent, self.block_size))
