"""Who may use the control plane (every route under ``/admin``): one mode, decided once at start-up.

==============  =====================================================  =====================================
mode            when                                                   ``/admin/*`` (the admin UI included)
==============  =====================================================  =====================================
``admin-keys``  ``--admin-keys`` is set                                an admin key, else 401
                                                                       ``invalid_api_key`` (a client key too)
``closed``      ``--api-keys`` is set, ``--admin-keys`` is not         403 ``admin_keys_required``, always
``loopback``    no keys, and ``--host`` is a loopback address          open (only local callers reach it)
                (``127.0.0.0/8``, ``::1``, ``localhost``: the default)
``read-only``   no keys, and ``--host`` is any other address           GET and HEAD open; every other method
                                                                       403 ``admin_read_only``
==============  =====================================================  =====================================

The control plane adds workers (the gateway then connects to them and routes users' prompts there) and
drains them, so it is never open to a network by accident: client keys alone close it (they say the
gateway faces callers who must not manage it), and a gateway without any key is writable only while it
listens on loopback. ``/health``, ``/ready`` and ``/metrics`` are not under ``/admin``: probes and scrapers
reach them in every mode. ``log_admin_access`` says at start-up which mode is in force and why (WARNING
for ``closed`` and ``read-only``). Note that a reverse proxy on the gateway's own host makes a loopback
gateway reachable from wherever the proxy is: give it ``--admin-keys``.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from gateway.errors import Forbidden

logger = logging.getLogger(__name__)

#: methods that only read: allowed in ``read-only`` mode
_READ_METHODS: Final = frozenset({"GET", "HEAD"})
_CLOSED_MESSAGE: Final = (
    "The admin API is closed: this gateway has client API keys but no admin keys. "
    "Start it with --admin-keys (or KVGATE_ADMIN_KEYS) and call /admin with an admin key."
)
_READ_ONLY_MESSAGE: Final = (
    "The admin API is read-only: this gateway has no admin keys and does not listen on loopback. "
    "Start it with --admin-keys (or KVGATE_ADMIN_KEYS) to change the fleet at run time."
)


class AdminMode(StrEnum):
    ADMIN_KEYS = "admin-keys"
    CLOSED = "closed"
    LOOPBACK = "loopback"
    READ_ONLY = "read-only"


@dataclass(frozen=True, slots=True)
class AdminAccess:
    """The mode in force and why (said once in the start-up log)."""

    mode: AdminMode
    reason: str

    def refusal(self, method: str) -> Forbidden | None:
        """The 403 for an ``/admin`` request with ``method`` in this mode, or None when it may pass
        (in ``admin-keys`` mode the auth layer checks the key instead)."""
        if self.mode is AdminMode.CLOSED:
            return Forbidden(_CLOSED_MESSAGE, code="admin_keys_required")
        if self.mode is AdminMode.READ_ONLY and method.upper() not in _READ_METHODS:
            return Forbidden(_READ_ONLY_MESSAGE, code="admin_read_only")
        return None

    @property
    def needs_guard(self) -> bool:
        """Whether ``/admin`` needs a layer in front of it (all but ``loopback``)."""
        return self.mode is not AdminMode.LOOPBACK


def admin_access(*, api_keys: bool, admin_keys: bool, host: str | None) -> AdminAccess:
    """The mode for a gateway with (or without) client and admin keys listening on ``host`` (None: not
    known, taken as not loopback)."""
    if admin_keys:
        return AdminAccess(AdminMode.ADMIN_KEYS, "--admin-keys is set: every /admin route needs an admin key")
    if api_keys:
        return AdminAccess(
            AdminMode.CLOSED,
            "--api-keys is set but --admin-keys is not: every /admin route answers 403 (the gateway still "
            "serves /v1); set --admin-keys to manage workers at run time",
        )
    if is_loopback_host(host):
        return AdminAccess(
            AdminMode.LOOPBACK,
            f"no API or admin keys and --host {host} is loopback: /admin is open to local callers; "
            "set --admin-keys before exposing the gateway",
        )
    return AdminAccess(
        AdminMode.READ_ONLY,
        f"no admin keys and --host {host or '(unknown)'} is not loopback: /admin answers reads only, its "
        "writes (register, drain, route, parity) answer 403; set --admin-keys to manage workers at run time",
    )


def is_loopback_host(host: str | None) -> bool:
    """``localhost`` or a loopback IP literal (``127.0.0.0/8``, ``::1``, bracketed or not); never resolved."""
    if not host:
        return False
    name = host.strip().lower().removeprefix("[").removesuffix("]")
    if name == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def log_admin_access(access: AdminAccess) -> None:
    """One start-up line: the mode and why (WARNING where ``/admin`` is closed or read-only)."""
    level = logging.INFO if access.mode in (AdminMode.ADMIN_KEYS, AdminMode.LOOPBACK) else logging.WARNING
    logger.log(level, "admin API: %s mode: %s", access.mode, access.reason)
