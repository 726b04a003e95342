"""``Result``: how one proxied attempt ended.
Compiled with mypyc (``docs/development.md``: what that rules out).

A plain class compiled with the request path (``kvgate_core.native``): one is built per attempt and read
several times by compiled code, which reads a compiled class's fields from its struct. Its fields are
``Final``; it compares, hashes and prints by value, as the frozen dataclass it replaces did.
"""

from __future__ import annotations

from typing import Final

from gateway.openai.sse import TokenUsage


class Result:
    """How one attempt ended: status sent, whether it completed, the usage seen, seconds to first byte."""

    __slots__ = ("ok", "status", "ttfb_s", "usage")

    def __init__(
        self, status: int, ok: bool, usage: TokenUsage | None = None, ttfb_s: float | None = None
    ) -> None:
        self.status: Final = status
        self.ok: Final = ok
        self.usage: Final = usage
        self.ttfb_s: Final = ttfb_s

    @property
    def cached_tokens(self) -> int | None:
        return self.usage.cached_tokens if self.usage is not None else None

    @property
    def prompt_tokens(self) -> int | None:
        return self.usage.prompt_tokens if self.usage is not None else None

    def _key(self) -> tuple[int, bool, TokenUsage | None, float | None]:
        return (self.status, self.ok, self.usage, self.ttfb_s)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Result):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Result(status={self.status}, ok={self.ok}, usage={self.usage!r}, ttfb_s={self.ttfb_s!r})"
