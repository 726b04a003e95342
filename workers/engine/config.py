"""Model configuration of a Llama-family decoder, read from an HF ``config.json`` or built for tests.

Only the fields the engine's model uses are kept; loaders (``loader.py``) fill them from their source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ModelConfigError(ValueError):
    """A model's configuration is missing a field or describes an unsupported architecture."""


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE frequency scaling (``rope_type`` ``default``, ``linear`` or ``llama3``, as in HF configs)."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes and constants of a Llama-style decoder."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ModelConfigError("head_dim must be even for rotary embeddings")


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return (int(value),)


def _rope_scaling(raw: Mapping[str, Any] | None) -> RopeScaling:
    if not raw:
        return RopeScaling()
    rope_type = str(raw.get("rope_type", raw.get("type", "default")))
    if rope_type not in ("default", "linear", "llama3"):
        raise ModelConfigError(f"rope scaling {rope_type!r} is not supported (default, linear, llama3)")
    return RopeScaling(
        rope_type=rope_type,
        factor=float(raw.get("factor", 1.0)),
        low_freq_factor=float(raw.get("low_freq_factor", 1.0)),
        high_freq_factor=float(raw.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(raw.get("original_max_position_embeddings", 8192)),
    )


def config_from_hf(raw: Mapping[str, Any]) -> ModelConfig:
    """A ``ModelConfig`` from the dict of an HF ``config.json`` (``LlamaForCausalLM`` family).

    Raises:
        ModelConfigError: a required field is missing or the architecture is not Llama-like.
    """
    model_type = raw.get("model_type", "llama")
    if model_type != "llama":
        raise ModelConfigError(f"model_type {model_type!r} is not a Llama-family decoder")
    # transformers >= 5 writes ``rope_parameters`` (theta and scaling together) instead of the old keys.
    rope = raw.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
    scaling = _rope_scaling(rope if rope else raw.get("rope_scaling"))
    try:
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        return ModelConfig(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=_eos_ids(raw.get("eos_token_id")),
        )
    except KeyError as exc:
        raise ModelConfigError(f"config.json lacks {exc.args[0]!r}") from exc


def tiny_config(vocab_size: int = 259) -> ModelConfig:
    """A small config for tests and ``--model tiny``: 2 layers, GQA 4:2, head_dim 16.

    The default vocabulary is the byte tokenizer's (256 bytes and 3 ChatML special tokens).
    """
    return ModelConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,  # tied random embeddings make greedy decoding echo the last token
    )
