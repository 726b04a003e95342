"""vLLM-format KV event batches, encoded the way vLLM's msgspec structs are (positional and tagged-map)."""

from __future__ import annotations

from typing import Any

import msgpack

BLOCK = 16
MODEL = "m"


def tokens(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BLOCK))


def stored_array(hashes: list[Any], parent: Any, toks: list[int], medium: str | None = "GPU") -> list[Any]:
    return ["BlockStored", hashes, parent, toks, BLOCK, None, medium]


def removed_array(hashes: list[Any], medium: str | None = "GPU") -> list[Any]:
    return ["BlockRemoved", hashes, medium]


def stored_map(
    hashes: list[Any], parent: Any, toks: list[int], lora_name: str | None = None
) -> dict[str, Any]:
    return {
        "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": toks,
        "block_size": BLOCK, "lora_id": None, "medium": "GPU", "lora_name": lora_name,
    }  # fmt: skip


def removed_map(hashes: list[Any]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def array_batch(*events: Any, ts: float = 1.0) -> bytes:
    return bytes(msgpack.packb([ts, list(events), 0]))


def map_batch(*events: Any, ts: float = 1.0) -> bytes:
    return bytes(msgpack.packb({"ts": ts, "events": list(events), "data_parallel_rank": 0}))
