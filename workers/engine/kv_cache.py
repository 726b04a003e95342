"""The paged K/V tensors: one ``[num_blocks, block_size, num_kv_heads, head_dim]`` pair per layer.

Block ids come from the block manager; this module only owns the memory and sizes it from a budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.engine.config import ModelConfig


def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """KV bytes one token takes across all layers (K and V)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize


@dataclass(frozen=True, slots=True)
class PagedKVCache:
    """Per-layer ``(k_cache, v_cache)`` tensors sharing one block numbering."""

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    num_blocks: int
    block_size: int

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        *,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> PagedKVCache:
        """Zeroed caches for ``num_blocks`` blocks of ``block_size`` tokens on every layer."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
        layers = tuple(
            (torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
            for _ in range(config.num_layers)
        )
        return cls(layers=layers, num_blocks=num_blocks, block_size=block_size)
