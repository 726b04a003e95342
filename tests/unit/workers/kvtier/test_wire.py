"""Block wire format: round trip, every rejection class, and fuzzed corruption/truncation."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvgate_core.kvcontract import wire
from kvgate_core.kvcontract.wire import (
    BadMagicError,
    BlockLayout,
    BlockMeta,
    BlockMismatchError,
    ChecksumMismatchError,
    HeaderCorruptError,
    TruncatedBlockError,
    UnsupportedVersionError,
    WireError,
    pack_block,
    unpack_block,
)

LAYOUT = BlockLayout(num_layers=2, block_size=4, dtype="bfloat16", shape=(2, 2, 4, 1, 3))
META = BlockMeta.of("org/model-1", 0xDEADBEEF_01234567, LAYOUT)
PAYLOAD = bytes(range(256))[: LAYOUT.payload_bytes]


def packed() -> bytes:
    return pack_block(META, PAYLOAD)


def test_round_trip_returns_meta_and_zero_copy_payload():
    value = packed()
    meta, payload = unpack_block(value, model=META.model, block_hash=META.block_hash, layout=LAYOUT)
    assert meta == META
    assert payload.tobytes() == PAYLOAD
    assert isinstance(payload, memoryview)
    assert len(value) == wire.header_bytes(META.model, 5) + LAYOUT.payload_bytes


def test_pack_accepts_any_contiguous_buffer():
    np = pytest.importorskip("numpy")
    arr = np.frombuffer(PAYLOAD, dtype=np.uint16).reshape(LAYOUT.shape)
    assert pack_block(META, arr) == packed()


@pytest.mark.parametrize(
    ("meta", "payload"),
    [
        (META, PAYLOAD[:-1]),
        (BlockMeta("m", 1, 1, 1, "float64", (1,)), b"\0" * 8),
        (BlockMeta("m", 2**64, 1, 1, "uint8", (1,)), b"\0"),
        (BlockMeta("m", 1, 0, 1, "uint8", (1,)), b"\0"),
        (BlockMeta("m", 1, 1, 1, "uint8", ()), b""),
        (BlockMeta("m" * 2000, 1, 1, 1, "uint8", (1,)), b"\0"),
    ],
    ids=["short-payload", "unknown-dtype", "hash-too-big", "zero-layers", "no-shape", "long-model"],
)
def test_pack_rejects_invalid_input(meta, payload):
    with pytest.raises(WireError):
        pack_block(meta, payload)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"model": "other"}, BlockMismatchError),
        ({"block_hash": 7}, BlockMismatchError),
        ({"layout": BlockLayout(2, 4, "float16", LAYOUT.shape)}, BlockMismatchError),
    ],
    ids=["model", "hash", "layout"],
)
def test_unpack_rejects_foreign_blocks(kwargs, error):
    with pytest.raises(error):
        unpack_block(packed(), **kwargs)


def test_unpack_rejects_each_kind_of_damage():
    value = bytearray(packed())
    with pytest.raises(BadMagicError):
        unpack_block(b"XXXX" + value[4:])
    with pytest.raises(TruncatedBlockError):
        unpack_block(value[:10])
    with pytest.raises(TruncatedBlockError):
        unpack_block(value[:-1])
    with pytest.raises(HeaderCorruptError):
        unpack_block(bytes(value) + b"\0")
    bad_version = bytearray(value)
    struct.pack_into("<H", bad_version, 4, 99)
    with pytest.raises(UnsupportedVersionError):
        unpack_block(bad_version)
    flipped = bytearray(value)
    flipped[-1] ^= 0x01
    with pytest.raises(ChecksumMismatchError):
        unpack_block(flipped)
    header = bytearray(value)
    header[12] ^= 0x01  # block size field
    with pytest.raises(HeaderCorruptError):
        unpack_block(header)


_FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(data=st.data())
def test_any_single_byte_change_is_rejected(data):
    value = bytearray(packed())
    pos = data.draw(st.integers(0, len(value) - 1))
    value[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(WireError):
        unpack_block(value)


@_FUZZ
@given(cut=st.integers(0, 10_000))
def test_any_truncation_is_rejected(cut):
    value = packed()
    with pytest.raises(WireError):
        unpack_block(value[: cut % len(value)])


@_FUZZ
@given(garbage=st.binary(max_size=200))
def test_random_bytes_are_rejected_without_other_exceptions(garbage):
    with pytest.raises(WireError):
        unpack_block(garbage)


@_FUZZ
@given(
    model=st.text(min_size=0, max_size=40),
    block_hash=st.integers(0, 2**64 - 1),
    dims=st.lists(st.integers(1, 5), min_size=1, max_size=5),
    dtype=st.sampled_from(sorted(wire.DTYPES)),
    data=st.data(),
)
def test_round_trip_any_metadata(model, block_hash, dims, dtype, data):
    layout = BlockLayout(num_layers=dims[0], block_size=3, dtype=dtype, shape=tuple(dims))
    meta = BlockMeta.of(model, block_hash, layout)
    payload = data.draw(st.binary(min_size=layout.payload_bytes, max_size=layout.payload_bytes))
    got, view = unpack_block(pack_block(meta, payload), model=model, block_hash=block_hash, layout=layout)
    assert got == meta
    assert view.tobytes() == payload
