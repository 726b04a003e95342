"""The KV-cache partition (tenant) of a request, bound to its API key.

The ``x-kvgate-tenant`` header is folded into every prompt's hash root, by the gateway and by the worker
(``kvgate_core.kvcontract.extra_keys``): requests of different tenants never share cached KV. Where the
tenant came from the client alone, any key could name another customer's tenant and reuse (and probe the
timing of) its cache. With client keys configured (``--api-keys``), the auth layer therefore replaces
whatever the client sent by the *effective* tenant before the router and the proxy see the request:

* a key whose row names a tenant (``KEY tenant=acme``): ``acme``; a client header ``H`` narrows within
  it, ``acme/H`` (a sub-partition of acme's, never another tenant's: tenant names hold no ``/``);
* a key that names none: no tenant without the header (the shared partition, as with no keys), and
  ``key:ID/H`` with it, where ``ID`` is the key's id (a digest prefix, safe to log): two keys that claim
  the same header never share a partition (tenant names hold no ``:``).

Every client copy of the header is dropped and the effective one set once; a request carrying the header
more than once is refused (400), so a second copy can never reach a layer that reads another one. A header
value is 1-128 printable ASCII characters, no spaces (else 400). Without client keys the header is used as
the client sent it. ``/admin`` requests keep theirs (``/admin/route`` explains a tenant's routing).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from gateway.errors import InvalidRequest
from kvgate_core.asgi import Scope
from kvgate_core.kvcontract.extra_keys import TENANT_HEADER

#: a tenant name in a key file row (``KEY tenant=NAME``): no ``/`` nor ``:``, which the effective tenant
#: uses to keep partitions apart
TENANT_NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
#: a client's header value: printable ASCII, no spaces, bounded
_CLAIM: Final = re.compile(rb"[!-~]{1,128}")
_HEADER: Final = TENANT_HEADER.encode()

Headers = Iterable[tuple[bytes, bytes]]


def claimed_tenant(headers: Headers) -> str | None:
    """The client's ``x-kvgate-tenant`` value, or None when it sent none.

    Raises:
        InvalidRequest: the header comes more than once, or its value is not 1-128 printable ASCII
            characters without spaces.
    """
    values = [bytes(v) for k, v in headers if bytes(k).lower() == _HEADER]
    if not values:
        return None
    if len(values) > 1:
        raise InvalidRequest(f"send the {TENANT_HEADER} header at most once", param=TENANT_HEADER)
    if not _CLAIM.fullmatch(values[0]):
        raise InvalidRequest(
            f"the {TENANT_HEADER} header must be 1-128 printable ASCII characters without spaces",
            param=TENANT_HEADER,
        )
    return values[0].decode("ascii")


def effective_tenant(*, key_tenant: str | None, key_id: str, claimed: str | None) -> str | None:
    """The tenant of a request made with a key (its ``key_tenant`` and id) that claimed ``claimed``."""
    if claimed is None:
        return key_tenant
    namespace = key_tenant if key_tenant is not None else f"key:{key_id}"
    return f"{namespace}/{claimed}"


def with_tenant(headers: Headers, tenant: str | None) -> list[tuple[bytes, bytes]]:
    """``headers`` without any ``x-kvgate-tenant``, plus ``tenant``'s when it is not None."""
    kept = [(k, v) for k, v in headers if bytes(k).lower() != _HEADER]
    if tenant is not None:
        kept.append((_HEADER, tenant.encode("ascii")))
    return kept


def bind_tenant(scope: Scope, *, key_tenant: str | None, key_id: str) -> None:
    """Rewrite ``scope``'s headers so they carry the request's effective tenant only (see the module doc).

    Raises:
        InvalidRequest: the client's header is repeated or malformed (``claimed_tenant``).
    """
    headers = list(scope.get("headers", ()))  # an iterable, read twice below
    claimed = claimed_tenant(headers)
    if claimed is None and key_tenant is None:
        return  # nothing to drop, nothing to set: the request's headers stay as they came
    tenant = effective_tenant(key_tenant=key_tenant, key_id=key_id, claimed=claimed)
    scope["headers"] = with_tenant(headers, tenant)
