"""Which worker URLs may be registered at run time (``POST /admin/workers``): ``--worker-allow``.

A registration makes the gateway connect to the URL it is given (health and engine probes, then users'
prompts), so an address outside the operator's fleet must be refused before any connection is made: else
whoever reaches the admin API can point the gateway at internal services (SSRF) or route users' prompts to
a worker of their own. Workers the operator lists (``--worker``, the ``--config`` file, a reload) are not
checked: the allow-list guards the run-time path only.

Entries (``--worker-allow``, comma-separated and repeatable; case-insensitive):

* ``10.0.0.0/8``, ``fd00::/8``: a network (host bits must be zero);
* ``10.0.0.5``, ``::1``: one address;
* ``worker-0.workers.svc``: one host name, matched by name exactly (never resolved: DNS could answer
  anything, so a name is allowed only when it is listed as it is written in the URL);
* any of them with ``:PORT`` (an IPv6 address or network in brackets: ``[::1]:8001``): that port only;
* ``none``: no run-time registration at all.

Default (no ``--worker-allow``): the hosts of the ``--worker`` URLs (any port) plus loopback
(``127.0.0.0/8``, ``::1``, ``localhost``). A given list replaces the default.

A URL is allowed when its scheme is http or https, its authority is a plain ``HOST[:PORT]`` (no user
info, no percent escapes, no zone id) and an entry matches its host and its port (the scheme's default
when it names none). Host names that other parsers would read as an IPv4 address (``127.1``,
``0x7f.0.0.1``, ``2130706433``) are never allowed. ``allows`` is pure: it resolves nothing, connects to
nothing.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from gateway.errors import Forbidden

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
#: a URL authority kvgate accepts: a host name or IPv4 literal, or a bracketed IPv6 literal, then a port
_AUTHORITY: Final = re.compile(r"(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
_HOST_NAME: Final = re.compile(r"[a-z0-9_](?:[a-z0-9_.-]{0,252}[a-z0-9_])?")
#: a last label that makes a host an IPv4 address for WHATWG URL parsers and inet_aton
_NUMERIC_LABEL: Final = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
_LOOPBACK: Final = ("127.0.0.0/8", "::1", "localhost")
_NONE: Final = "none"


class WorkerNotAllowed(Forbidden):
    """A run-time registration names a worker outside ``--worker-allow`` (nothing was contacted)."""

    default_code = "worker_not_allowed"


@dataclass(frozen=True, slots=True)
class Address:
    """The host and port a worker URL makes the gateway connect to."""

    host: str  # lower-case; an IPv6 literal without brackets
    ip: IPAddress | None  # the host when it is an IP literal
    port: int


@dataclass(frozen=True, slots=True)
class AllowEntry:
    """One ``--worker-allow`` entry: a network or a host name, and optionally a port."""

    network: IPNetwork | None = None
    name: str | None = None
    port: int | None = None

    def matches(self, target: Address) -> bool:
        if self.port is not None and self.port != target.port:
            return False
        if self.network is not None:
            return target.ip is not None and target.ip in self.network  # False across IP versions
        return target.ip is None and target.host == self.name

    def __str__(self) -> str:
        host = str(self.network) if self.network is not None else str(self.name)
        if self.port is None:
            return host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class WorkerAllowList:
    """The worker addresses a run-time registration may name; see the module doc."""

    entries: tuple[AllowEntry, ...]

    @classmethod
    def parse(cls, values: Iterable[str]) -> WorkerAllowList:
        """Entries from ``--worker-allow`` values (each comma-separated); ``none`` alone allows nothing.

        Raises:
            ValueError: an entry is malformed, or ``none`` is mixed with entries, or nothing is given.
        """
        items = [item.strip().lower() for value in values for item in value.split(",") if item.strip()]
        if items == [_NONE]:
            return cls(())
        if not items:
            raise ValueError("--worker-allow holds no entry (give 'none' to refuse every registration)")
        if _NONE in items:
            raise ValueError("--worker-allow: 'none' cannot be combined with other entries")
        return cls(tuple(parse_entry(item) for item in items))

    @classmethod
    def default(cls, worker_urls: Iterable[str]) -> WorkerAllowList:
        """Loopback plus the host of each configured worker URL (any port)."""
        hosts = [t.host for t in (target_of(url) for url in worker_urls) if t is not None]
        unique = dict.fromkeys([*_LOOPBACK, *hosts])
        return cls(tuple(parse_entry(host) for host in unique))

    def allows(self, url: str) -> bool:
        """Whether the gateway may connect to ``url`` for a run-time registration (pure: no DNS)."""
        target = target_of(url)
        return target is not None and any(entry.matches(target) for entry in self.entries)

    def __str__(self) -> str:
        return ", ".join(str(e) for e in self.entries) or _NONE


def target_of(url: str) -> Address | None:
    """The host and port ``url`` connects to, or None when it is not a plain http(s) URL (see the module
    doc: user info, escapes, zone ids, ambiguous numeric hosts and bad ports are all None)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:  # a port out of range, a malformed bracket
        return None
    default_port = _DEFAULT_PORTS.get(parts.scheme.lower())
    if default_port is None or not _AUTHORITY.fullmatch(parts.netloc) or parts.hostname is None:
        return None
    if port == 0:
        return None
    host = parts.hostname.lower()
    ip = _ip_literal(host)
    if ip is None and not _plain_host_name(host):
        return None
    return Address(host=host, ip=ip, port=port if port is not None else default_port)


