"""Load a Llama-family GGUF file (llama.cpp's format): config from its metadata, dequantised weights.

Weights are dequantised with the ``gguf`` package and renamed to the HF layout. llama.cpp's converter
permutes the rows of the Q and K projections so that rotary pairs are interleaved; ``unpermute_rotary``
undoes that, because this model rotates halves (HF's ``rotate_half``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.engine.config import ModelConfig, ModelConfigError, RopeScaling

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_config(reader: Any) -> ModelConfig:
    """A ``ModelConfig`` from a GGUF reader's ``llama.*`` metadata.

    Raises:
        ModelConfigError: the file is not a Llama-architecture model.
    """
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelConfigError(f"GGUF architecture {arch!r} is not supported (llama only)")
    if "rope_freqs.weight" in {t.name for t in reader.tensors}:
        raise ModelConfigError("GGUF files with rope_freqs (llama3 rope scaling) are not supported")
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    scaling = RopeScaling()
    if _field(reader, "llama.rope.scaling.type") == "linear":
        scaling = RopeScaling(rope_type="linear", factor=float(_field(reader, "llama.rope.scaling.factor")))
    vocab = _field(reader, "llama.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_layers=int(_field(reader, "llama.block_count")),
        num_heads=heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, "llama.rope.dimension_count", hidden // heads)),
        max_position_embeddings=int(_field(reader, "llama.context_length", 2048)),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        tie_word_embeddings="output.weight" not in {t.name for t in reader.tensors},
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's ``permute`` of a Q/K projection (``[heads * D, hidden]``)."""
    rows = weight.shape[0]
    head_dim = rows // num_heads
    return weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _hf_name(name: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    match = _LAYER_RE.match(name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        raise ModelConfigError(f"unexpected GGUF tensor {name!r}")
    return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.weight"


def _dequantize(tensor: Any) -> np.ndarray:
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dims innermost first
    return np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)


def load_gguf(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read a GGUF file: its config and an HF-named fp32 state dict."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    config = gguf_config(reader)
    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        weight = _dequantize(tensor)
        if tensor.name.endswith("attn_q.weight"):
            weight = unpermute_rotary(weight, config.num_heads)
        elif tensor.name.endswith("attn_k.weight"):
            weight = unpermute_rotary(weight, config.num_kv_heads)
        state[_hf_name(tensor.name)] = torch.from_numpy(weight)
    return config, state
