"""Request headers the gateway passes on to the worker, as complete header lines.
Compiled with mypyc (``docs/development.md``: what that rules out).

Only what the worker needs to do the same as the gateway: the tenant (folded into the KV hash root on both
sides) and the W3C trace context of the gateway's current span, when tracing is on
(``kvgate_core.spans.active_tracer``). Client headers are
otherwise not forwarded (no auth keys reach workers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kvgate_core.kvcontract.extra_keys import TENANT_HEADER
from kvgate_core.spans import active_tracer

_PROPAGATOR: Final = TraceContextTextMapPropagator()


def _safe(value: str) -> bool:
    return "\r" not in value and "\n" not in value and len(value) <= 256


def upstream_headers(headers: Mapping[str, str]) -> bytes:
    """Header lines (each ending in CRLF) to add to the upstream request; empty in the common case."""
    out = b""
    tenant = headers.get(TENANT_HEADER)
    if tenant and _safe(tenant):
        out += f"{TENANT_HEADER}: {tenant}\r\n".encode("latin-1", "replace")
    # no tracer on the request (tracing off, the default): no span to pass on, and no OpenTelemetry calls
    if active_tracer.get() is not None and trace.get_current_span().get_span_context().is_valid:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        out += "".join(f"{k}: {v}\r\n" for k, v in carrier.items() if _safe(v)).encode("latin-1", "replace")
    return out
