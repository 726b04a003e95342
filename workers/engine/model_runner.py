"""Runs one scheduler step on the model: builds the ``ForwardBatch``, calls the model, returns logits.

The runner knows tensors and devices but nothing of scheduling policy; block tables come from the block
manager through the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch

from workers.engine.forward_batch import ForwardBatch
from workers.engine.kv_cache import PagedKVCache
from workers.engine.llama import LlamaForCausalLM
from workers.engine.scheduler import ScheduledSeq


class ModelRunner:
    """The model, its paged KV cache and the device they live on."""

    def __init__(self, model: LlamaForCausalLM, kv_cache: PagedKVCache, device: torch.device) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = device
        self.block_size = kv_cache.block_size

    def prepare(
        self, items: Sequence[ScheduledSeq], block_tables: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, ForwardBatch]:
        """Input ids and the ``ForwardBatch`` for ``items`` (each with its block table)."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        for item, table in zip(items, block_tables, strict=True):
            start = item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            input_ids.extend(item.seq.token_ids[start:end])
            span = range(start, end)
            positions.extend(span)
            slots.extend(table[p // bs] * bs + p % bs for p in span)
        q_lens = [item.num_new_tokens for item in items]
        cu_seqlens = [0, *accumulate(q_lens)]
        width = max(len(t) for t in block_tables)
        padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
        dev = self.device
        batch = ForwardBatch(
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=dev),
            context_lens=torch.tensor(
                [i.seq.num_computed_tokens + i.num_new_tokens for i in items], dtype=torch.int32, device=dev
            ),
            cu_seqlens_q=torch.tensor(cu_seqlens, dtype=torch.int32, device=dev),
            logits_indices=torch.tensor([c - 1 for c in cu_seqlens[1:]], dtype=torch.int64, device=dev),
            is_decode=all(n == 1 for n in q_lens),
        )
        return torch.tensor(input_ids, dtype=torch.int64, device=dev), batch

    @torch.inference_mode()
    def run(self, items: Sequence[ScheduledSeq], block_tables: Sequence[Sequence[int]]) -> torch.Tensor:
        """Compute the new tokens' KV and return fp32 logits of each sequence's last new token."""
        input_ids, batch = self.prepare(items, block_tables)
        logits: torch.Tensor = self.model(input_ids, batch, self.kv_cache.layers)
        return logits
