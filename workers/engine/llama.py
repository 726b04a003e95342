"""A Llama-family decoder (``LlamaForCausalLM`` layout and parameter names) over a paged KV cache.

Parameter names match Hugging Face's, so an HF state dict loads as is (``loader.py``). The forward pass
takes the step's ``ForwardBatch`` and the per-layer cache tensors explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from workers.engine.config import ModelConfig
from workers.engine.forward_batch import ForwardBatch
from workers.engine.layers import Attention, RMSNorm, RotaryEmbedding, SwiGLU
from workers.kernels.dispatch import Kernels

KVCacheTensors = Sequence[tuple[torch.Tensor, torch.Tensor]]


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks with residual connections."""

    def __init__(self, config: ModelConfig, kernels: Kernels) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, kernels)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, batch, kv_cache)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class LlamaModel(nn.Module):
    """Embeddings, decoder layers and the final norm."""

    def __init__(self, config: ModelConfig, kernels: Kernels) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(config, kernels) for _ in range(config.num_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)

    def forward(
        self, input_ids: torch.Tensor, batch: ForwardBatch, kv_caches: KVCacheTensors
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary(batch.positions, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, rope, batch, kv_cache)
        return self.norm(x)  # type: ignore[no-any-return]


class LlamaForCausalLM(nn.Module):
    """The decoder plus the LM head (tied to the embeddings when the config says so)."""

    def __init__(self, config: ModelConfig, kernels: Kernels) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, kernels)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self, input_ids: torch.Tensor, batch: ForwardBatch, kv_caches: KVCacheTensors
    ) -> torch.Tensor:
        """Logits (fp32) of each sequence's last new token: ``[B, vocab]``."""
        hidden = self.model(input_ids, batch, kv_caches)
        return self.lm_head(hidden[batch.logits_indices]).float()  # type: ignore[no-any-return]
