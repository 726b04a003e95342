"""API-key authentication as an ASGI middleware.

Keys come from a file (one per line, ``#`` comments allowed) or a comma-separated ``KVGATE_API_KEYS``
value. Only SHA-256 digests are kept in memory and compared with ``hmac.compare_digest``; keys are never
logged. ``/v1/*`` needs an API key when any is configured; ``/admin/*`` needs an admin key when one is
configured; ``/health``, ``/ready`` and ``/metrics`` are always open (probes and scrapers).
A request's key id (a short digest prefix, safe to log and to rate-limit on) is put in
``scope["state"]["api_key_id"]``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gateway.errors import Unauthorized
from kvgate_core.asgi import ASGIApp, Receive, Scope, Send, header

_OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class KeyRing:
    """A set of accepted keys, held as digests."""

    digests: tuple[bytes, ...]

    @classmethod
    def of(cls, keys: Iterable[str]) -> KeyRing:
        cleaned = [k.strip() for k in keys if k.strip() and not k.strip().startswith("#")]
        return cls(tuple(_digest(k) for k in cleaned))

    @classmethod
    def from_file(cls, path: str | Path) -> KeyRing:
        """Read one key per line.

        Raises:
            ValueError: the file cannot be read or holds no key.
        """
        try:
            ring = cls.of(Path(path).read_text(encoding="utf-8").splitlines())
        except OSError as exc:
            raise ValueError(f"cannot read API key file {path}: {exc}") from exc
        if not ring.digests:
            raise ValueError(f"API key file {path} holds no key")
        return ring

    def match(self, presented: str | None) -> str | None:
        """The key id of ``presented`` if it is accepted, else None (constant time per stored key)."""
        if not presented:
            return None
        digest = _digest(presented)
        found = False
        for stored in self.digests:
            found |= hmac.compare_digest(stored, digest)
        return digest.hex()[:12] if found else None


def presented_key(scope: Scope) -> str | None:
    """The key from ``Authorization: Bearer …`` or ``x-api-key``."""
    auth = header(scope, b"authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return header(scope, b"x-api-key")


class AuthMiddleware:
    """Rejects requests without a valid key with 401 ``invalid_api_key`` (OpenAI's code)."""

    def __init__(self, app: ASGIApp, api_keys: KeyRing | None, admin_keys: KeyRing | None) -> None:
        self.app = app
        self.api_keys = api_keys
        self.admin_keys = admin_keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        ring = self.admin_keys if scope["path"].startswith("/admin") else self.api_keys
        if ring is None:
            await self.app(scope, receive, send)
            return
        key_id = ring.match(presented_key(scope))
        if key_id is None:
            raise Unauthorized("Incorrect or missing API key. Pass it as 'Authorization: Bearer <key>'.")
        scope.setdefault("state", {})["api_key_id"] = key_id
        await self.app(scope, receive, send)
