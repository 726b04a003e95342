"""API-key authentication, the control plane's access mode and tenant binding, as one ASGI middleware.

Keys come from a file or a comma-separated value (``--api-keys``, ``--admin-keys``, ``KVGATE_*``). A file
holds one key per row, ``#`` starting a comment; a row may name the key's tenant, whitespace-separated:

.. code-block:: text

    # KEY [tenant=NAME]
    sk-acme-1   tenant=acme
    sk-globex   tenant=globex
    sk-internal

A comma-separated value holds the same rows (``sk-a tenant=a,sk-b``); a tenant on an admin key is
ignored. Only SHA-256 digests are kept in memory and compared with ``hmac.compare_digest``; keys are never
logged nor echoed in errors.

What the middleware checks, by path:

* ``/health``, ``/ready``, ``/metrics``: nothing (probes and scrapers), in every mode;
* ``/admin/*`` (the admin UI included): the mode of ``gateway.security.admin_access`` (an admin key where
  ``--admin-keys`` is set; 403 where only client keys are set; writes 403 on a non-loopback address);
* everything else: a client key when ``--api-keys`` is set (401 ``invalid_api_key`` without one); the
  request's ``x-kvgate-tenant`` header is then rewritten to the key's effective tenant
  (``gateway.security.tenants``), so the router and the proxy only ever see the tenant the key may use.

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
from gateway.security.admin_access import AdminAccess, admin_access
from gateway.security.tenants import TENANT_NAME, bind_tenant
from kvgate_core.asgi import ASGIApp, Receive, Scope, Send, header

_OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
_ADMIN_PREFIX = "/admin"
_MISSING_KEY = "Incorrect or missing API key. Pass it as 'Authorization: Bearer <key>'."


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One accepted key, as its digest, and the tenant its row names (None: none)."""

    digest: bytes
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class KeyMatch:
    """A presented key that was accepted: its id and its tenant."""

    key_id: str
    tenant: str | None


def parse_key_row(row: str, where: str) -> KeyEntry | None:
    """One row, ``KEY [tenant=NAME]`` (None for a blank or comment row); ``where`` names it in errors,
    which never quote the key.

    Raises:
        ValueError: an attribute is unknown, repeated or malformed.
    """
    words = row.split()
    cut = next((i for i, w in enumerate(words) if w.startswith("#")), len(words))
    words = words[:cut]
    if not words:
        return None
    attributes: dict[str, str] = {}
    for word in words[1:]:
        name, sep, value = word.partition("=")
        if not sep or name != "tenant":
            raise ValueError(f"{where}: after the key, only tenant=NAME may follow")
        if name in attributes:
            raise ValueError(f"{where}: tenant= is given twice")
        if not TENANT_NAME.fullmatch(value):
            raise ValueError(f"{where}: a tenant name is 1-64 characters of A-Z a-z 0-9 . _ -")
        attributes[name] = value
    return KeyEntry(_digest(words[0]), attributes.get("tenant"))


@dataclass(frozen=True, slots=True)
class KeyRing:
    """A set of accepted keys, held as digests, each with its tenant."""

    entries: tuple[KeyEntry, ...]

    @property
    def digests(self) -> tuple[bytes, ...]:
        return tuple(e.digest for e in self.entries)

    @classmethod
    def of(cls, rows: Iterable[str], source: str = "key") -> KeyRing:
        """Keys from rows (see the module doc); ``source`` names them in errors.

        Raises:
            ValueError: a row is malformed, or one key is listed with two different tenants.
        """
        tenants: dict[bytes, str | None] = {}
        for number, row in enumerate(rows, 1):
            entry = parse_key_row(row, f"{source} {number}")
            if entry is None:
                continue
            if tenants.get(entry.digest, entry.tenant) != entry.tenant:
                raise ValueError(f"{source} {number}: this key is listed before with another tenant")
            tenants[entry.digest] = entry.tenant
        return cls(tuple(KeyEntry(d, t) for d, t in tenants.items()))

    @classmethod
    def from_file(cls, path: str | Path) -> KeyRing:
        """Read one key per line.

        Raises:
            ValueError: the file cannot be read, holds no key or a malformed row.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read API key file {path}: {exc}") from exc
        ring = cls.of(text.splitlines(), source=f"API key file {path}, line")
        if not ring.entries:
            raise ValueError(f"API key file {path} holds no key")
        return ring

    def lookup(self, presented: str | None) -> KeyMatch | None:
        """``presented``'s id and tenant if it is accepted, else None (every stored key is compared)."""
        if not presented:
            return None
        digest = _digest(presented)
        found: KeyEntry | None = None
        for entry in self.entries:
            if hmac.compare_digest(entry.digest, digest):
                found = entry
        return KeyMatch(digest.hex()[:12], found.tenant) if found is not None else None

    def match(self, presented: str | None) -> str | None:
        """The key id of ``presented`` if it is accepted, else None."""
        found = self.lookup(presented)
        return found.key_id if found is not None else None


def presented_key(scope: Scope) -> str | None:
    """The key from ``Authorization: Bearer …`` or ``x-api-key``."""
    auth = header(scope, b"authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return header(scope, b"x-api-key")


def is_admin_path(scope: Scope) -> bool:
    """Whether the request is for the control plane: its path, or the path Starlette routes on (past
    ``root_path``), is under ``/admin``."""
    path: str = scope["path"]
    root: str = scope.get("root_path") or ""
    routed = path[len(root) :] if root and path.startswith(root) else path
    return path.startswith(_ADMIN_PREFIX) or routed.startswith(_ADMIN_PREFIX)


class AuthMiddleware:
    """Guards the routes as the module doc says: 401 ``invalid_api_key`` (OpenAI's code) for a missing or
    wrong key, 403 where the control plane's mode refuses, 400 for a malformed tenant header.

    ``access``: the control plane's mode (default: decided from the keys, the listen address unknown).
    """

    def __init__(
        self,
        app: ASGIApp,
        api_keys: KeyRing | None,
        admin_keys: KeyRing | None,
        access: AdminAccess | None = None,
    ) -> None:
        self.app = app
        self.api_keys = api_keys
        self.admin_keys = admin_keys
        if access is None:
            access = admin_access(api_keys=api_keys is not None, admin_keys=admin_keys is not None, host=None)
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in _OPEN_PATHS:
            if is_admin_path(scope):
                self._admit_admin(scope)
            elif self.api_keys is not None:
                self._admit_client(scope, self.api_keys)
        await self.app(scope, receive, send)

    def _admit_admin(self, scope: Scope) -> None:
        if self.admin_keys is not None:
            key_id = self.admin_keys.match(presented_key(scope))
            if key_id is None:
                raise Unauthorized(_MISSING_KEY)
            scope.setdefault("state", {})["api_key_id"] = key_id
            return
        refusal = self.access.refusal(scope.get("method", "GET"))
        if refusal is not None:
            raise refusal

    def _admit_client(self, scope: Scope, ring: KeyRing) -> None:
        found = ring.lookup(presented_key(scope))
        if found is None:
            raise Unauthorized(_MISSING_KEY)
        scope.setdefault("state", {})["api_key_id"] = found.key_id
        bind_tenant(scope, key_tenant=found.tenant, key_id=found.key_id)
