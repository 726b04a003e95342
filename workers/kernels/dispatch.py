"""The kernel table: Triton on CUDA, the torch reference otherwise, chosen once at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from workers.kernels import reference


class StoreKV(Protocol):
    def __call__(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None: ...


class DecodeAttention(Protocol):
    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor: ...


class PrefillAttention(Protocol):
    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class Kernels:
    """The paged-attention kernels one engine uses; see ``reference`` for layouts and semantics."""

    name: str
    store_kv: StoreKV
    paged_decode_attention: DecodeAttention
    paged_prefill_attention: PrefillAttention


def reference_kernels() -> Kernels:
    """The torch implementations (any device)."""
    return Kernels(
        name="torch-reference",
        store_kv=reference.store_kv,
        paged_decode_attention=reference.paged_decode_attention,
        paged_prefill_attention=reference.paged_prefill_attention,
    )


def triton_kernels() -> Kernels:
    """The Triton implementations (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``)."""
    from workers.kernels.decode_attention import paged_decode_attention
    from workers.kernels.prefill_attention import paged_prefill_attention
    from workers.kernels.store_kv import store_kv

    return Kernels(
        name="triton",
        store_kv=store_kv,
        paged_decode_attention=paged_decode_attention,
        paged_prefill_attention=paged_prefill_attention,
    )


def select_kernels(device: torch.device | str) -> Kernels:
    """Triton when ``device`` is CUDA and triton imports; the torch reference otherwise.

    Args:
        device: The device the KV cache and activations live on.
    """
    if torch.device(device).type != "cuda":
        return reference_kernels()
    try:
        return triton_kernels()
    except ImportError:
        return reference_kernels()
