"""A minimal reader of a GGUF file's key/value metadata (format versions 2 and 3, little-endian).

It stops where the tensor descriptions begin, so reading a tokenizer's 100k-string vocabulary costs tens of
milliseconds, where ``gguf.GGUFReader`` (which also maps every tensor) takes seconds. Tensors are the
worker's business (``workers``, with the ``gguf`` package).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Final

_MAGIC: Final = b"GGUF"
_STRING: Final = 8
_ARRAY: Final = 9
# value type -> struct format of one scalar (GGUF spec: 0..12, except 8 string and 9 array)
_SCALARS: Final[dict[int, str]] = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}  # fmt: skip

MetaValue = int | float | bool | str | list["MetaValue"]


class _Cursor:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, fmt: str) -> tuple[object, ...]:
        values = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values

    def u32(self) -> int:
        return self._int(4)

    def u64(self) -> int:
        return self._int(8)

    def _int(self, size: int) -> int:
        end = self.pos + size
        if end > len(self.buf):
            raise ValueError("truncated GGUF metadata")
        value = int.from_bytes(self.buf[self.pos : end], "little")
        self.pos = end
        return value

    def string(self) -> str:
        n = self.u64()
        if self.pos + n > len(self.buf):
            raise ValueError("truncated GGUF string")
        text = self.buf[self.pos : self.pos + n].decode("utf-8")
        self.pos += n
        return text

    def value(self, kind: int) -> MetaValue:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array()
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {kind}")
        (value,) = self.unpack(fmt)
        return value  # type: ignore[return-value]

    def array(self) -> list[MetaValue]:
        kind = self.u32()
        count = self.u64()
        fmt = _SCALARS.get(kind)
        if fmt is not None:
            return list(self.unpack(f"{count}{fmt}"))  # type: ignore[arg-type]
        return [self.value(kind) for _ in range(count)]


def read_gguf_metadata(path: str | Path) -> dict[str, MetaValue]:
    """All key/value metadata of a GGUF file.

    Raises:
        ValueError: not a GGUF file, an unsupported version, or truncated metadata.
        OSError: the file cannot be opened.
    """
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != _MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        cur = _Cursor(buf)
        cur.pos = 4
        version = cur.u32()
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version} (big-endian files are not supported)")
        cur.u64()  # tensor count
        num_kv = cur.u64()
        meta: dict[str, MetaValue] = {}
        for _ in range(num_kv):
            key = cur.string()
            meta[key] = cur.value(cur.u32())
        return meta
