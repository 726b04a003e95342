"""KV block wire format: the bytes a shared tier (Redis, SSD) stores for one block of KV.

A value is a header followed by the raw tensor bytes (the payload). All integers are little-endian::

    offset size  field
    0      4     magic  b"KVGB"
    4      2     format version (1)
    6      2     header length in bytes (fixed part + variable part + header checksum)
    8      2     layer count
    10     2     dtype code (see ``DTYPES``)
    12     4     block size (tokens)
    16     8     block hash (kvcontract scheme, u64)
    24     8     payload length in bytes
    32     8     xxh3_64 of the payload
    40     1     ndim;  then ndim x u32 shape
    ..     2     model id length; then the model id (UTF-8)
    ..     8     xxh3_64 of every header byte before it

The payload is ``prod(shape) * itemsize(dtype)`` bytes. Its layout (which axis is layer, K/V, token, head)
is the codec's business (``workers/kvtier/codec.py``); the format only checks that the sizes agree. The
header checksum makes any corruption of the header as detectable as one of the payload.

This module is part of the contract imported by both the gateway and the workers: it uses struct and
xxhash only (no numpy, no torch). ``unpack_block`` returns a zero-copy ``memoryview`` of the payload.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Final

import xxhash

MAGIC: Final = b"KVGB"
FORMAT_VERSION: Final = 1

# dtype name -> (code, itemsize). Codes are part of the wire contract: never renumber, only append.
DTYPES: Final[dict[str, tuple[int, int]]] = {
    "float32": (1, 4),
    "float16": (2, 2),
    "bfloat16": (3, 2),
    "float8_e4m3fn": (4, 1),
    "float8_e5m2": (5, 1),
    "uint8": (6, 1),
}
_DTYPE_BY_CODE: Final = {code: name for name, (code, _) in DTYPES.items()}

_FIXED: Final = struct.Struct("<4sHHHHIQQQB")
_U16: Final = struct.Struct("<H")
_U64: Final = struct.Struct("<Q")
_MAX_NDIM: Final = 8
_MAX_MODEL_BYTES: Final = 1024


class WireError(ValueError):
    """A stored block cannot be used. Callers treat every subclass as a miss (recompute)."""


class TruncatedBlockError(WireError):
    """The value is shorter than its header says (a partial write or a cut read)."""


class BadMagicError(WireError):
    """The value does not start with the block magic: not a kvgate block at all."""


class UnsupportedVersionError(WireError):
    """The block was written by a format version this code cannot read."""


class HeaderCorruptError(WireError):
    """The header's own checksum or one of its fields is invalid."""


class ChecksumMismatchError(WireError):
    """The payload does not match the checksum in the header."""


class BlockMismatchError(WireError):
    """A valid block, but not the one asked for (another model, hash or layout)."""


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """The shape of one block's payload, fixed per model deployment (layers, tokens, dtype, tensor shape)."""

    num_layers: int
    block_size: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def payload_bytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][1]


@dataclass(frozen=True, slots=True)
class BlockMeta:
    """What a block header says about its payload.

    Attributes:
        model: the model id the KV was computed with.
        block_hash: the block's hash (kvcontract scheme), unsigned 64-bit.
        num_layers: transformer layers covered by the payload.
        block_size: tokens per block.
        dtype: element type name, a key of ``DTYPES``.
        shape: payload tensor shape; ``prod(shape) * itemsize`` is the payload length.
    """

    model: str
    block_hash: int
    num_layers: int
    block_size: int
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, model: str, block_hash: int, layout: BlockLayout) -> BlockMeta:
        return cls(model, block_hash, layout.num_layers, layout.block_size, layout.dtype, layout.shape)

    @property
    def layout(self) -> BlockLayout:
        return BlockLayout(self.num_layers, self.block_size, self.dtype, self.shape)

    @property
    def payload_bytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][1]

    def validate(self) -> None:
        """Raise ``WireError`` if the fields cannot be encoded."""
        if self.dtype not in DTYPES:
            raise WireError(f"unknown dtype {self.dtype!r}; known: {', '.join(DTYPES)}")
        if not 0 <= self.block_hash < 2**64:
            raise WireError("block_hash must be an unsigned 64-bit integer")
        if not (0 < self.num_layers < 2**16 and 0 < self.block_size < 2**32):
            raise WireError("num_layers and block_size must be positive and fit u16/u32")
        if not 0 < len(self.shape) <= _MAX_NDIM or any(not 0 <= d < 2**32 for d in self.shape):
            raise WireError(f"shape must have 1..{_MAX_NDIM} dims, each a u32")
        if len(self.model.encode("utf-8")) > _MAX_MODEL_BYTES:
            raise WireError(f"model id longer than {_MAX_MODEL_BYTES} bytes")


def header_bytes(model: str, ndim: int) -> int:
    """Size of the header of a block of ``model`` whose shape has ``ndim`` dimensions."""
    return _FIXED.size + 4 * ndim + _U16.size + len(model.encode("utf-8")) + _U64.size


