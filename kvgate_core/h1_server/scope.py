"""The ASGI ``http`` scope of one request, built from what the parser saw.
Compiled with mypyc (``docs/development.md``: what that rules out).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import httptools

_ASGI = {"version": "3.0", "spec_version": "2.3"}
_METHODS = {m.encode("ascii"): m for m in ("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH")}

Address = tuple[str, int]


class BadTargetError(ValueError):
    """A request target that is neither origin form (``/path?query``) nor absolute form (``http://h/p``)."""


def split_target(url: bytes) -> tuple[bytes, bytes]:
    """``(raw_path, query_string)`` of a request target (origin form, or absolute form via the parser).

    Raises:
        BadTargetError: another form (``*``, ``host:port``) or a target the parser refuses.
    """
    if url[:1] == b"/":
        raw_path, _, raw_query = url.partition(b"?")
        return raw_path, raw_query
    try:
        # typed Any: httptools' stub declares ``path``/``query`` as bytes, they are None when absent, and the
        # compiled build checks a declared type on every read
        parsed: Any = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        raise BadTargetError(url[:64]) from None
    schema: bytes | None = parsed.schema
    path: bytes | None = parsed.path
    query: bytes | None = parsed.query
    if schema is None or schema.lower() not in (b"http", b"https") or (path and path[:1] != b"/"):
        raise BadTargetError(url[:64])
    return path or b"/", query or b""


def build_scope(
    method: bytes,
    url: bytes,
    http_version: str,
    headers: list[tuple[bytes, bytes]],
    client: Address | None,
    server: Address | None,
    state: dict[str, Any],
) -> dict[str, Any]:
    """The ASGI 3 ``http`` scope (``state``: a shallow copy of the lifespan state, as uvicorn gives)."""
    raw_path, query = split_target(url)
    scheme = "http"
    if client is not None and client[0] in TRUSTED_PROXIES:
        client, scheme = forwarded(headers, client)
    path = raw_path.decode("latin-1")
    if "%" in path:
        path = unquote(path)
    name = _METHODS.get(method)
    return {
        "type": "http",
        "asgi": _ASGI,
        "http_version": http_version,
        "server": server,
        "client": client,
        "scheme": scheme,
        "method": name if name is not None else method.decode("ascii"),
        "root_path": "",
        "path": path,
        "raw_path": raw_path,
        "query_string": query,
        "headers": headers,
        "state": state.copy(),
    }


#: peers whose ``X-Forwarded-For`` / ``X-Forwarded-Proto`` are believed (uvicorn's default: a local proxy)
TRUSTED_PROXIES = frozenset({"127.0.0.1", "::1"})


def forwarded(headers: list[tuple[bytes, bytes]], client: Address) -> tuple[Address, str]:
    """The client and scheme a trusted local proxy reports: the rightmost ``X-Forwarded-For`` entry that is
    not itself a trusted proxy (port 0), and ``X-Forwarded-Proto`` (``http`` when absent or unknown);
    ``client`` unchanged without the header. The per-IP rate-limit key reads the result."""
    chain: bytes | None = None
    proto = "http"
    for name, value in headers:
        if name == b"x-forwarded-for":
            chain = value if chain is None else chain + b"," + value
        elif name == b"x-forwarded-proto" and value.strip().lower() in (b"http", b"https", b"ws", b"wss"):
            proto = value.strip().lower().decode("ascii")
    if chain is not None:
        hosts = [h.strip().decode("latin-1") for h in chain.split(b",") if h.strip()]
        for host in reversed(hosts):
            if host not in TRUSTED_PROXIES:
                return (host, 0), proto
        if hosts:
            return (hosts[0], 0), proto
    return client, proto


def address(value: object) -> Address | None:
    """``(host, port)`` of a socket address (IPv6 four-tuples trimmed); None for anything else."""
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None
