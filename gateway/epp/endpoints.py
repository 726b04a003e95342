"""Endpoint addresses as the data plane spells them (``ip:port``, ``[v6]:port``) and the fleet's workers.

The picker names a worker to Envoy by the ``host:port`` of its URL; the served endpoint comes back in the
same spelling. Discovery sources (flags, the endpoints file, an ``InferencePool``) produce worker URLs.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from gateway.fleet.registry import Fleet, WorkerRecord


def endpoint_of(url: str) -> str:
    """The ``host:port`` Envoy connects to for a worker URL (``http://10.0.0.7:8000`` → ``10.0.0.7:8000``)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def url_of(endpoint: str) -> str:
    """A worker URL for a bare ``host:port`` (kept as it is when it already is a URL)."""
    return endpoint if "://" in endpoint else f"http://{endpoint}"


def record_at(fleet: Fleet, endpoint: str) -> WorkerRecord | None:
    """The worker whose URL points at ``endpoint``, if any."""
    return next((r for r in fleet if endpoint_of(r.url) == endpoint), None)


def parse_subset(value: object) -> frozenset[str] | None:
    """The data plane's subset hint (a list or a comma-separated string) as a set; None when absent."""
    if value is None:
        return None
    items: Iterable[object] = value.split(",") if isinstance(value, str) else value  # type: ignore[assignment]
    if not isinstance(value, str | list | tuple):
        return frozenset()
    return frozenset(str(item).strip() for item in items if str(item).strip())
