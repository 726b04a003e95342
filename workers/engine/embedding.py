"""Embeddings from the model: the final hidden state (after the final norm, before the LM head), mean-pooled.

Each input runs alone through ``LlamaModel`` over a scratch paged KV cache sized to it, so the engine's
cache, block manager and scheduler are never touched; the caller serializes this with the engine's steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from workers.engine.forward_batch import ForwardBatch
from workers.engine.kv_cache import PagedKVCache
from workers.engine.llama import LlamaForCausalLM
from workers.engine_api import Embeddings


@torch.inference_mode()
def pooled_embeddings(
    model: LlamaForCausalLM, inputs: Sequence[Sequence[int]], *, block_size: int = 16
) -> Embeddings:
    """``[len(inputs), hidden_size]`` float32: each input's mean-pooled final hidden state, L2-normalised.

    Args:
        model: the model (its weights are only read).
        inputs: non-empty token-id sequences, already checked against the vocabulary and context.
        block_size: tokens per block of the scratch KV cache (the engine's, so its kernels apply).
    """
    rows = [_embed_one(model, ids, block_size) for ids in inputs]
    return np.stack(rows).astype(np.float32, copy=False)


def _embed_one(model: LlamaForCausalLM, ids: Sequence[int], block_size: int) -> Embeddings:
    weight = model.model.embed_tokens.weight
    device, dtype = weight.device, weight.dtype
    n = len(ids)
    num_blocks = -(-n // block_size)
    scratch = PagedKVCache.allocate(
        model.config, num_blocks=num_blocks, block_size=block_size, device=device, dtype=dtype
    )
    span = torch.arange(n, dtype=torch.int64, device=device)
    batch = ForwardBatch(
        positions=span,
        slot_mapping=span,
        block_tables=torch.arange(num_blocks, dtype=torch.int32, device=device)[None, :],
        context_lens=torch.tensor([n], dtype=torch.int32, device=device),
        cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32, device=device),
        logits_indices=torch.tensor([n - 1], dtype=torch.int64, device=device),
        is_decode=n == 1,
    )
    input_ids = torch.tensor(list(ids), dtype=torch.int64, device=device)
    hidden: torch.Tensor = model.model(input_ids, batch, scratch.layers)
    pooled = hidden.float().mean(dim=0)
    pooled = pooled / pooled.norm().clamp_min(1e-12)
    out: Embeddings = pooled.cpu().numpy()
    return out
