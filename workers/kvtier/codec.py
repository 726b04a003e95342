"""Block codec (torch side): a paged KV cache's blocks to wire values and back. Imported by the engine only.

The engine keeps, per layer, ``k_cache`` and ``v_cache`` of shape ``[num_blocks, block_size, num_kv_heads,
head_dim]``. A wire block holds every layer's K and V of one cache block, as one C-contiguous tensor of
shape ``[num_layers, 2, block_size, num_kv_heads, head_dim]`` (axis 1: 0 = K, 1 = V) in the cache dtype.

``dump`` gathers a batch of blocks into one device staging tensor, copies it to the host in one transfer
and packs each block; ``load`` checks a batch, copies the payloads into one (pinned, on CUDA) host tensor,
moves it to the device in one transfer and scatters it into the given cache slots. Checks raise
``WireError``: the caller treats the block and everything after it as a miss (recompute).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvgate_core.kvcontract.wire import BlockLayout, BlockMeta, header_bytes, pack_block, unpack_block

WIRE_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
}

KVCaches = Sequence[tuple[torch.Tensor, torch.Tensor]]  # per layer: (k_cache, v_cache)


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """The cache geometry that fixes a block's wire layout."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, caches: KVCaches) -> KVGeometry:
        """Read the geometry off an engine's per-layer caches."""
        if not caches:
            raise ValueError("no KV cache layers")
        k = caches[0][0]
        if k.dim() != 4:
            raise ValueError(
                f"k_cache must be [num_blocks, block_size, heads, head_dim], got {tuple(k.shape)}"
            )
        return cls(len(caches), k.shape[1], k.shape[2], k.shape[3], k.dtype)

    @property
    def layout(self) -> BlockLayout:
        if self.dtype not in WIRE_DTYPES:
            raise ValueError(f"KV dtype {self.dtype} has no wire name; known: {list(WIRE_DTYPES)}")
        shape = (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)
        return BlockLayout(self.num_layers, self.block_size, WIRE_DTYPES[self.dtype], shape)


class BlockCodec:
    """Converts between cache blocks of one model and wire values.

    Args:
        model: the model id written into (and required of) every block.
        geometry: the engine's cache geometry (``KVGeometry.of(caches)``).
    """

    def __init__(self, model: str, geometry: KVGeometry) -> None:
        self.model = model
        self.geometry = geometry
        self.layout = geometry.layout
        self.value_bytes = header_bytes(model, len(self.layout.shape)) + self.layout.payload_bytes
        """Bytes of one stored block (header + payload): what a pull of one block transfers."""

    def dump(self, caches: KVCaches, block_ids: Sequence[int], hashes: Sequence[int]) -> list[bytes]:
        """Wire values of cache blocks ``block_ids``, named by ``hashes`` (same length, same order)."""
        if len(block_ids) != len(hashes):
            raise ValueError("block_ids and hashes must have the same length")
        if not block_ids:
            return []
        device = caches[0][0].device
        ids = torch.as_tensor(block_ids, dtype=torch.long, device=device)
        g = self.geometry
        # Gather into one [n, L, 2, bs, h, d] staging tensor on the device, then one device->host copy.
        staging = torch.empty((len(block_ids), *self.layout.shape), dtype=g.dtype, device=device)
        for layer, (k, v) in enumerate(caches):
            staging[:, layer, 0] = k.index_select(0, ids)
            staging[:, layer, 1] = v.index_select(0, ids)
        raw = staging.cpu().view(torch.uint8).reshape(len(block_ids), -1).numpy()
        return [pack_block(BlockMeta.of(self.model, h, self.layout), raw[i]) for i, h in enumerate(hashes)]

    def decode(self, values: Sequence[bytes], hashes: Sequence[int], *, pin: bool = False) -> torch.Tensor:
        """Check values and stack their payloads as a host tensor ``[n, L, 2, bs, h, d]`` (pinned if ``pin``).

        Raises:
            WireError: a value is damaged, foreign or of another layout.
        """
        if len(values) != len(hashes):
            raise ValueError("values and hashes must have the same length")
        size = self.layout.payload_bytes
        host = torch.empty((len(values), size), dtype=torch.uint8, pin_memory=pin)
        rows = host.numpy()
        for i, (v, h) in enumerate(zip(values, hashes, strict=True)):
            rows[i] = np.frombuffer(
                unpack_block(v, model=self.model, block_hash=h, layout=self.layout)[1], np.uint8
            )
        return host.view(self.geometry.dtype).reshape(len(values), *self.layout.shape)

    def load(
        self, caches: KVCaches, values: Sequence[bytes], hashes: Sequence[int], block_ids: Sequence[int]
    ) -> None:
        """Write checked wire values into cache blocks ``block_ids``.

        Nothing is written unless every value passes its checks.

        Raises:
            WireError: a value is damaged, foreign or of another layout.
        """
        if len(block_ids) != len(values):
            raise ValueError("values and block_ids must have the same length")
        if not values:
            return
        if len(caches) != self.geometry.num_layers:
            raise ValueError(f"cache has {len(caches)} layers, the codec {self.geometry.num_layers}")
        device = caches[0][0].device
        blocks = self.decode(values, hashes, pin=device.type == "cuda")
        on_device = blocks.to(device, non_blocking=True)
        ids = torch.as_tensor(block_ids, dtype=torch.long, device=device)
        for layer, (k, v) in enumerate(caches):
            k.index_copy_(0, ids, on_device[:, layer, 0])
            v.index_copy_(0, ids, on_device[:, layer, 1])
