"""Block codec: cache blocks -> wire values -> other cache slots, bit for bit."""

from __future__ import annotations

import pytest
import torch

from kvgate_core.kvcontract.wire import WireError, unpack_block
from workers.kvtier.codec import BlockCodec, KVGeometry

LAYERS, BLOCKS, BS, HEADS, DIM = 3, 6, 4, 2, 8


def caches(dtype: torch.dtype, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    shape = (BLOCKS, BS, HEADS, DIM)
    return [
        (torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))
        for _ in range(LAYERS)
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_dump_then_load_into_other_slots_is_exact(dtype):
    src, dst = caches(dtype, 0), caches(dtype, 1)
    codec = BlockCodec("m", KVGeometry.of(src))
    hashes = [11, 22]
    values = codec.dump(src, [1, 4], hashes)
    assert all(len(v) == codec.value_bytes for v in values)
    codec.load(dst, values, hashes, [5, 0])
    for (sk, sv), (dk, dv) in zip(src, dst, strict=True):
        assert torch.equal(dk[5], sk[1]) and torch.equal(dv[5], sv[1])
        assert torch.equal(dk[0], sk[4]) and torch.equal(dv[0], sv[4])
    untouched = caches(dtype, 1)
    assert torch.equal(dst[0][0][2], untouched[0][0][2])


def test_payload_layout_is_layers_kv_tokens_heads_dim():
    src = caches(torch.float32)
    codec = BlockCodec("m", KVGeometry.of(src))
    _, payload = unpack_block(codec.dump(src, [2], [9])[0])
    block = torch.frombuffer(bytearray(payload), dtype=torch.float32).reshape(LAYERS, 2, BS, HEADS, DIM)
    assert torch.equal(block[1, 0], src[1][0][2])
    assert torch.equal(block[2, 1], src[2][1][2])


def test_load_rejects_other_layout_and_writes_nothing():
    src = caches(torch.float32)
    other = BlockCodec("m", KVGeometry.of(caches(torch.bfloat16)))
    values = BlockCodec("m", KVGeometry.of(src)).dump(src, [0, 1], [1, 2])
    dst = caches(torch.bfloat16, 3)
    before = [k.clone() for k, _ in dst]
    with pytest.raises(WireError):
        other.load(dst, values, [1, 2], [0, 1])
    assert all(torch.equal(k, b) for (k, _), b in zip(dst, before, strict=True))


def test_load_rejects_wrong_hash():
    src = caches(torch.float32)
    codec = BlockCodec("m", KVGeometry.of(src))
    with pytest.raises(WireError):
        codec.load(src, codec.dump(src, [0], [1]), [2], [3])


def test_geometry_rejects_unsupported_dtype():
    with pytest.raises(ValueError, match="wire name"):
        _ = KVGeometry.of(caches(torch.float64)).layout
