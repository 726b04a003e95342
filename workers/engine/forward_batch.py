"""The explicit per-step input of the model: which tokens, where their K/V go, what they attend to.

Built by ``model_runner`` for every step and passed down to each attention layer (no global context).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """One step's batch of sequences, flattened along the token axis.

    Attributes:
        positions: ``[T]`` int64, the position of every new token in its sequence.
        slot_mapping: ``[T]`` int64, the KV slot (``block_id * block_size + offset``) of every new token.
        block_tables: ``[B, max_blocks]`` int32, each sequence's blocks (padded with 0).
        context_lens: ``[B]`` int32, KV length of each sequence after this step's tokens are stored.
        cu_seqlens_q: ``[B + 1]`` int32, prefix sums of the new-token counts.
        logits_indices: ``[B]`` int64, the row of each sequence's last new token (the one sampled from).
        is_decode: every sequence has exactly one new token (the decode kernel applies).
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    logits_indices: torch.Tensor
    is_decode: bool

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])
