"""Assignment of one bitmask bit per worker id, reused after a worker leaves."""

from __future__ import annotations


class WorkerBits:
    """Worker id -> a distinct power of two; freed bits are handed out again (lowest first)."""

    __slots__ = ("_bits", "_free", "_next")

    def __init__(self) -> None:
        self._bits: dict[str, int] = {}
        self._free: list[int] = []
        self._next = 0

    @property
    def bits(self) -> dict[str, int]:
        """The live mapping (read it, do not mutate it)."""
        return self._bits

    def get(self, worker: str) -> int:
        """The worker's bit, or 0 when it has none."""
        return self._bits.get(worker, 0)

    def ensure(self, worker: str) -> int:
        """The worker's bit, assigning one on first use."""
        bit = self._bits.get(worker)
        if bit is None:
            if self._free:
                self._free.sort()
                index = self._free.pop(0)
            else:
                index = self._next
                self._next += 1
            bit = self._bits[worker] = 1 << index
        return bit

    def release(self, worker: str) -> int:
        """Forget the worker; returns its former bit (0 if it had none)."""
        bit = self._bits.pop(worker, 0)
        if bit:
            self._free.append(bit.bit_length() - 1)
        return bit
