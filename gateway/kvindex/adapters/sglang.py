"""SGLang KV events: the same ZMQ/msgpack framing as vLLM's (``sglang/srt/disaggregation/kv_events.py``).

SGLang's structs are positional (``array_like``): ``BlockStored(block_hashes, parent_block_hash, token_ids,
block_size, lora_id)``, ``BlockRemoved(block_hashes)``, ``AllBlocksCleared()``; the tagged-map form is
accepted too. ``block_size`` is SGLang's page size: run SGLang with ``--page-size`` equal to the gateway's
``--block-size`` so that its pages are kvgate blocks. Decoding and re-hashing are shared with ``vllm.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gateway.kvindex.adapters.vllm import EngineEvent, decode_batch

SGLANG_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id"),
    "BlockRemoved": ("block_hashes",),
    "AllBlocksCleared": (),
}


def decode_sglang_batch(payload: bytes) -> list[EngineEvent]:
    """Decode one SGLang msgpack ``KVEventBatch`` (positional or tagged-map)."""
    return decode_batch(payload, SGLANG_FIELDS)