def pack_header(meta: BlockMeta, payload: bytes | bytearray | memoryview) -> bytes:
    """The header for ``payload`` (the payload itself is not copied).

    Raises:
        WireError: the metadata is invalid or ``payload`` is not ``meta.payload_bytes`` long.
    """
    meta.validate()
    view = memoryview(payload).cast("B")
    if view.nbytes != meta.payload_bytes:
        raise WireError(
            f"payload is {view.nbytes} bytes; shape {meta.shape} of {meta.dtype} needs {meta.payload_bytes}"
        )
    model = meta.model.encode("utf-8")
    header_len = header_bytes(meta.model, len(meta.shape))
    head = b"".join(
        (
            _FIXED.pack(
                MAGIC,
                FORMAT_VERSION,
                header_len,
                meta.num_layers,
                DTYPES[meta.dtype][0],
                meta.block_size,
                meta.block_hash,
                view.nbytes,
                xxhash.xxh3_64_intdigest(view),
                len(meta.shape),
            ),
            struct.pack(f"<{len(meta.shape)}I", *meta.shape),
            _U16.pack(len(model)),
            model,
        )
    )
    return head + _U64.pack(xxhash.xxh3_64_intdigest(head))


def pack_block(meta: BlockMeta, payload: bytes | bytearray | memoryview) -> bytes:
    """Header + payload as one value, ready to store.

    Args:
        meta: the block's metadata.
        payload: the raw tensor bytes (any C-contiguous buffer, e.g. ``ndarray`` or ``memoryview``).

    Raises:
        WireError: the metadata is invalid or does not match the payload length.
    """
    return pack_header(meta, payload) + memoryview(payload).cast("B")


def _read_header(view: memoryview) -> tuple[BlockMeta, int, int, int]:
    """Parse and check the header: (meta, header_len, payload_len, payload checksum)."""
    if view.nbytes < 4 or bytes(view[:4]) != MAGIC:
        raise (TruncatedBlockError if view.nbytes < 4 else BadMagicError)("not a kvgate KV block")
    if view.nbytes < _FIXED.size:
        raise TruncatedBlockError(f"value of {view.nbytes} bytes is shorter than the fixed header")
    _, version, header_len, layers, dcode, bsize, bhash, plen, psum, ndim = _FIXED.unpack_from(view)
    if version != FORMAT_VERSION:
        raise UnsupportedVersionError(f"block format version {version}; this build reads {FORMAT_VERSION}")
    if view.nbytes < header_len:
        raise TruncatedBlockError(
            f"value of {view.nbytes} bytes is shorter than its {header_len}-byte header"
        )
    end = header_len - _U64.size
    if end < _FIXED.size or xxhash.xxh3_64_intdigest(view[:end]) != _U64.unpack_from(view, end)[0]:
        raise HeaderCorruptError("header checksum mismatch")
    return _decode_fields(view, end, (layers, dcode, bsize, bhash, plen, ndim)), header_len, plen, psum


def _decode_fields(view: memoryview, end: int, fields: tuple[int, ...]) -> BlockMeta:
    layers, dcode, bsize, bhash, plen, ndim = fields
    pos = _FIXED.size
    if dcode not in _DTYPE_BY_CODE or not 0 < ndim <= _MAX_NDIM or pos + 4 * ndim + 2 > end:
        raise HeaderCorruptError("bad dtype code or shape rank")
    shape = struct.unpack_from(f"<{ndim}I", view, pos)
    pos += 4 * ndim
    (mlen,) = _U16.unpack_from(view, pos)
    pos += _U16.size
    if pos + mlen != end:
        raise HeaderCorruptError("header length does not match its fields")
    try:
        model = bytes(view[pos:end]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderCorruptError("model id is not UTF-8") from exc
    meta = BlockMeta(model, bhash, layers, bsize, _DTYPE_BY_CODE[dcode], tuple(shape))
    if meta.payload_bytes != plen:
        raise HeaderCorruptError(
            f"shape {meta.shape} of {meta.dtype} needs {meta.payload_bytes} bytes, header says {plen}"
        )
    return meta


def unpack_block(
    value: bytes | bytearray | memoryview,
    *,
    model: str | None = None,
    block_hash: int | None = None,
    layout: BlockLayout | None = None,
) -> tuple[BlockMeta, memoryview]:
    """Check a stored value and return its metadata and a zero-copy view of the payload.

    Args:
        value: the stored bytes.
        model: when given, the model id the block must carry.
        block_hash: when given, the hash the block must carry (the key it was read under).
        layout: when given, the layout the block must have (the reader's KV cache geometry).

    Raises:
        WireError: the value is damaged or foreign (``TruncatedBlockError``, ``BadMagicError``,
            ``UnsupportedVersionError``, ``HeaderCorruptError``, ``ChecksumMismatchError``), or intact but
            for another model, hash or layout (``BlockMismatchError``).
    """
    view = memoryview(value).cast("B")
    meta, header_len, plen, psum = _read_header(view)
    total = header_len + plen
    if view.nbytes != total:
        kind = TruncatedBlockError if view.nbytes < total else HeaderCorruptError
        raise kind(f"value is {view.nbytes} bytes; header + payload is {total}")
    payload = view[header_len:]
    if xxhash.xxh3_64_intdigest(payload) != psum:
        raise ChecksumMismatchError("payload checksum mismatch")
    if model is not None and meta.model != model:
        raise BlockMismatchError(f"block is for model {meta.model!r}, expected {model!r}")
    if block_hash is not None and meta.block_hash != block_hash:
        raise BlockMismatchError(f"block hash {meta.block_hash:016x}, expected {block_hash:016x}")
    if layout is not None and meta.layout != layout:
        raise BlockMismatchError(f"block layout {meta.layout}, expected {layout}")
    return meta, payload