def parse_entry(text: str) -> AllowEntry:
    """One entry (see the module doc).

    Raises:
        ValueError: the entry is malformed.
    """
    host, port = _split_port(text.strip().lower())
    if "/" in host:
        try:
            return AllowEntry(network=_network(ipaddress.ip_network(host, strict=True)), port=port)
        except ValueError as exc:
            raise ValueError(f"--worker-allow {text!r}: not a network ({exc})") from None
    ip = _ip_literal(host)
    if ip is not None:
        return AllowEntry(network=ipaddress.ip_network(ip), port=port)
    if not _plain_host_name(host):
        raise ValueError(
            f"--worker-allow {text!r}: give a CIDR network, an IP address or a host name, optionally :PORT"
        )
    return AllowEntry(name=host, port=port)


def _split_port(text: str) -> tuple[str, int | None]:
    """``HOST[:PORT]`` or ``[IPv6[/LEN]][:PORT]``; a bare IPv6 address or network has no port."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"--worker-allow {text!r}: a bracketed address must end with ] or ]:PORT")
        return host, _port(text, rest[1:]) if rest else None
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, _port(text, port)
    return text, None


def _port(text: str, value: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ValueError(f"--worker-allow {text!r}: the port must be 1-65535")
    return int(value)


def _ip_literal(host: str) -> IPAddress | None:
    """``host`` as an IP address (an IPv4-mapped IPv6 address as its IPv4 one), else None."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and (ip.ipv4_mapped is not None or ip.scope_id):
        return ip.ipv4_mapped  # a zone id (``fe80::1%eth0``) is refused: None
    return ip


def _network(net: IPNetwork) -> IPNetwork:
    """An IPv4-mapped IPv6 network (``::ffff:10.0.0.0/104``) as the IPv4 network it maps."""
    if isinstance(net, ipaddress.IPv6Network) and net.prefixlen >= 96:
        mapped = net.network_address.ipv4_mapped
        if mapped is not None:
            return ipaddress.ip_network(f"{mapped}/{net.prefixlen - 96}")
    return net


def _plain_host_name(host: str) -> bool:
    """A DNS-style name whose last label is not numeric (``127.1`` or ``0x7f.1`` would be an address)."""
    if not _HOST_NAME.fullmatch(host) or ".." in host:
        return False
    return not _NUMERIC_LABEL.fullmatch(host.rstrip(".").rsplit(".", 1)[-1])
